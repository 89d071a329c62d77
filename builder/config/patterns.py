"""The strict value types of matrix.yaml: every string that can reach a Dockerfile, a label, a build
argument or a lock line must fully match one of the patterns here. A newline, quote, ``$(...)`` or
backtick fails the pattern, so it is reported (exit 2) and never rendered.

Each type is ``Annotated[StrictStr, Pattern(regex, what)]``: the message says what was expected,
and the published JSON schema (``build schema``) carries the same pattern for editors. Also here:
how a bad value is shown in a message, and the "did you mean" of a misspelt key or name.
"""

from __future__ import annotations

import datetime as dt
import difflib
import re
from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    StrictStr,
)
from pydantic.json_schema import JsonSchemaValue, WithJsonSchema
from pydantic_core import core_schema


class Frozen(BaseModel):
    """The base of every matrix model: frozen once read, and an unknown key is an error."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Pattern:
    """Annotated metadata: the string must fully match ``regex``, else "must be <what> (got ...)"."""

    def __init__(self, regex: str, what: str) -> None:
        self.regex = regex
        self.what = what
        compiled = re.compile(regex)

        def check(value: str) -> str:
            # fullmatch, not match: Python's `$` would accept a trailing newline.
            if not compiled.fullmatch(value):
                raise ValueError(f"must be {what} (got {show(value)})")
            return value

        self.check = check

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = handler(schema)
        # Anchored: JSON Schema's "pattern" matches anywhere in the string.
        out.update(pattern=f"^(?:{self.regex})$", description=self.what)
        return out


def show(value: Any, limit: int = 60) -> str:
    """A value as a message quotes it: redacted, then cut to ``limit`` characters."""
    from builder.log import shown  # redacted before it is cut (issue 21)

    return shown(value, limit)


def did_you_mean(word: str, options: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


# --- strict value patterns ------------------------------------------------------------------

_SEG = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?(?::[0-9]{1,5})?"

TargetName = Annotated[
    StrictStr, Pattern(r"[a-z0-9][a-z0-9._-]{0,62}", "a target name: lowercase letters, digits, '.', '_', '-'")
]
Registry = Annotated[StrictStr, Pattern(_HOST, "a registry host[:port], e.g. ghcr.io or 127.0.0.1:5000")]
Repository = Annotated[StrictStr, Pattern(rf"{_SEG}(?:/{_SEG})*", "an image repository path, e.g. k3/vllm")]
Tag = Annotated[StrictStr, Pattern(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", "an image tag")]
Commit = Annotated[StrictStr, Pattern(r"[0-9a-f]{40}", "a full 40-character lowercase hex commit")]
Branch = Annotated[
    StrictStr,
    Pattern(
        r"(?!.*\.\.)(?!.*//)(?!/)(?!.*/$)(?!.*\.lock$)[A-Za-z0-9][A-Za-z0-9._/-]{0,199}",
        "a branch name (letters, digits, '.', '_', '-', '/'; no '..')",
    ),
]
Version = Annotated[
    StrictStr,
    Pattern(
        r"[0-9]+(?:\.[0-9]+)*(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?(?:\.dev[0-9]+)?(?:\+[a-z0-9]+(?:\.[a-z0-9]+)*)?",
        "a PEP 440 version such as 2.13.0 or 2.13.0+cu129",
    ),
]
PythonVersion = Annotated[StrictStr, Pattern(r"3\.[0-9]{1,2}", 'a quoted Python major.minor such as "3.12"')]
CudaVersion = Annotated[StrictStr, Pattern(r"[0-9]{1,2}\.[0-9]{1,2}(?:\.[0-9]{1,3})?", "a CUDA version such as 12.9.1")]
CudaArch = Annotated[
    StrictStr, Pattern(r"[0-9]{1,2}\.[0-9][af]?(?:\+PTX)?", "a CUDA arch such as 9.0 or 10.0a or 12.0+PTX")
]
HttpsUrl = Annotated[
    StrictStr,
    Pattern(
        r"https://" + _HOST + r"(?:/[A-Za-z0-9._~%+/-]*)?",
        "an https:// URL without credentials, quotes, spaces or shell characters",
    ),
]
LabelPrefix = Annotated[
    StrictStr,
    Pattern(
        r"(?!org\.opencontainers\.)(?!org\.label-schema\.)[a-z0-9]+(?:-[a-z0-9]+)*(?:\.[a-z0-9]+(?:-[a-z0-9]+)*)+",
        "a reverse-DNS label prefix you control, e.g. com.example.gpu (lowercase; not org.opencontainers)",
    ),
]
# A remote sccache backend named in the (committed) matrix: no credentials, those travel as
# secrets (`build --compile-cache` or the backend's own AWS_*/GOOGLE_*/ACTIONS_* variables).
CacheUrl = Annotated[
    StrictStr,
    Pattern(
        r"(?:rediss?|s3|gcs|webdavs?)://" + _HOST + r"(?:/[A-Za-z0-9._~%+/-]*)?(?:\?[A-Za-z0-9._=&-]*)?"
        r"|gha://[A-Za-z0-9._-]*",
        "an sccache backend URL without credentials: redis://, rediss://, s3://, gcs://, webdav(s):// or gha://",
    ),
]
# The source is fetched by git on the host. file:// is for local mirrors and the smoke repo;
# ext:: and other transports are not accepted.
GitUrl = Annotated[
    StrictStr,
    Pattern(
        r"(?:https://" + _HOST + r"|file://)(?:/[A-Za-z0-9._~%+/-]*)",
        "an https:// or file:// git URL without credentials, quotes, spaces or shell characters",
    ),
]
Requirement = Annotated[
    StrictStr,
    Pattern(
        r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?:\[[A-Za-z0-9._,-]+\])?"
        r"(?:(?:===|==|>=|<=|~=|!=|<|>)[A-Za-z0-9.*+!]+)(?:,(?:===|==|>=|<=|~=|!=|<|>)[A-Za-z0-9.*+!]+)*",
        "a requirement such as 'packaging==24.1' (name, extras, version specifiers only)",
    ),
]
ReqName = Annotated[
    StrictStr,
    Pattern(
        r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?:\[[A-Za-z0-9._,-]+\])?",
        "a distribution name with optional [extras]",
    ),
]
DistName = Annotated[StrictStr, Pattern(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?", "a distribution name")]
RelPath = Annotated[
    StrictStr,
    Pattern(
        r"(?!.*(?:^|/)\.\.(?:/|$))[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*",
        "a relative path inside the source (no '..', no leading '/')",
    ),
]
ModuleName = Annotated[
    StrictStr, Pattern(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*", "a dotted Python module name")
]
# What a build declares: a module, or (Rust binaries such as vllm.vllm-rs) a dotted name with '-'.
ExtensionName = Annotated[
    StrictStr,
    Pattern(
        r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_-]*)*",
        "a dotted extension name such as vllm._C or vllm.vllm-rs",
    ),
]
EnvName = Annotated[StrictStr, Pattern(r"[A-Z][A-Z0-9_]{0,62}", "an environment variable name (A-Z, 0-9, '_')")]
EnvValue = Annotated[
    StrictStr, Pattern(r"[A-Za-z0-9_./:=@+,-]{1,200}", "a plain value (no spaces, quotes or shell characters)")
]
AbsPath = Annotated[StrictStr, Pattern(r"(?:/[A-Za-z0-9_.+-]+)+", "an absolute path such as /usr/local/cuda")]
LocalVersion = Annotated[
    StrictStr, Pattern(r"[a-z0-9]+(?:\.[a-z0-9]+)*", "a PEP 440 local version label such as cu129")
]
ThirdPartyName = Annotated[
    StrictStr, Pattern(r"[a-z0-9][a-z0-9_-]{0,40}", "a third-party name: lowercase letters, digits, '_', '-'")
]
UpstreamRef = Annotated[
    StrictStr, Pattern(r"[A-Za-z0-9][A-Za-z0-9._/+-]{0,99}", "a tag, branch or commit as the source names it")
]
Owner = Annotated[
    StrictStr,
    Pattern(
        r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}", "an e-mail address (the owner who answers for this image)"
    ),
]
Text = Annotated[
    StrictStr,
    Pattern(r"[A-Za-z0-9][A-Za-z0-9 ,.:;()/_+=@#-]{0,199}", "plain text (letters, digits, spaces, ,.:;()/_+=@#-)"),
]
# Reasons are shown by the checks and the docs, never rendered into a Dockerfile.
Reason = Annotated[
    StrictStr,
    Pattern(
        r"[A-Za-z0-9][A-Za-z0-9 ,.:;()\[\]/_+=@#<>'-]{0,299}",
        "a reason in plain text (letters, digits, spaces, ,.:;()[]/_+=@#<>'-)",
    ),
]
_WORD = r"[A-Za-z0-9_./:=@+-][A-Za-z0-9_./:=@+,-]{0,127}"  # a command word: entrypoint, recipe
Arg = Annotated[StrictStr, Pattern(_WORD, "a plain command word (no spaces, quotes or shell characters)")]
SecretId = Annotated[StrictStr, Pattern(r"[a-z][a-z0-9_]{0,62}", "a secret id: lowercase letters, digits, '_'")]
AptPackage = Annotated[
    StrictStr, Pattern(r"[a-z0-9][a-z0-9.+-]+(?:=[A-Za-z0-9.+:~-]+)?", "a Debian package name, optionally =version")
]
# CMake FetchContent's name for a dependency (FetchContent_Declare(<name> ...)), e.g. vllm-flash-attn.
FetchContentName = Annotated[
    StrictStr, Pattern(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}", "a FetchContent name such as vllm-flash-attn")
]
# A program the source's build runs, looked up on PATH (cmake, g++, patch, ...).
ToolName = Annotated[StrictStr, Pattern(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}", "a program name such as patch or g++")]
# Something in the image's Python to call or read: module:attribute[.attribute...].
PyRef = Annotated[
    StrictStr,
    Pattern(
        r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*",
        "a Python reference module.path:attribute, e.g. vllm.tool_parsers:ToolParserManager.get_tool_parser",
    ),
]
# A module to import, or module:callable to call (no arguments).
PySetup = Annotated[
    StrictStr,
    Pattern(
        r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*(?::[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)?",
        "a module (imported) or module:callable (called), e.g. vllm.utils.import_utils:has_triton_kernels",
    ),
]
# fnmatch patterns over dotted module names, e.g. vllm.third_party.fmha_sm100.cute.test_*.
ModulePattern = Annotated[
    StrictStr, Pattern(r"[A-Za-z_*?][A-Za-z0-9_.*?]{0,199}", "a dotted module name or fnmatch pattern")
]
# An SPDX license expression: identifiers (LicenseRef- included) joined by AND/OR/WITH, parentheses.
SpdxExpression = Annotated[
    StrictStr,
    Pattern(
        r"\(?[A-Za-z0-9][A-Za-z0-9.+-]*\)?(?: (?:AND|OR|WITH) \(?[A-Za-z0-9][A-Za-z0-9.+-]*\)?)*",
        "an SPDX license expression such as MIT or MIT AND BSD-3-Clause AND Apache-2.0",
    ),
]

# The runtime: libraries and files of the final image, the recipe's argparse destinations.
Soname = Annotated[
    StrictStr,
    Pattern(r"lib[A-Za-z0-9_.+-]{1,100}\.so(?:\.[0-9]+)*", "a library file name such as libcudart.so or libnuma.so.1"),
]
PathPattern = Annotated[
    StrictStr,
    Pattern(r"/[A-Za-z0-9_./*?+-]{1,200}", "an absolute path or fnmatch pattern such as /opt/k3/*/libfoo*.so"),
]
EnvLikeDest = Annotated[
    StrictStr, Pattern(r"[a-z_][a-z0-9_]{0,63}", "an argparse destination such as tool_call_parser")
]

# Signing keys (signing.key, signing.public_key).
KeyPath = Annotated[
    StrictStr, Pattern(r"[A-Za-z0-9_./+-]{1,300}", "a key file path (relative to the matrix, or absolute)")
]
KeyRef = Annotated[
    StrictStr,
    Pattern(
        r"(?:(?:gcpkms|awskms|azurekms|hv|hsm):[A-Za-z0-9_./:=?&%+@-]{0,400})|[A-Za-z0-9_./+-]{1,300}",
        "a private key file path or a KMS URI (gcpkms:, awskms:, azurekms:, hv:, hsm:)",
    ),
]

LayerName = Annotated[StrictStr, Pattern(r"[a-z][a-z0-9-]{0,30}", "a layer name: lowercase letters, digits, '-'")]
NamePattern = Annotated[
    StrictStr, Pattern(r"[a-z0-9*?][a-z0-9*?._-]{0,99}", "a distribution name pattern such as nvidia-* (PEP 503 names)")
]

# OS packages (Debian/Ubuntu .debs locked by sha256 like wheels; builder/deps/oslock.py).
# apt reads a name no package has exactly as a regex (then as a glob), and installs every package
# that matches: `numa.+` locked 138 packages (issue 32). '.' and '+' are legal in a name (g++,
# libglib2.0-0), so what is refused is what only a pattern writes: '.' followed by '+', or a final
# '.'. builder/deps/oslock.py also holds each name to a package apt installs or the base has.
DebName = Annotated[
    StrictStr,
    Pattern(
        r"(?!.*\.\+)(?!.*\.$)[a-z0-9][a-z0-9.+-]{1,62}",
        "a Debian package name (lowercase letters, digits, '.', '+', '-'), not an apt pattern such as 'numa.+'",
    ),
]
DebVersion = Annotated[
    StrictStr, Pattern(r"(?:[0-9]{1,5}:)?[0-9][A-Za-z0-9.+~-]{0,99}", "a Debian version such as 2.0.16-1")
]
Suite = Annotated[StrictStr, Pattern(r"[a-z][a-z0-9-]{1,40}", "a suite (codename) such as jammy or bookworm")]
Component = Annotated[StrictStr, Pattern(r"[a-z][a-z0-9-]{1,30}", "an archive component such as main or universe")]
# Where the versions come from. A snapshot archive at a fixed time serves the same files forever;
# a plain archive drops old versions, so a target using one must say it accepts drift.
ArchiveUrl = Annotated[
    StrictStr,
    Pattern(
        r"https?://" + _HOST + r"(?:/[A-Za-z0-9._~%+-]+)*",
        "an http(s):// archive URL without credentials, quotes, spaces or a trailing '/'",
    ),
]


# An image reference pinned by digest, as the matrix writes its bases: name[:tag]@sha256:<64 hex>.
IMAGE_RE = re.compile(
    rf"(?P<name>{_HOST}/{_SEG}(?:/{_SEG})*|{_SEG}(?:/{_SEG})*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?"
)
PINNED_IMAGE_JSON = {  # IMAGE_RE with the digest required, without Python's named groups
    "type": "string",
    "pattern": rf"^(?:{_HOST}/{_SEG}(?:/{_SEG})*|{_SEG}(?:/{_SEG})*)(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
    r"@sha256:[0-9a-f]{64}$",
    "description": "an image reference name[:tag]@sha256:<64 hex>, pinned by digest",
}


# --- values checked by a function rather than one pattern ---------------------------------------


def _strict_date(value: Any) -> dt.date:
    # YAML gives a date for an unquoted 2027-03-31; a quoted one arrives as text.
    if isinstance(value, dt.datetime):
        raise ValueError(f"must be a date YYYY-MM-DD, not a timestamp (got {show(value)})")
    if isinstance(value, dt.date):
        return value
    if isinstance(value, str) and re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", value):
        try:
            return dt.date.fromisoformat(value)
        except ValueError:
            pass
    raise ValueError(f"must be a valid date YYYY-MM-DD (got {show(value)})")


IsoDate = Annotated[dt.date, BeforeValidator(_strict_date)]


def _hex64(value: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{64}", value):
        raise ValueError(f"must be 64 lowercase hex characters (got {show(value)})")
    return value


def _glibc(value: str) -> str:
    if not re.fullmatch(r"2\.[0-9]{1,2}", value):
        raise ValueError(f'must be a glibc version such as "2.35" (got {show(value)})')
    return value


def _identity(value: str) -> str:
    if not re.fullmatch(r"https://[A-Za-z0-9.-]+/[A-Za-z0-9._~%+/@-]+|[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+", value):
        raise ValueError(f"must be a certificate identity: a workflow URL or an e-mail (got {show(value)})")
    return value


def _load_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+\.so(?:\.[0-9]+)*|(?:/[A-Za-z0-9_.+*-]+)+", value):
        raise ValueError(f"must be a soname such as libnuma.so.1 or an absolute path glob (got {show(value)})")
    return value


def _words(value: Any) -> tuple[str, ...]:
    if not isinstance(value, str):
        raise ValueError(f"must be one line of words separated by single spaces (got {show(value)})")
    words = value.split(" ")
    for word in words:
        if not re.fullmatch(_WORD, word):
            raise ValueError(
                f"words separated by single spaces, each plain (no quotes or shell characters); got {show(word)}"
            )
    return tuple(words)


Sha256 = Annotated[StrictStr, AfterValidator(_hex64)]
Glibc = Annotated[StrictStr, AfterValidator(_glibc)]
Identity = Annotated[StrictStr, AfterValidator(_identity)]
LoadName = Annotated[StrictStr, AfterValidator(_load_name)]
# A command written as one line in the matrix (runtime.recipe.command), held as its words.
Words = Annotated[
    tuple[str, ...],
    BeforeValidator(_words),
    WithJsonSchema({"type": "string", "description": "one line of plain words separated by single spaces"}),
]

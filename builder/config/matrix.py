"""matrix.yaml, parsed once into typed, frozen objects.

Lookup order for every setting (fixed, first wins): the command line (only where a flag exists,
e.g. ``--max-jobs``) > the target's own entry > the matrix's ``defaults:`` block > the defaults
written in the models below. Past ``load()`` the rest of the code sees only these objects.

Every string that can reach a Dockerfile, a label, a build argument or a lock line is checked
against a strict pattern here. A newline, quote, ``$(...)`` or backtick fails the pattern, so
it is reported (exit 2) and never rendered.
"""

from __future__ import annotations

import datetime as dt
import difflib
import os
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
)

from builder.config import contract
from builder.config.cudamajor import major_minor
from builder.errors import ConfigError

MAX_MATRIX_BYTES = 1 << 20  # a matrix is a few KB; anything past 1 MiB is not one


# --- strict value patterns ------------------------------------------------------------------


def _pattern(regex: str, what: str):
    compiled = re.compile(regex)

    def check(value: str) -> str:
        # fullmatch, not match: Python's `$` would accept a trailing newline.
        if not compiled.fullmatch(value):
            raise ValueError(f"must be {what} (got {_show(value)})")
        return value

    return Annotated[StrictStr, AfterValidator(check)]


def _show(value: Any, limit: int = 60) -> str:
    from builder.log import shown  # redacted before it is cut (issue 21)

    return shown(value, limit)


_SEG = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?(?::[0-9]{1,5})?"

TargetName = _pattern(r"[a-z0-9][a-z0-9._-]{0,62}", "a target name: lowercase letters, digits, '.', '_', '-'")
Registry = _pattern(_HOST, "a registry host[:port], e.g. ghcr.io or 127.0.0.1:5000")
Repository = _pattern(rf"{_SEG}(?:/{_SEG})*", "an image repository path, e.g. k3/vllm")
Tag = _pattern(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", "an image tag")
Commit = _pattern(r"[0-9a-f]{40}", "a full 40-character lowercase hex commit")
Branch = _pattern(
    r"(?!.*\.\.)(?!.*//)(?!/)(?!.*/$)(?!.*\.lock$)[A-Za-z0-9][A-Za-z0-9._/-]{0,199}",
    "a branch name (letters, digits, '.', '_', '-', '/'; no '..')",
)
Version = _pattern(
    r"[0-9]+(?:\.[0-9]+)*(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?(?:\.dev[0-9]+)?(?:\+[a-z0-9]+(?:\.[a-z0-9]+)*)?",
    "a PEP 440 version such as 2.13.0 or 2.13.0+cu129",
)
PythonVersion = _pattern(r"3\.[0-9]{1,2}", 'a quoted Python major.minor such as "3.12"')
CudaVersion = _pattern(r"[0-9]{1,2}\.[0-9]{1,2}(?:\.[0-9]{1,3})?", "a CUDA version such as 12.9.1")
CudaArch = _pattern(r"[0-9]{1,2}\.[0-9][af]?(?:\+PTX)?", "a CUDA arch such as 9.0 or 10.0a or 12.0+PTX")
HttpsUrl = _pattern(
    r"https://" + _HOST + r"(?:/[A-Za-z0-9._~%+/-]*)?",
    "an https:// URL without credentials, quotes, spaces or shell characters",
)
LabelPrefix = _pattern(
    r"(?!org\.opencontainers\.)(?!org\.label-schema\.)[a-z0-9]+(?:-[a-z0-9]+)*(?:\.[a-z0-9]+(?:-[a-z0-9]+)*)+",
    "a reverse-DNS label prefix you control, e.g. com.example.gpu (lowercase; not org.opencontainers)",
)
# A remote sccache backend named in the (committed) matrix: no credentials, those travel as
# secrets (`build --compile-cache` or the backend's own AWS_*/GOOGLE_*/ACTIONS_* variables).
CacheUrl = _pattern(
    r"(?:rediss?|s3|gcs|webdavs?)://" + _HOST + r"(?:/[A-Za-z0-9._~%+/-]*)?(?:\?[A-Za-z0-9._=&-]*)?"
    r"|gha://[A-Za-z0-9._-]*",
    "an sccache backend URL without credentials: redis://, rediss://, s3://, gcs://, webdav(s):// or gha://",
)
# The source is fetched by git on the host. file:// is for local mirrors and the smoke repo;
# ext:: and other transports are not accepted.
GitUrl = _pattern(
    r"(?:https://" + _HOST + r"|file://)(?:/[A-Za-z0-9._~%+/-]*)",
    "an https:// or file:// git URL without credentials, quotes, spaces or shell characters",
)
Requirement = _pattern(
    r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?:\[[A-Za-z0-9._,-]+\])?"
    r"(?:(?:===|==|>=|<=|~=|!=|<|>)[A-Za-z0-9.*+!]+)(?:,(?:===|==|>=|<=|~=|!=|<|>)[A-Za-z0-9.*+!]+)*",
    "a requirement such as 'packaging==24.1' (name, extras, version specifiers only)",
)
ReqName = _pattern(
    r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?:\[[A-Za-z0-9._,-]+\])?",
    "a distribution name with optional [extras]",
)
DistName = _pattern(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?", "a distribution name")
RelPath = _pattern(
    r"(?!.*(?:^|/)\.\.(?:/|$))[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*",
    "a relative path inside the source (no '..', no leading '/')",
)
ModuleName = _pattern(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*", "a dotted Python module name")
# What a build declares: a module, or (Rust binaries such as vllm.vllm-rs) a dotted name with '-'.
ExtensionName = _pattern(
    r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_-]*)*", "a dotted extension name such as vllm._C or vllm.vllm-rs"
)
EnvName = _pattern(r"[A-Z][A-Z0-9_]{0,62}", "an environment variable name (A-Z, 0-9, '_')")
EnvValue = _pattern(r"[A-Za-z0-9_./:=@+,-]{1,200}", "a plain value (no spaces, quotes or shell characters)")
AbsPath = _pattern(r"(?:/[A-Za-z0-9_.+-]+)+", "an absolute path such as /usr/local/cuda")
LocalVersion = _pattern(r"[a-z0-9]+(?:\.[a-z0-9]+)*", "a PEP 440 local version label such as cu129")
ThirdPartyName = _pattern(r"[a-z0-9][a-z0-9_-]{0,40}", "a third-party name: lowercase letters, digits, '_', '-'")
UpstreamRef = _pattern(r"[A-Za-z0-9][A-Za-z0-9._/+-]{0,99}", "a tag, branch or commit as the source names it")
Owner = _pattern(
    r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}", "an e-mail address (the owner who answers for this image)"
)
Text = _pattern(r"[A-Za-z0-9][A-Za-z0-9 ,.:;()/_+=@#-]{0,199}", "plain text (letters, digits, spaces, ,.:;()/_+=@#-)")
# Reasons are shown by the checks and the docs, never rendered into a Dockerfile.
Reason = _pattern(
    r"[A-Za-z0-9][A-Za-z0-9 ,.:;()\[\]/_+=@#<>'-]{0,299}",
    "a reason in plain text (letters, digits, spaces, ,.:;()[]/_+=@#<>'-)",
)
_WORD = r"[A-Za-z0-9_./:=@+-][A-Za-z0-9_./:=@+,-]{0,127}"  # a command word: entrypoint, recipe
Arg = _pattern(_WORD, "a plain command word (no spaces, quotes or shell characters)")
SecretId = _pattern(r"[a-z][a-z0-9_]{0,62}", "a secret id: lowercase letters, digits, '_'")
AptPackage = _pattern(r"[a-z0-9][a-z0-9.+-]+(?:=[A-Za-z0-9.+:~-]+)?", "a Debian package name, optionally =version")
# CMake FetchContent's name for a dependency (FetchContent_Declare(<name> ...)), e.g. vllm-flash-attn.
FetchContentName = _pattern(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}", "a FetchContent name such as vllm-flash-attn")
# A program the source's build runs, looked up on PATH (cmake, g++, patch, ...).
ToolName = _pattern(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}", "a program name such as patch or g++")
# Something in the image's Python to call or read: module:attribute[.attribute...].
PyRef = _pattern(
    r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*",
    "a Python reference module.path:attribute, e.g. vllm.tool_parsers:ToolParserManager.get_tool_parser",
)
# A module to import, or module:callable to call (no arguments).
PySetup = _pattern(
    r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*(?::[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)?",
    "a module (imported) or module:callable (called), e.g. vllm.utils.import_utils:has_triton_kernels",
)
# fnmatch patterns over dotted module names, e.g. vllm.third_party.fmha_sm100.cute.test_*.
ModulePattern = _pattern(r"[A-Za-z_*?][A-Za-z0-9_.*?]{0,199}", "a dotted module name or fnmatch pattern")
# An SPDX license expression: identifiers (LicenseRef- included) joined by AND/OR/WITH, parentheses.
SpdxExpression = _pattern(
    r"\(?[A-Za-z0-9][A-Za-z0-9.+-]*\)?(?: (?:AND|OR|WITH) \(?[A-Za-z0-9][A-Za-z0-9.+-]*\)?)*",
    "an SPDX license expression such as MIT or MIT AND BSD-3-Clause AND Apache-2.0",
)

_IMAGE_RE = re.compile(
    rf"(?P<name>{_HOST}/{_SEG}(?:/{_SEG})*|{_SEG}(?:/{_SEG})*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?"
)


def _strict_date(value: Any) -> dt.date:
    # YAML gives a date for an unquoted 2027-03-31; a quoted one arrives as text.
    if isinstance(value, dt.datetime):
        raise ValueError(f"must be a date YYYY-MM-DD, not a timestamp (got {_show(value)})")
    if isinstance(value, dt.date):
        return value
    if isinstance(value, str) and re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", value):
        try:
            return dt.date.fromisoformat(value)
        except ValueError:
            pass
    raise ValueError(f"must be a valid date YYYY-MM-DD (got {_show(value)})")


IsoDate = Annotated[dt.date, BeforeValidator(_strict_date)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# --- the schema --------------------------------------------------------------------------------


class BaseImage(_Frozen):
    """A base image pinned by digest. Written in the matrix as ``name[:tag]@sha256:...``."""

    name: str  # repository with optional registry host, e.g. nvidia/cuda
    tag: str | None = None
    digest: str

    @property
    def ref(self) -> str:
        """The pinned reference the Dockerfile uses (tag kept for readers, digest decides)."""
        tagged = f"{self.name}:{self.tag}" if self.tag else self.name
        return f"{tagged}@{self.digest}"

    @property
    def display_name(self) -> str:
        return f"{self.name}:{self.tag}" if self.tag else self.name


def _parse_base(value: Any) -> Any:
    if isinstance(value, BaseImage):
        return value
    if not isinstance(value, str):
        raise ValueError(f"must be an image reference 'name[:tag]@sha256:<64 hex>' (got {_show(value)})")
    m = _IMAGE_RE.fullmatch(value)
    if not m:
        raise ValueError(f"must be an image reference 'name[:tag]@sha256:<64 hex>' (got {_show(value)})")
    if not m.group("digest"):
        raise ValueError(f"must be pinned by digest: add @sha256:<64 hex> to {_show(value)}")
    return BaseImage(name=m.group("name"), tag=m.group("tag"), digest=m.group("digest"))


PinnedImage = Annotated[BaseImage, BeforeValidator(_parse_base)]


class Bases(_Frozen):
    build: PinnedImage  # compiles the source (vLLM: CUDA devel image)
    runtime: PinnedImage  # the final image's parent (vLLM: CUDA base image)


class ImageTarget(_Frozen):
    registry: Registry
    repository: Repository
    tag: Tag

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}"

    @property
    def tagged(self) -> str:
        return f"{self.name}:{self.tag}"


class Extensions(_Frozen):
    """Compiled modules the image must import, beyond those derived from the source."""

    # Files in the source that declare extensions (Extension/CMakeExtension/RustExtension calls).
    declared_in: tuple[RelPath, ...] = ("setup.py",)
    add: tuple[ModuleName, ...] = ()
    waive: dict[ExtensionName, Reason] = Field(default_factory=dict)  # module -> reason
    ops: tuple[ModuleName, ...] = ()  # torch.ops namespaces/ops (and entry points) that must resolve
    # Ops this build leaves out on purpose (e.g. kernels compiled only for CUDA >= 13), with the
    # reason: the check confirms each is absent, so a stale entry or a silent change is seen.
    absent: dict[ModuleName, Reason] = Field(default_factory=dict)
    # Python packages the build installs from third-party sources and CMake install steps (vLLM:
    # vllm.vllm_flash_attn with its FA4 cute files, vllm.third_party, the K3 model package): every
    # module under them must import in the image (check python_trees). A waived compiled module
    # no longer hides the Python files its component installs.
    python_trees: tuple[ModuleName, ...] = ()
    # Modules of those trees left out of the import, each with why (shown in the check's output).
    python_skip: dict[ModulePattern, Reason] = Field(default_factory=dict)
    # Run once before the trees are imported (each of their modules then in a process of its own,
    # forked from that one): modules to import first (the heavy common ones, e.g. torch) and
    # callables for set-up the package does at run time (vLLM: has_triton_kernels() makes the
    # triton_kernels alias). A skip pattern "pkg.*" covers pkg itself too.
    python_setup: tuple[PySetup, ...] = ()


class ThirdParty(_Frozen):
    """A source the build system would otherwise download while compiling (CMake FetchContent).

    Fetched on the host like the main source (mirror, verified commit, export with submodules),
    handed to the compile step as a build context, and pointed at either through ``env`` (the
    source's own ``*_SRC_DIR`` variable) or through ``fetchcontent`` (CMake's
    ``FETCHCONTENT_SOURCE_DIR_<NAME>``, the release path: use it where the source's variable
    switches its build to a developer mode, as VLLM_FLASH_ATTN_SRC_DIR does). Exactly one of them.
    """

    url: GitUrl
    commit: Commit  # what is built; a tag in the source (``ref``) is only what the source names
    ref: UpstreamRef  # the tag or commit the source's build files name (checked at build time)
    declared_in: RelPath  # the build file in the source that names ``ref``
    env: EnvName | None = None  # the variable the source's build reads for a local checkout, e.g. VLLM_CUTLASS_SRC_DIR
    fetchcontent: FetchContentName | None = None  # FetchContent_Declare's name, e.g. vllm-flash-attn
    subdir: RelPath | None = None  # point ``env``/``fetchcontent`` at this directory inside the checkout
    # Submodules exported with it: "all" (FetchContent's default, recursive), "none", or paths.
    submodules: Literal["all", "none"] | tuple[RelPath, ...] = "all"
    license: SpdxExpression | None = None

    @property
    def cmake_var(self) -> str | None:
        """The CMake cache variable that hands FetchContent this tree (FetchContent upper-cases the name)."""
        return f"FETCHCONTENT_SOURCE_DIR_{self.fetchcontent.upper()}" if self.fetchcontent else None

    @property
    def handoff(self) -> str:
        """How the compile is told where the tree is: an environment variable, or a -D for CMake."""
        return self.env or f"-D{self.cmake_var}"


class Source(_Frozen):
    url: GitUrl
    branch: Branch
    commit: Commit
    package: DistName  # the distribution the source builds (vllm, or the smoke stand-in)
    version: Version  # its version at the pinned commit, for labels and the wheel
    # Requirement files inside the source at the pinned commit that feed the locks.
    requirements: tuple[RelPath, ...] = ()
    build_requirements: tuple[RelPath, ...] = ()
    # Respellings applied to those files' requirement names, e.g. a CUDA 13 extra -> CUDA 12.
    rewrites: dict[ReqName, ReqName] = Field(default_factory=dict)
    extensions: Extensions = Extensions()
    # The wheel's local version label, chosen here rather than left to the build (vLLM appends
    # +cuNNN when the build's CUDA differs from its main CUDA version), and the variable through
    # which the source's build is told the whole version (vLLM: VLLM_VERSION_OVERRIDE).
    local_version: LocalVersion | None = None
    version_env: EnvName | None = None
    third_party: dict[ThirdPartyName, ThirdParty] = Field(default_factory=dict)

    @property
    def wheel_version(self) -> str:
        """The version the built wheel carries, e.g. 0.30.0+cu129."""
        return f"{self.version}+{self.local_version}" if self.local_version else self.version


class Pin(_Frozen):
    version: Version
    index: HttpsUrl | None = None  # an extra index this package is taken from


class Cuda(_Frozen):
    version: CudaVersion
    arch_list: tuple[CudaArch, ...] = Field(min_length=1)
    # Distributions of another CUDA major that are expected in the image, each with its reason
    # (e.g. a package that ships both and picks the cu12 path at run time). Shown by the checks.
    other_major: dict[DistName, Reason] = Field(default_factory=dict)
    # Where the base images keep the CUDA forward-compatibility driver library (libcuda.so.1).
    # Every vLLM extension links libcuda.so.1; the GPU-less image checks import them with it.
    compat_dir: AbsPath = "/usr/local/cuda/compat"

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def major_minor(self) -> str:
        return major_minor(self.version)

    @property
    def short(self) -> str:  # 12.9.1 -> cu129
        return "cu" + "".join(self.version.split(".")[:2])


class Standalone(_Frozen):
    """A relocatable CPython tarball (python-build-standalone), verified on the host."""

    url: HttpsUrl
    sha256: Annotated[StrictStr, AfterValidator(lambda v: _hex64(v))]


def _hex64(value: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{64}", value):
        raise ValueError(f"must be 64 lowercase hex characters (got {_show(value)})")
    return value


class Python(_Frozen):
    version: PythonVersion
    # system: the bases' own /usr/bin/python3 (must be this version in both bases);
    # standalone: a pinned relocatable CPython unpacked under /opt/k3/python.
    provider: Literal["system", "standalone"] = "system"
    standalone: Standalone | None = None
    # glibc of the bases, for choosing manylinux wheels on the host (Ubuntu 22.04: 2.35).
    glibc: Annotated[StrictStr, AfterValidator(lambda v: _glibc(v))] = "2.35"
    arch: Literal["x86_64", "aarch64"] = "x86_64"

    def uv_platform(self) -> str:
        """uv's --python-platform for the bases: resolve for their glibc, not this machine's."""
        return f"{self.arch}-manylinux_{self.glibc.replace('.', '_')}"

    def wheel_platforms(self) -> tuple[str, ...]:
        """pip --platform values: pip does not expand manylinux_2_X to older tags itself."""
        minor = int(self.glibc.split(".")[1])
        tags = [f"manylinux_2_{m}_{self.arch}" for m in range(minor, 4, -1)]
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        tags += [f"{name}_{self.arch}" for m, name in legacy.items() if m <= minor]
        return tuple(tags)


def _glibc(value: str) -> str:
    if not re.fullmatch(r"2\.[0-9]{1,2}", value):
        raise ValueError(f'must be a glibc version such as "2.35" (got {_show(value)})')
    return value


Soname = _pattern(
    r"lib[A-Za-z0-9_.+-]{1,100}\.so(?:\.[0-9]+)*", "a library file name such as libcudart.so or libnuma.so.1"
)
PathPattern = _pattern(
    r"/[A-Za-z0-9_./*?+-]{1,200}", "an absolute path or fnmatch pattern such as /opt/k3/*/libfoo*.so"
)
EnvLikeDest = _pattern(r"[a-z_][a-z0-9_]{0,63}", "an argparse destination such as tool_call_parser")


def _words(value: Any) -> tuple[str, ...]:
    if not isinstance(value, str):
        raise ValueError(f"must be one line of words separated by single spaces (got {_show(value)})")
    words = value.split(" ")
    for word in words:
        if not re.fullmatch(_WORD, word):
            raise ValueError(
                f"words separated by single spaces, each plain (no quotes or shell characters); got {_show(word)}"
            )
    return tuple(words)


class Recipe(_Frozen):
    """A launch command and how to ask the image's own CLI about it, without starting anything.

    The check builds the CLI's parser (``parser`` called with a fresh ``parser_class()``), parses
    the command's words after the program and subcommand, runs ``validator`` on the result, and
    looks up each ``resolve`` option's value: a mapping must contain it, a callable must return
    something for it (not raise, not None). ``architecture`` goes through ``architecture_resolver``.
    """

    command: Annotated[tuple[str, ...], BeforeValidator(_words)]  # written as one line in the matrix
    parser: PyRef
    parser_class: PyRef
    validator: PyRef | None = None
    resolve: dict[EnvLikeDest, PyRef] = Field(default_factory=dict)  # argparse dest -> registry
    architecture: ModuleName | None = None
    architecture_resolver: PyRef | None = None
    # Environment of the probe process only (never of the image): what the CLI needs to build its
    # parser on a GPU-less host, each variable with why in the matrix's comments.
    env: dict[EnvName, EnvValue] = Field(default_factory=dict)


class Runtime(_Frozen):
    """What the final image offers code that compiles at run time (Triton, FlashInfer, DeepGEMM)."""

    # The CUDA toolkit with nvcc for run-time JIT; the runtime base must carry it (image check
    # runtime_toolchain). None: the target has no run-time CUDA toolkit (the smoke).
    cuda_home: AbsPath | None = None
    # Extra environment of the final image, e.g. Triton's ptxas.
    env: dict[EnvName, EnvValue] = Field(default_factory=dict)
    # The launch command the field guides give, parsed in the image by its own CLI (check recipe_cli).
    recipe: Recipe | None = None
    # ELF files (fnmatch on the path in the image) that a package loads only as one of several
    # alternatives, each with why: their unresolved NEEDED libraries are shown, not failed
    # (check shared_libraries). A CUDA library of another major still fails.
    optional_libraries: dict[PathPattern, Reason] = Field(default_factory=dict)
    # Libraries a package loads by name at run time (dlopen), which no NEEDED entry shows, each
    # with who loads it: each must load in the image (check shared_libraries).
    dlopen: dict[Soname, Reason] = Field(default_factory=dict)


KeyPath = _pattern(r"[A-Za-z0-9_./+-]{1,300}", "a key file path (relative to the matrix, or absolute)")
KeyRef = _pattern(
    r"(?:(?:gcpkms|awskms|azurekms|hv|hsm):[A-Za-z0-9_./:=?&%+@-]{0,400})|[A-Za-z0-9_./+-]{1,300}",
    "a private key file path or a KMS URI (gcpkms:, awskms:, azurekms:, hv:, hsm:)",
)


class Signing(_Frozen):
    """Who signs the image (keyless, cosign): `build verify --registry` checks the signature
    against this identity. Unset: presence is reported, a missing signature is not a failure.
    CI sets it through $K3_SIGNING_IDENTITY (repository variables); see builder/records/signature.py."""

    identity: Annotated[StrictStr, AfterValidator(lambda v: _identity(v))] | None = None
    issuer: HttpsUrl = "https://token.actions.githubusercontent.com"
    # The provenance's DSSE signature (builder/records/provsign.py): ``key`` a PEM private key file
    # (relative to the matrix) or a KMS URI securesystemslib signs with (gcpkms:, awskms:,
    # azurekms:, hv: (Vault), hsm:); ``public_key`` the PEM public key `verify` checks it against,
    # committed beside the matrix. Neither: explicitly unsigned, and `verify` says so.
    key: KeyRef | None = None
    public_key: KeyPath | None = None
    # SLSA identities (builder/records/attest.py); None: the documented defaults ($K3_BUILDER_ID and
    # $K3_BUILD_TYPE win over both).
    builder_id: HttpsUrl | None = None
    build_type: HttpsUrl | None = None


def _identity(value: str) -> str:
    if not re.fullmatch(r"https://[A-Za-z0-9.-]+/[A-Za-z0-9._~%+/@-]+|[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+", value):
        raise ValueError(f"must be a certificate identity: a workflow URL or an e-mail (got {_show(value)})")
    return value


LayerName = _pattern(r"[a-z][a-z0-9-]{0,30}", "a layer name: lowercase letters, digits, '-'")
NamePattern = _pattern(r"[a-z0-9*?][a-z0-9*?._-]{0,99}", "a distribution name pattern such as nvidia-* (PEP 503 names)")


class Layer(_Frozen):
    """A group of the runtime lock installed as its own image layer (most stable first)."""

    name: LayerName
    match: tuple[NamePattern, ...] = Field(min_length=1)  # fnmatch patterns on normalized names


# Default grouping, most to least stable: what changes with CUDA, with torch, with FlashInfer.
# Everything else in the lock is the "deps" layer; the source's own wheel is the "app-native" and "app-python" layers.
DEFAULT_LAYERS = (
    Layer(name="cuda", match=("nvidia-*", "cuda-*")),
    Layer(name="torch", match=("torch", "torchvision", "torchaudio", "triton")),
    Layer(name="flashinfer", match=("flashinfer-*",)),
)
# "app" too: the name the application layer had before it was split into app-native and app-python.
RESERVED_LAYERS = ("base", "deps", "app", *contract.APP_LAYERS)


class Compile(_Frozen):
    # None: derived from the builder. Like vLLM's MAX_JOBS: the total parallelism (nvcc jobs x
    # NVCC_THREADS); the source's build divides it by NVCC_THREADS itself.
    max_jobs: Annotated[StrictInt, Field(ge=1, le=512)] | None = None
    nvcc_threads: Annotated[StrictInt, Field(ge=1, le=64)] = 1
    memory_per_job_gib: Annotated[StrictInt, Field(ge=1, le=256)] = 4  # per nvcc thread, for MAX_JOBS
    apt_packages: tuple[AptPackage, ...] = ()  # build stage only; never in the final image
    # Programs the source's build runs (setup.py, CMakeLists.txt, cmake/, tools/), each with where;
    # the build stage asserts each is on PATH before compiling, so a missing one fails in seconds.
    tools: dict[ToolName, Reason] = Field(default_factory=dict)
    # BuildKit secret ids mounted (required) into the compile step at /run/secrets/<id>; their
    # values come from `build --secret id=<id>,env=VAR` and never from the matrix.
    secrets: tuple[SecretId, ...] = ()
    # Environment of the compile step, e.g. CMAKE_BUILD_TYPE=Release, VLLM_TARGET_DEVICE=cuda.
    env: dict[EnvName, EnvValue] = Field(default_factory=dict)
    # Opt into a remote sccache backend (`build --compile-cache URL`): the compile step then has
    # network access (the rendered Dockerfile says so). Without it the compile runs --network=none
    # with sccache's local cache in a BuildKit cache mount.
    remote_cache: bool = False
    # The backend when the command line names none (`--compile-cache` and $K3_COMPILE_CACHE win);
    # setting it opts into the remote cache like remote_cache: true.
    cache_url: CacheUrl | None = None

    @property
    def remote(self) -> bool:
        return self.remote_cache or self.cache_url is not None


# --- OS packages (Debian/Ubuntu .debs locked by sha256 like wheels; builder/deps/oslock.py) -----------

DebName = _pattern(r"[a-z0-9][a-z0-9.+-]{1,62}", "a Debian package name (lowercase letters, digits, '.', '+', '-')")
DebVersion = _pattern(r"(?:[0-9]{1,5}:)?[0-9][A-Za-z0-9.+~-]{0,99}", "a Debian version such as 2.0.16-1")
Suite = _pattern(r"[a-z][a-z0-9-]{1,40}", "a suite (codename) such as jammy or bookworm")
Component = _pattern(r"[a-z][a-z0-9-]{1,30}", "an archive component such as main or universe")
# Where the versions come from. A snapshot archive at a fixed time serves the same files forever;
# a plain archive drops old versions, so a target using one must say it accepts drift.
ArchiveUrl = _pattern(
    r"https?://" + _HOST + r"(?:/[A-Za-z0-9._~%+-]+)*",
    "an http(s):// archive URL without credentials, quotes, spaces or a trailing '/'",
)
SNAPSHOT_ARCHIVES = (
    re.compile(r"https://snapshot\.ubuntu\.com/ubuntu/[0-9]{8}T[0-9]{6}Z"),
    re.compile(r"https://snapshot\.debian\.org/archive/debian/[0-9]{8}T[0-9]{6}Z"),
)


class OsPackage(_Frozen):
    """One package the final image needs from the distribution, and why."""

    name: DebName
    why: Reason
    # Pin a version (the smoke pins what its plain archive served at `smoke-init`); None: the
    # archive's candidate at lock time (a snapshot's candidate never changes).
    version: DebVersion | None = None
    # Packages are unpacked, never configured (no maintainer script runs). A package that carries
    # a preinst/postinst fails the build unless this says why skipping its scripts is safe.
    scripts_skipped: Reason | None = None


class OsPackages(_Frozen):
    """OS packages of the final image: resolved against the runtime base's own dpkg database into
    locks/<target>/os-packages.txt, downloaded and hash-checked on the host, unpacked with no
    network into their own layer."""

    archive: ArchiveUrl
    # The release first, then its updates (a base is built from them: resolving against the
    # release alone could ask for older versions than the base has), e.g. [jammy, jammy-updates].
    suites: tuple[Suite, ...] = Field(min_length=1)
    components: tuple[Component, ...] = ("main",)
    packages: tuple[OsPackage, ...] = Field(min_length=1)
    accept_drift: bool = False  # a plain (non-snapshot) archive: versions move as the archive does
    # Run-time proofs the check `os_packages` makes: sonames (or absolute path globs) that must load
    # with ctypes, in order, and commands that must run (e.g. numactl --show).
    loads: tuple[Annotated[StrictStr, AfterValidator(lambda v: _load_name(v))], ...] = ()
    runs: tuple[tuple[Arg, ...], ...] = ()

    @property
    def snapshot(self) -> bool:
        return any(p.fullmatch(self.archive) for p in SNAPSHOT_ARCHIVES)


def _load_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+\.so(?:\.[0-9]+)*|(?:/[A-Za-z0-9_.+*-]+)+", value):
        raise ValueError(f"must be a soname such as libnuma.so.1 or an absolute path glob (got {_show(value)})")
    return value


class Target(_Frozen):
    name: TargetName
    description: Text
    owner: Owner
    expires: IsoDate
    expiry_warning_days: Annotated[StrictInt, Field(ge=0, le=3650)] = 30
    expiry_horizon_days: Annotated[StrictInt, Field(ge=1, le=3650)] = 365
    # SPDX expression for the image label; an image of many components (NVIDIA's proprietary ones
    # included) is honestly NOASSERTION, with the licenses per component in the SBOM.
    licenses: Text = "NOASSERTION"
    vendor: Text = "K3 cu129 image pipeline"
    # This repository: the tool and matrix that build the image (label <prefix>.builder.source, the
    # provenance's tool and buildType URLs). The packaged software's repository is source.url
    # (labels org.opencontainers.image.source/revision, a pair: builder/config/contract.py says why).
    project_url: HttpsUrl = "https://github.com/k3-cu129/k3-cu129-images"
    # Reverse-DNS prefix of the project's own labels (expiry, owner, target, ...): a domain the
    # owner controls, e.g. com.example.gpu-platform. Readers of an image find it by its labels.
    label_prefix: LabelPrefix = contract.DEFAULT_LABEL_PREFIX
    image: ImageTarget
    bases: Bases
    source: Source
    python: Python
    cuda: Cuda
    torch: Pin | None = None
    flashinfer: Pin | None = None
    nccl: Pin | None = None
    indexes: tuple[HttpsUrl, ...] = Field(default=("https://pypi.org/simple",), min_length=1)
    requirements: tuple[Requirement, ...] = ()
    build_requirements: tuple[Requirement, ...] = ()
    # Versions forced over what the resolved packages declare (uv --override), each with its
    # reason; `pip check` in the image reports these conflicts instead of failing on them.
    overrides: dict[Requirement, Reason] = Field(default_factory=dict)
    compile: Compile = Compile()
    runtime: Runtime = Runtime()
    os_packages: OsPackages | None = None
    layers: tuple[Layer, ...] = DEFAULT_LAYERS
    signing: Signing = Signing()
    entrypoint: tuple[Arg, ...] = Field(min_length=1)

    @property
    def labels(self) -> contract.LabelKeys:
        return contract.LabelKeys(self.label_prefix)

    def as_input(self) -> dict:
        """The entry as an input of the image (the input key, the provenance's externalParameters):
        everything but ``signing``, which says who signs the record, not what is built. Rotating a
        key or setting $K3_SIGNING_IDENTITY rebuilds nothing, and no key path is published."""
        return self.model_dump(mode="json", exclude={"signing"})

    def pinned_requirements(self) -> tuple[str, ...]:
        """Top-level runtime pins for the lock: the matrix's own list plus the named pins."""
        pins = list(self.requirements)
        if self.torch:
            pins.append(f"torch=={self.torch.version}")
        if self.flashinfer:
            pins.append(f"flashinfer-python=={self.flashinfer.version}")
        if self.nccl:
            pins.append(f"nvidia-nccl-cu{self.cuda.major}=={self.nccl.version}")
        return tuple(sorted(pins, key=str.lower))

    def lock_indexes(self) -> tuple[str, ...]:
        """Indexes for the lock, in a fixed order: the matrix's list, then each pin's own."""
        extra = [p.index for p in (self.torch, self.flashinfer, self.nccl) if p and p.index]
        return tuple(dict.fromkeys([*self.indexes, *extra]))


class Matrix(_Frozen):
    version: Literal[1]
    targets: dict[TargetName, Target] = Field(min_length=1)
    path: Path  # where it was read from, for messages

    def target(self, name: str) -> Target:
        if name not in self.targets:
            hint = _did_you_mean(name, self.targets)
            raise ConfigError(
                f"{self.path}: targets: unknown target {name!r}{hint}; known: {', '.join(sorted(self.targets))}"
            )
        return self.targets[name]


# --- loading -------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """Safe loader that refuses duplicate keys and aliases (no billion-laughs expansion)."""


def _compose_node(self: _Loader, parent: Any, index: Any) -> Any:
    if self.check_event(yaml.events.AliasEvent):
        event = self.peek_event()
        raise yaml.constructor.ConstructorError(
            None, None, "YAML aliases (*name) are not allowed in the matrix; write the value out", event.start_mark
        )
    return yaml.SafeLoader.compose_node(self, parent, index)


def _construct_mapping(self: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = self.construct_object(key_node, deep=deep)
        if not isinstance(key, str):
            raise yaml.constructor.ConstructorError(
                None, None, f"keys must be strings, got {_show(key)}", key_node.start_mark
            )
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen[key] = True
    return yaml.SafeLoader.construct_mapping(self, node, deep=True)


_Loader.compose_node = _compose_node  # type: ignore[method-assign]
# Dates stay text until the schema parses them, so 2027-02-30 is a keyed error, not a crash.
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _did_you_mean(word: str, options: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The model class that owns the mapping at ``loc`` (for "did you mean" suggestions)."""
    model: Any = _RawMatrix
    i = 0
    while i < len(loc):
        field = model.model_fields.get(loc[i]) if isinstance(loc[i], str) else None
        if field is None:
            return None
        ann = field.annotation
        i += 1
        for _ in range(3):  # unwrap Optional[...], dict[str, X], tuple[X, ...]
            origin = typing.get_origin(ann)
            args = [a for a in typing.get_args(ann) if a is not type(None)]
            if origin is dict and i < len(loc):
                ann, i = args[1], i + 1
            elif origin in (typing.Union, getattr(__import__("types"), "UnionType", None)) and args:
                ann = args[0]
            elif origin is typing.Annotated or (args and hasattr(ann, "__metadata__")):
                ann = args[0]
            else:
                break
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            return None
        if i == len(loc):
            return model
    return model


class _RawMatrix(_Frozen):
    """The file's shape before targets get their names and defaults."""

    version: Literal[1]
    defaults: dict = Field(default_factory=dict)
    targets: dict[TargetName, Target] = Field(min_length=1)


_TYPE_TAG = re.compile(r"(function-|\[key\]$|[a-z-]+\[.*\(\))|(literal|tuple|list|dict|union|str|int|bool)\[")


def _clean_loc(loc: tuple) -> tuple:
    # pydantic appends the validator name for Annotated members and the member's type for union
    # members (literal['all','none'], tuple[...]); keep real keys only.
    return tuple(p for p in loc if not (isinstance(p, str) and _TYPE_TAG.match(p)))


def _has(node: Any, keys: tuple) -> bool:
    for key in keys:
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and key < len(node):
            node = node[key]
        else:
            return False
    return True


def _key(part: Any) -> str:
    """A key as it can be printed on one line: plain names as they are, anything else quoted."""
    text = str(part)
    return text if re.fullmatch(r"[A-Za-z0-9_.+@\[\]-]+", text) else repr(part)


def _where(loc: tuple, own: dict, defaults: dict) -> str:
    """The key as written in the file: a value a target got from ``defaults:`` is named there."""
    if len(loc) > 2 and loc[0] == "targets" and isinstance(own.get(loc[1]), dict):
        rest = loc[2:]
        if not _has(own[loc[1]], rest[:1]) and _has(defaults, rest[:1]):
            return "defaults." + ".".join(map(_key, rest)) + f" (used by targets.{_key(loc[1])})"
    return ".".join(_key(p) for p in loc) or "(top level)"


def _format_error(path: Path, err: dict, own: dict | None = None, defaults: dict | None = None) -> str:
    loc = _clean_loc(tuple(err["loc"]))
    where = _where(loc, own or {}, defaults or {})
    for var, keys in ENV_OVERRIDES.items():
        if os.environ.get(var) and loc[2:4] == keys:
            where += f" (from ${var})"
    kind = err["type"]
    if kind == "extra_forbidden":
        owner = _model_at(loc[:-1])
        options = list(owner.model_fields) if owner else []
        options = [o for o in options if o != "name"] if owner is Target else options
        return f"{path}: {where}: unknown key{_did_you_mean(str(loc[-1]), options)}"
    if kind == "missing":
        return f"{path}: {where}: required key is missing"
    msg = err["msg"]
    msg = msg.removeprefix("Value error, ")
    if kind in ("string_type", "int_type", "bool_type", "date_type", "tuple_type", "dict_type", "model_type"):
        quote = kind == "string_type" and isinstance(err.get("input"), (int, float))
        msg = f"{msg} (got {_show(err.get('input'))}{'; quote it' if quote else ''})"
    elif (
        kind.startswith("literal")
        or kind.endswith("_parsing")
        or kind in ("greater_than_equal", "less_than_equal", "too_short")
    ):
        msg = f"{msg} (got {_show(err.get('input'))})"
    return f"{path}: {where}: {msg}"


# Environment overrides, highest in the lookup order (like cibuildwheel's CIBW_* variables): a CI
# job pushes to the registry its repository variables name without editing the matrix. They go
# through the same validation as the file.
ENV_OVERRIDES = {
    "K3_REGISTRY": ("image", "registry"),
    "K3_REPOSITORY": ("image", "repository"),
    "K3_TAG": ("image", "tag"),  # CI pushes candidates under their own tag (issue: promotion)
    "K3_SIGNING_IDENTITY": ("signing", "identity"),
    "K3_SIGNING_ISSUER": ("signing", "issuer"),
}


def environment_overrides() -> dict:
    out: dict = {}
    for var, (section, key) in ENV_OVERRIDES.items():
        value = os.environ.get(var)
        if value:
            out.setdefault(section, {})[key] = value
    return out


def parse(text: str, path: Path) -> Matrix:
    """Parse matrix text. Raises ConfigError with one line naming the file and the key."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_MATRIX_BYTES:
        raise ConfigError(f"{path}: the file is larger than {MAX_MATRIX_BYTES} bytes; is it really a matrix?")
    try:
        raw = yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(unknown position)"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: {where}: invalid YAML: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nesting too deep to be a matrix") from None
    except (ValueError, TypeError, OverflowError) as exc:  # a scalar YAML could not construct
        raise ConfigError(f"{path}: invalid YAML value: {_show(str(exc))}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: (top level): must be a mapping with 'version' and 'targets'")
    defaults = raw.get("defaults", {})
    targets = raw.get("targets")
    if not isinstance(defaults, dict):
        raise ConfigError(f"{path}: defaults: must be a mapping")
    _check_defaults(path, defaults, targets if isinstance(targets, dict) else {})
    own_targets = targets if isinstance(targets, dict) else {}
    overrides = environment_overrides()
    if isinstance(targets, dict):
        merged = {}
        for name, entry in targets.items():
            if isinstance(entry, dict):
                entry = _deep_merge(defaults, entry)
                entry = _deep_merge(entry, overrides)  # the environment wins (lookup order)
                entry = {"name": name, **entry} if "name" not in entry else entry
            merged[name] = entry
        raw = {**raw, "targets": merged}
    try:
        checked = _RawMatrix.model_validate(raw)
    except ValidationError as exc:
        # Unknown keys first (a typo explains the "missing" errors it causes), then the deepest
        # location: "indexes.0: must be an https URL" says more than "indexes: too short".
        # Of a union's members, the one that got as deep as an item (a bad path in a list) says most.
        errors = sorted(
            exc.errors(include_url=False),
            key=lambda e: (
                e["type"] != "extra_forbidden",
                -len(_clean_loc(tuple(e["loc"]))),
                tuple(map(str, e["loc"])),
            ),
        )
        raise ConfigError(_format_error(path, errors[0], own_targets, defaults)) from None
    for name, target in checked.targets.items():
        if target.name != name:
            raise ConfigError(f"{path}: targets.{name}.name: 'name' is set from the key; remove it")
        _cross_checks(path, target)
    return Matrix(version=checked.version, targets=checked.targets, path=path)


def _check_defaults(path: Path, defaults: dict, targets: dict) -> None:
    """Every value under ``defaults:`` is checked on its own, used by a target or not: a bad value
    no target reads is still bad input (and would bite the next target that inherits it)."""
    from pydantic import TypeAdapter

    for key, value in defaults.items():
        field = Target.model_fields.get(key) if isinstance(key, str) and key != "name" else None
        if field is None:
            options = [o for o in Target.model_fields if o != "name"]
            raise ConfigError(f"{path}: defaults.{_key(key)}: unknown key{_did_you_mean(str(key), options)}")
        try:
            # Annotated[X] with no metadata is a TypeError: plain models (image, bases...) have none.
            kind = Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
            TypeAdapter(kind).validate_python(value)
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            message = _format_error(path, {**err, "loc": ("defaults", key, *err["loc"])})
            users = [n for n, t in targets.items() if not (isinstance(t, dict) and key in t)]
            if users:  # after the whole key path: "<file>: defaults.image.registry (used by ...): why"
                prefix = f"{path}: "
                keypath, _, why = message[len(prefix) :].partition(": ")
                message = f"{prefix}{keypath} (used by {', '.join(f'targets.{_key(u)}' for u in users)}): {why}"
            raise ConfigError(message) from None


# Variables the template sets in the build stage (builder/dockerfile/templates/Dockerfile.j2): no matrix key
# may set them too.
TEMPLATE_ENV = (
    "SOURCE_DATE_EPOCH",
    "TORCH_CUDA_ARCH_LIST",
    "MAX_JOBS",
    "NVCC_THREADS",
    "SETUPTOOLS_SCM_PRETEND_VERSION",
    "SCCACHE_DIR",
    "SCCACHE_IDLE_TIMEOUT",
    "CMAKE_ARGS",
    "PIP_NO_INDEX",
    "PIP_DISABLE_PIP_VERSION_CHECK",
    "PIP_NO_COMPILE",
    "PYTHONDONTWRITEBYTECODE",
    "VIRTUAL_ENV",
    "PATH",
)


def _cross_checks(path: Path, t: Target) -> None:
    where = f"{path}: targets.{t.name}"
    if t.python.provider == "standalone" and t.python.standalone is None:
        raise ConfigError(f"{where}.python.standalone: required when provider is 'standalone' (url and sha256)")
    if t.python.provider == "system" and t.python.standalone is not None:
        raise ConfigError(f"{where}.python.standalone: only used with provider 'standalone'; remove it")
    # The template's own variables first, so a clash is reported at the matrix key that caused it.
    envs = [("the template", k) for k in TEMPLATE_ENV]
    envs += [("source.version_env", t.source.version_env)] if t.source.version_env else []
    for n, tp in sorted(t.source.third_party.items()):
        if (tp.env is None) == (tp.fetchcontent is None):
            raise ConfigError(
                f"{where}.source.third_party.{n}: set exactly one of env (the source's own *_SRC_DIR "
                "variable) and fetchcontent (CMake's FETCHCONTENT_SOURCE_DIR_<NAME>)"
            )
    envs += [(f"source.third_party.{n}.env", tp.env) for n, tp in t.source.third_party.items() if tp.env]
    envs += [(f"compile.env.{k}", k) for k in t.compile.env]
    seen: dict[str, str] = {}
    for key, var in envs:
        if var in seen:
            raise ConfigError(f"{where}.{key}: {var} is already set by {seen[var]}; each variable has one owner")
        seen[var] = key
    recipe = t.runtime.recipe
    if recipe and len(recipe.command) < 2:
        raise ConfigError(
            f"{where}.runtime.recipe.command: give the program and its subcommand first, "
            "e.g. vllm serve MODEL --flag ..."
        )
    if recipe and recipe.architecture and not recipe.architecture_resolver:
        raise ConfigError(
            f"{where}.runtime.recipe.architecture_resolver: required with architecture "
            "(the model registry's lookup, module:attribute)"
        )
    if t.signing.key and not t.signing.public_key:
        raise ConfigError(f"{where}.signing.public_key: required with signing.key (verify checks against it)")
    names = [layer.name for layer in t.layers]
    for i, name in enumerate(names):
        if name in RESERVED_LAYERS or name in names[:i]:
            raise ConfigError(
                f"{where}.layers.{i}.name: {name!r} is reserved or repeated "
                f"({', '.join(RESERVED_LAYERS)} are the tool's own layers)"
            )
    for req in t.overrides:
        if "==" not in req or any(op in req.split("==", 1)[1] for op in ",<>!~"):
            raise ConfigError(f"{where}.overrides.{req}: an override forces one version: write name==version")
    if t.python.glibc.split(".")[1] not in [str(m) for m in range(17, 41)]:
        raise ConfigError(f"{where}.python.glibc: {t.python.glibc} is outside what the resolver knows (2.17-2.40)")
    if t.os_packages:
        _os_package_checks(where, t.os_packages)
    if t.torch and t.torch.version.partition("+")[2] not in ("", t.cuda.short):
        raise ConfigError(
            f"{where}.torch.version: local version {t.torch.version!r} does not match CUDA {t.cuda.version} "
            f"(expected +{t.cuda.short})"
        )


def _os_package_checks(where: str, osp: OsPackages) -> None:
    if not osp.snapshot and not osp.accept_drift:
        raise ConfigError(
            f"{where}.os_packages.archive: {osp.archive} is not a snapshot archive "
            "(https://snapshot.ubuntu.com/ubuntu/<YYYYMMDDTHHMMSSZ> or snapshot.debian.org's); "
            "use one, or set accept_drift: true"
        )
    if osp.snapshot and osp.accept_drift:
        raise ConfigError(f"{where}.os_packages.accept_drift: a snapshot archive does not drift; remove it")
    if len(set(osp.suites)) != len(osp.suites):
        raise ConfigError(f"{where}.os_packages.suites: a suite is listed twice")
    names = [p.name for p in osp.packages]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(f"{where}.os_packages.packages.{i}.name: {name} is listed twice")


def load(path: Path) -> Matrix:
    from builder.fsutil import read_regular

    if not path.exists():
        raise ConfigError(f"{path}: no such file (pass --matrix PATH)")
    raw = read_regular(path, MAX_MATRIX_BYTES, "the build matrix")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 (byte {exc.start})") from None
    return parse(text, path)

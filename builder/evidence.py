"""`build evidence`: save what the host, the engine, the image and the container look like now,
before anything is changed, into one timestamped archive with a manifest of what was captured and
what was not (and why). Works with no GPU, no nvidia-smi and no Docker. Secrets never reach it:
secret-looking names, known secret values and credential-looking values are redacted.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import re
import stat
import subprocess
import tarfile
from pathlib import Path
from typing import Callable

from builder import contract, log
from builder.doctor import read_nvidia_smi
from builder.errors import BuilderError, ConfigError
from builder.fsutil import atomic_write

# Names whose values are secrets: tokens, passwords, keys, JWTs, personal access tokens, ...
_SECRET_NAME = re.compile(r"(?i)(token|secret|passw|pwd|pass\b|_pass|pat\b|_pat|jwt|key|credential|auth|access"
                          r"|cookie|session|private|signature|cert)")
# Values that look like credentials whatever their name: long opaque strings, known token shapes.
_SECRET_VALUE = re.compile(r"^(gh[pousr]_|github_pat_|glpat-|hf_|sk-|xox[abpr]-|AKIA|eyJ)|^[A-Za-z0-9+/_=.-]{32,}$")
# Paths, PATH-like lists, plain words, URLs (their credentials are already redacted by then).
_HARMLESS = re.compile(r"^(/[\w./:-]*|[\w.-]+(:[\w./-]+)*|[a-z][a-z0-9+.-]*://\S*)$")


def redacted_environment(environ: dict[str, str]) -> str:
    """The environment, sorted: values of secret-looking names, credential-looking values, known
    secret values and URL credentials hidden. When unsure, redacted."""
    lines = []
    for name in sorted(environ):
        value = log.redact(environ[name])
        unsure = not (not value or " " in value or _HARMLESS.match(value))
        if _SECRET_NAME.search(name) or _SECRET_VALUE.search(value) or unsure:
            value = "***"
        lines.append(f"{name}={value}")
    return "\n".join(lines) + "\n"


def _out_dir(out_dir: Path) -> Path:
    """Where the archive goes: a directory (made if missing), never a file, a device or /proc."""
    resolved = out_dir.resolve()
    if resolved.parts[:2] in (("/", "proc"), ("/", "sys"), ("/", "dev")):
        raise ConfigError(f"--out {out_dir}: not a place for an archive")
    if resolved.exists() and not stat.S_ISDIR(resolved.stat().st_mode):
        raise ConfigError(f"--out {out_dir}: exists and is not a directory")
    resolved.mkdir(parents=True, exist_ok=True)
    return resolved


class _Collector:
    def __init__(self) -> None:
        self.files: dict[str, str] = {}
        self.captured: list[str] = []
        self.missing: dict[str, str] = {}

    def capture(self, name: str, produce: Callable[[], str]) -> None:
        try:
            self.files[name] = produce()
            self.captured.append(name)
        except (BuilderError, OSError, subprocess.SubprocessError, ValueError) as exc:
            self.missing[name] = log.redact(getattr(exc, "message", None) or str(exc))


def _vllm_labels(inspect_json: str | None) -> str:
    if inspect_json is None:
        raise ValueError("no labels (image not inspected)")
    doc = json.loads(inspect_json)[0]
    labels = (doc.get("Config") or {}).get("Labels") or {}
    if not labels:
        raise ValueError("no labels (image not inspected)")
    own = contract.keys_in(labels)
    keys = (contract.OCI_VERSION, contract.OCI_REVISION, contract.OCI_SOURCE, own.builder_source, own.cuda,
            own.expires, own.owner)
    return "".join(f"{k}={labels.get(k, '(absent)')}\n" for k in keys) + \
        f"repo_digests={','.join(doc.get('RepoDigests') or [])}\n"


def _smi(smi_file: Path | None) -> str:
    text, source = read_nvidia_smi(smi_file)
    if text is None:
        raise OSError(source)
    return text


def collect(engine, image: str | None, container: str | None, smi_file: Path | None,
            environ: dict[str, str], now: dt.datetime) -> _Collector:
    c = _Collector()
    c.capture("date-utc.txt", lambda: now.strftime("%a %b %d %H:%M:%S UTC %Y") + "\n")
    c.capture("nvidia-smi.txt", lambda: _smi(smi_file))
    described: dict = {}

    def docker(name: str) -> str:
        if not described:
            described.update(engine.describe())  # one `docker version` and one `docker info`
        return described[name]

    c.capture("docker-version.txt", lambda: docker("docker-version"))
    c.capture("docker-info.txt", lambda: docker("docker-info"))
    if image:
        c.capture("image-inspect.json", lambda: engine.image_inspect(image))
        c.capture("vllm-version.txt", lambda: _vllm_labels(c.files.get("image-inspect.json")))
    c.capture("environment.txt", lambda: redacted_environment(environ))
    if container:
        c.capture("container.log", lambda: log.redact(engine.containers.logs(container)))
    return c


def evidence(engine, out_dir: Path, image: str | None, container: str | None,
             smi_file: Path | None = None, environ: dict[str, str] | None = None) -> tuple[Path, dict]:
    """Collect everything into one timestamped tar.gz with a manifest; never fails for a missing part."""
    out = _out_dir(out_dir)
    now = dt.datetime.now(dt.timezone.utc)
    c = collect(engine, image, container, smi_file, environ if environ is not None else dict(os.environ), now)
    manifest = {"created": now.strftime(contract.TIME_FORMAT), "captured": c.captured, "missing": c.missing,
                "image": image, "container": container}
    files = {**c.files, "manifest.json": json.dumps(manifest, indent=2, sort_keys=True) + "\n"}
    stem = f"k3-evidence-{now.strftime('%Y%m%dT%H%M%SZ')}"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in sorted(files):
            data = files[name].encode("utf-8", "replace")
            info = tarfile.TarInfo(f"{stem}/{name}")
            info.size, info.mtime, info.mode = len(data), int(now.timestamp()), 0o644
            tar.addfile(info, io.BytesIO(data))
    path = out / f"{stem}.tar.gz"
    atomic_write(path, buf.getvalue())
    return path, manifest

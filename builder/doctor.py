"""Tools for the operator of an r575 host, before anyone changes a launch flag:

- ``doctor``: does this image start on this host, and if not, which route applies;
- ``evidence``: save what the host, the engine, the image and the container look like now.

Both work with no GPU, no nvidia-smi and no Docker: they say what is missing.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from builder import compat, contract, log
from builder.errors import BuilderError, ConfigError
from builder.fsutil import atomic_write


def read_nvidia_smi(path: Path | None) -> tuple[str | None, str]:
    """(output, where from): a captured file, or `nvidia-smi` when it is installed, or nothing."""
    if path is not None:
        try:
            return path.read_text(errors="replace"), str(path)
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read the captured nvidia-smi output: {exc.strerror}") from None
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None, "nvidia-smi not installed"
    proc = subprocess.run([exe], capture_output=True, text=True, timeout=60)
    return proc.stdout + proc.stderr, exe


@dataclass
class Diagnosis:
    compatible: bool
    line: str
    route: str
    expiry: str | None = None
    facts: dict = field(default_factory=dict)


def diagnose(smi_text: str | None, smi_source: str, labels: dict[str, str], env: dict[str, str],
             image: str, today: dt.date | None = None) -> Diagnosis:
    if smi_text is None:
        host = compat.HostGPU(None, None, (), note=smi_source)
    else:
        try:
            host = compat.parse_smi(smi_text)
        except compat.SmiParseError as exc:
            raise ConfigError(f"{smi_source}: {exc}") from None
    found = compat.image_cuda(labels, env, contract.LABEL_CUDA)
    if found is None:
        raise ConfigError(f"{image}: no CUDA version in its labels ({contract.LABEL_CUDA}) or env "
                          "(CUDA_VERSION, NVIDIA_REQUIRE_CUDA); is it a CUDA image?")
    cuda, where = found
    try:
        verdict = compat.decide(cuda, host)
    except ValueError as exc:
        raise ConfigError(f"{image}: {where}: {exc}") from None
    line = f"{'compatible' if verdict.compatible else 'INCOMPATIBLE'}: {image}: {verdict.reason}"
    expiry = _expiry(labels, today or dt.date.today())
    return Diagnosis(verdict.compatible, line, verdict.route, expiry, {
        "image": image, "image_cuda": cuda, "image_cuda_from": where, "host_driver": host.driver_text,
        "host_branch": host.branch, "host_cuda": host.cuda, "gpus": list(host.gpus),
        "data_center": host.data_center, "nvidia_smi": smi_source,
    })


def _expiry(labels: dict[str, str], today: dt.date) -> str | None:
    raw = labels.get(contract.LABEL_EXPIRES)
    if raw is None:
        return None
    try:
        expires = dt.date.fromisoformat(raw)
    except ValueError:
        return f"expiry label {contract.LABEL_EXPIRES}={raw!r} is not a date"
    owner = labels.get(contract.LABEL_OWNER, "its owner")
    if expires < today:
        return f"EXPIRED on {raw}: this bridge build is past its exit date; ask {owner}"
    return f"expires {raw} ({(expires - today).days} days left; owner {owner})"


# -- evidence ----------------------------------------------------------------------------------

_SECRET_NAME = re.compile(r"(?i)(token|secret|passw|pwd|key|credential|auth|cookie|session|private)")


def redacted_environment(environ: dict[str, str]) -> str:
    """The environment, sorted, with secret-looking names' values and URL credentials hidden."""
    lines = []
    for name in sorted(environ):
        value = environ[name]
        value = "***" if _SECRET_NAME.search(name) else log.redact(value)
        lines.append(f"{name}={value}")
    return "\n".join(lines) + "\n"


def evidence(engine, out_dir: Path, image: str | None, container: str | None,
             smi_file: Path | None = None, environ: dict[str, str] | None = None) -> tuple[Path, dict]:
    """Collect everything into one timestamped tar.gz with a manifest; never fails for a missing part."""
    now = dt.datetime.now(dt.timezone.utc)
    files: dict[str, str] = {}
    manifest: dict = {"created": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "captured": [], "missing": {}}

    def capture(name: str, produce) -> None:
        try:
            files[name] = produce()
            manifest["captured"].append(name)
        except (BuilderError, OSError, subprocess.SubprocessError, ValueError) as exc:
            manifest["missing"][name] = log.redact(getattr(exc, "message", None) or str(exc))

    capture("date-utc.txt", lambda: now.strftime("%a %b %d %H:%M:%S UTC %Y") + "\n")

    def smi() -> str:
        text, source = read_nvidia_smi(smi_file)
        if text is None:
            raise OSError(source)
        return text

    capture("nvidia-smi.txt", smi)
    described: dict = {}

    def docker(name: str) -> str:
        if not described:
            described.update(engine.describe())  # one `docker version` and one `docker info`
        return described[name]

    capture("docker-version.txt", lambda: docker("docker-version"))
    capture("docker-info.txt", lambda: docker("docker-info"))
    if image:
        capture("image-inspect.json", lambda: engine.image_inspect(image))

        def vllm() -> str:
            doc = json.loads(files["image-inspect.json"])[0] if "image-inspect.json" in files else {}
            labels = (doc.get("Config") or {}).get("Labels") or {}
            keys = (contract.OCI_VERSION, contract.OCI_REVISION, contract.OCI_SOURCE, contract.LABEL_CUDA,
                    contract.LABEL_EXPIRES, contract.LABEL_OWNER)
            if not labels:
                raise ValueError("no labels (image not inspected)")
            return "".join(f"{k}={labels.get(k, '(absent)')}\n" for k in keys) + \
                f"repo_digests={','.join(doc.get('RepoDigests') or [])}\n"

        capture("vllm-version.txt", vllm)
    capture("environment.txt", lambda: redacted_environment(environ if environ is not None else dict(os.environ)))
    if container:
        capture("container.log", lambda: log.redact(engine.container_logs(container)))
    manifest["image"] = image
    manifest["container"] = container
    files["manifest.json"] = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    buf = io.BytesIO()
    stem = f"k3-evidence-{now.strftime('%Y%m%dT%H%M%SZ')}"
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in sorted(files):
            data = files[name].encode("utf-8", "replace")
            info = tarfile.TarInfo(f"{stem}/{name}")
            info.size = len(data)
            info.mtime = int(now.timestamp())
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    path = out_dir / f"{stem}.tar.gz"
    atomic_write(path, buf.getvalue())
    return path, manifest

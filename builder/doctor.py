"""`build doctor`, for the operator of an r575 host before anyone changes a launch flag: does
this image start on this host, and if not, which route applies. Works with no GPU and no
nvidia-smi (it says what is missing); `build evidence` (builder/evidence.py) saves the state.
"""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from builder import compat, contract
from builder.errors import ConfigError
from builder.fsutil import read_regular


MAX_SMI_BYTES = 1 << 20  # `nvidia-smi -q` for 8 GPUs is ~100 KB


def read_nvidia_smi(path: Path | None) -> tuple[str | None, str]:
    """(output, where from): a captured file, or `nvidia-smi` when it is installed, or nothing."""
    if path is not None:
        data = read_regular(path, MAX_SMI_BYTES, "a captured nvidia-smi output")
        return data.decode("utf-8", "replace"), str(path)
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
    keys = contract.keys_in(labels)
    found = compat.image_cuda(labels, env, keys.cuda)
    if found is None:
        raise ConfigError(f"{image}: no CUDA version in its labels ({keys.cuda}) or env "
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
    keys = contract.keys_in(labels)
    raw = labels.get(keys.expires)
    if raw is None:
        return None
    try:
        expires = dt.date.fromisoformat(raw)
    except ValueError:
        return f"expiry label {keys.expires}={raw!r} is not a date"
    owner = labels.get(keys.owner, "its owner")
    if expires < today:
        return f"EXPIRED on {raw}: this bridge build is past its exit date; ask {owner}"
    return f"expires {raw} ({(expires - today).days} days left; owner {owner})"

"""NVIDIA's own tools from PyPI for the tests that read GPU code: NVRTC 12.9.86 (the smoke's device
compiler, its build lock's pin) and cuobjdump 13.5.37 (NVIDIA's reader; it lists 12.x fat binaries).
Downloaded once by sha256 into the tool's cache and unpacked; a test skips, saying why, when PyPI
is out of reach."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from builder.deps.hermetic import hermetic_env
from builder.fsutil import cache_dir

WHEELS = {
    "nvidia-cuda-nvrtc-cu12==12.9.86": "210cf05005a447e29214e9ce50851e83fc5f4358df8b453155d5e1918094dcb4",
    "nvidia-cuda-cuobjdump==13.5.37": "38780fee50863252a0b8926357faa91615ca1c8346490563f33a06100cd73f58",
}


def unpacked() -> Path:
    """The directory holding the unpacked wheels (``nvidia/cuda_nvrtc``, ``nvidia/cu13/bin``)."""
    root = cache_dir() / "test-wheels" / "nvidia-tools"
    done = root / ".unpacked"
    if not done.exists():
        root.mkdir(parents=True, exist_ok=True)
        req = root / "requirements.txt"
        req.write_text("".join(f"{spec} --hash=sha256:{digest}\n" for spec, digest in WHEELS.items()))
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes"]
            + ["--only-binary", ":all:", "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux_2_12_x86_64"]
            + ["-r", str(req), "-d", str(root)],
            env=hermetic_env(),
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            pytest.skip(f"PyPI's NVRTC and cuobjdump wheels could not be downloaded: {proc.stderr.strip()[-200:]}")
        for wheel in root.glob("*.whl"):
            with zipfile.ZipFile(wheel) as z:
                z.extractall(root / "site")
        (root / "site" / "nvidia" / "cu13" / "bin" / "cuobjdump").chmod(0o755)
        done.touch()
    return root / "site"


def cuobjdump(site: Path, *args: str) -> str:
    proc = subprocess.run([str(site / "nvidia" / "cu13" / "bin" / "cuobjdump"), *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout

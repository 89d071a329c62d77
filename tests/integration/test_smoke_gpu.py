"""The built smoke image carries the GPU code its build was asked for: NVIDIA's cuobjdump (PyPI)
lists the fat binary in k3smoke._C and the standalone cubins beside it, taken out of the image."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests import nvidia_tools

SITE = "/opt/k3/venv/lib/python3.11/site-packages"


@pytest.fixture(scope="module")
def package(built, tmp_path_factory) -> Path:
    """k3smoke/ copied out of the built image."""
    _, ref = built
    dest = tmp_path_factory.mktemp("image-k3smoke")
    cid = subprocess.run(["docker", "create", ref], capture_output=True, text=True, check=True).stdout.strip()
    try:
        subprocess.run(["docker", "cp", f"{cid}:{SITE}/k3smoke", str(dest)], capture_output=True, check=True)
    finally:
        subprocess.run(["docker", "rm", cid], capture_output=True)
    return dest / "k3smoke"


def test_the_image_extension_carries_the_selected_cubins_and_ptx(package):
    site = nvidia_tools.unpacked()
    (so,) = package.glob("_C.*.so")
    listing = nvidia_tools.cuobjdump(site, "-lelf", "-lptx", str(so))
    found = re.findall(r"^(ELF|PTX) file\s+\d+: \S+\.\d+\.(\w+)\.(?:cubin|ptx)$", listing, re.M)
    assert sorted(found) == sorted(
        [
            ("ELF", "sm_80"),
            ("PTX", "sm_80"),
            ("ELF", "sm_90a"),
            ("ELF", "sm_90a"),
            ("ELF", "sm_100"),
            ("ELF", "sm_100a"),
        ]
        + [("ELF", "sm_103")]  # cuobjdump -lelf names sm_103f so; the dump below says sm_103f
    ), listing
    archs = re.findall(r"Fatbin (?:elf|ptx) code:\s*=+\s*arch = (\w+)", nvidia_tools.cuobjdump(site, str(so)))
    assert "sm_103f" in archs and "sm_100a" in archs, archs


def test_the_image_ships_standalone_cubins_beside_the_extension(package):
    site = nvidia_tools.unpacked()
    cubins = sorted(p.name for p in (package / "cubins").glob("*.cubin"))
    assert cubins == [
        "fused_add_rms_norm.sm_100a.cubin", "fused_add_rms_norm.sm_103f.cubin", "fused_add_rms_norm.sm_90a.cubin",
        "rms_norm.sm_100.cubin", "rms_norm.sm_80.cubin", "rms_norm.sm_90a.cubin",
    ]  # fmt: skip
    for name in cubins:
        listing = nvidia_tools.cuobjdump(site, "-lelf", str(package / "cubins" / name))
        assert listing.startswith("ELF file    1:"), listing

"""The GPU-code checks on real images: thin ``FROM <built smoke>`` variants that carry real GPU code
(a fatbin of NVRTC 12.9 cubins and PTX in an extension's .nv_fatbin, as nvcc lays it out) and one
defect each, checked under a copy of the smoke matrix with a ``gpu`` block of its own. Each fails
exactly its check: PTX of ISA 9.0 and a cubin of CUDA 13 (both made by nvcc 13 here), a required
extension lacking B300 (10.3), and Triton's bundled ptxas being CUDA 13's with no override."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from builder.config import contract
from tests.integration.conftest import check_images, variant_images
from tests.integration.test_checks import SITE, _failed
from tests.unit import gpuassets

FATBINARY = gpuassets.NVCC13.parent / "fatbinary"
PTXAS13 = gpuassets.NVCC13.parent / "ptxas"
# What the variants' matrix claims: B300 (10.3) is served by the family cubin sm_100f.
GPU = {
    "families": {"8.0": "A100", "9.0": "H100, H200", "10.0": "B200", "10.3": "B300"},
    "required": {"k3gpu._C": "all"},
    "driver_floor": "575.51.03",
}
LABELS = (
    f'LABEL "{contract.LABEL_DRIVER_FLOOR}"="{GPU["driver_floor"]}" '
    f'"{contract.LABEL_GPU_FAMILIES}"="{" ".join(GPU["families"])}"'
)
EXT = f"{SITE}/k3gpu/_C.abi3.so"
UNSET = 'ENV TRITON_PTXAS_PATH="" TRITON_PTXAS_BLACKWELL_PATH=""'
# name: (Dockerfile lines after FROM <smoke> and the labels, the check that fails, text in its message)
VARIANTS = {
    "ptx-isa-9": (f"COPY good.so {EXT}\nCOPY k3_isa9.ptx {SITE}/k3gpu/kernels/k3.ptx", "gpu_code", "PTX ISA 9.0"),
    "cubin-cuda-13": (
        f"COPY good.so {EXT}\nCOPY k3_sm_90_cuda13.cubin {SITE}/k3gpu/kernels/k3_sm_90.cubin",
        "gpu_code",
        "built by CUDA 13.0 (tkinfo), not CUDA 12",
    ),
    "no-b300": (f"COPY no_b300.so {EXT}", "gpu_coverage", "k3gpu._C on 10.3 (B300): none (has"),
    "ptxas-13": (
        f"COPY good.so {EXT}\nCOPY ptxas {SITE}/triton/backends/nvidia/bin/ptxas\n{UNSET}",
        "gpu_code",
        "newer than CUDA 12.9",
    ),
}


def with_gpu(text: str) -> str:
    """The smoke matrix with the variants' ``gpu`` block (replacing any the smoke has)."""
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    doc = yaml.safe_load(text)
    doc["targets"]["smoke"]["gpu"] = GPU
    # The variants' files are dropped in by hand (no RECORD lists them) and the stand-in extension is
    # a bare shared object (no PyInit): the whole-image checks are waived for exactly those paths, so
    # each variant fails only the GPU-code check it is about.
    why = "a GPU-code test variant's file, copied in by hand"
    doc["targets"]["smoke"].setdefault("runtime", {})["waivers"] = {
        "installed_files": {f"{SITE}/k3gpu/*": why, f"{SITE}/triton/*": why},
        "everything_loads": {f"{SITE}/k3gpu/*": why},
    }
    return header + yaml.safe_dump(doc, sort_keys=False, width=4096)


def _extension(out: Path, images: list[tuple[str, str, bytes]], work: Path) -> None:
    """A shared object whose .nv_fatbin holds ``images`` (kind, sm, bytes) packed by fatbinary."""
    args = []
    for i, (kind, sm, data) in enumerate(images):
        path = work / f"image{i}.{kind}"
        path.write_bytes(data)
        args.append(f"--image3=kind={kind},sm={sm},file={path}")
    fatbin = work / "k3.fatbin"
    subprocess.run([str(FATBINARY), f"--create={fatbin}", "-64", *args], check=True, capture_output=True)
    (work / "stub.c").write_text("int k3gpu_fn(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(work / "stub.so"), str(work / "stub.c")], check=True)
    subprocess.run(
        ["objcopy", "--add-section", f".nv_fatbin={fatbin}", str(work / "stub.so"), str(out)],
        check=True,
        capture_output=True,
    )


def _context(context: Path) -> None:
    if not FATBINARY.exists() or not shutil.which("objcopy"):
        pytest.skip(f"needs the CUDA 13 toolkit at {FATBINARY.parent.parent} and objcopy")
    work = context / "work"
    work.mkdir()
    sass = {arch: gpuassets.nvrtc(f"sm_{arch}") for arch in ("80", "90a", "100f", "100a")}
    ptx = gpuassets.nvrtc("compute_90a", ptx=True)  # ISA 8.8: the floor 575.51.03, exact
    good = [("elf", "80", sass["80"]), ("elf", "90a", sass["90a"]), ("elf", "100f", sass["100f"]), ("ptx", "90a", ptx)]
    _extension(context / "good.so", good, work)
    _extension(context / "no_b300.so", [*good[:2], ("elf", "100a", sass["100a"]), good[3]], work)
    gpuassets.nvcc13(work / "isa9.ptx", "-ptx", "-arch=compute_90")
    shutil.copy(work / "isa9.ptx", context / "k3_isa9.ptx")
    gpuassets.nvcc13(work / "k3.cubin", "-cubin", "-arch=sm_90")
    shutil.copy(work / "k3.cubin", context / "k3_sm_90_cuda13.cubin")
    shutil.copy(PTXAS13, context / "ptxas")
    shutil.rmtree(work)


@pytest.fixture(scope="module")
def gpu_variants(built, tmp_path_factory):
    """Every GPU variant built and checked once, side by side: the `build test` runs by name."""
    smoke, ref = built
    work = smoke.variant(tmp_path_factory.mktemp("gpu") / "work", "gpu", with_gpu)
    context = tmp_path_factory.mktemp("gpu-context")
    _context(context)
    bodies = {name: f"{LABELS}\n{lines}" for name, (lines, _, _) in VARIANTS.items()}
    tags = variant_images(ref, bodies, smoke.repository.rsplit("-", 1)[-1], context)
    yield check_images(work.matrix, tags)
    subprocess.run(["docker", "image", "rm", "-f", *tags.values()], capture_output=True)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_gpu_variant_fails_exactly_its_check(gpu_variants, name):
    _, check, text = VARIANTS[name]
    r = gpu_variants[name]
    assert r.code == 1, r.err[-3000:]
    failed = _failed(r.err)
    assert set(failed) == {check}, r.err[-3000:]
    assert text in failed[check] and failed[check].startswith("expected"), failed
    assert re.search(r"^\s+pass\s+gpu_(code|coverage)", r.err, re.M), r.err[-3000:]  # the other one ran and held

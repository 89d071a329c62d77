"""`build vet` on real images (issue 37): the demo image passes with its n/a rows listed, and a small
stand-in for upstream's broken cu129 image (vLLM #56829: CUDA 13 pieces beside cu129 ones) gets a
scorecard that names each defect, with no traceback.

The stand-in is the demo image plus PyPI's real CUDA 13 runtime wheel (libcudart.so.13, hash-checked,
2.2 MB) and two dist-infos shaped like #56829's: torch 2.13.0+cu130 beside a torchvision built for
torch 2.13.0+cu129. It reuses the session's `built` image; nothing else is built.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from builder.config import contract
from builder.deps.hermetic import hermetic_env
from tests.integration.conftest import cli

SITE = "/opt/k3/venv/lib/python3.11/site-packages"
CUDART_13 = (
    "nvidia-cuda-runtime==13.0.96 --hash=sha256:7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548"
)


def _dist_info(root: Path, name: str, version: str, requires: list[str]) -> None:
    """A dist-info as an installer leaves it: METADATA and a RECORD that hashes it."""
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    meta = "".join(
        [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", *(f"Requires-Dist: {r}\n" for r in requires)]
    )
    (info / "METADATA").write_text(meta)
    digest = base64.urlsafe_b64encode(hashlib.sha256(meta.encode()).digest()).rstrip(b"=").decode()
    (info / "RECORD").write_text(f"{info.name}/METADATA,sha256={digest},{len(meta.encode())}\n{info.name}/RECORD,,\n")


@pytest.fixture(scope="module")
def standin(built, tmp_path_factory):
    """The demo image with #56829's CUDA 13 pieces, loaded into the engine under a tag of its own."""
    smoke, ref = built
    context = tmp_path_factory.mktemp("vet-standin")
    (context / "req.txt").write_text(CUDART_13 + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes", "--only-binary", ":all:"]
        + ["--platform", "manylinux_2_17_x86_64", "--python-version", "3.11", "-r", str(context / "req.txt")]
        + ["-d", str(context / "wheel")],
        check=True,
        env=hermetic_env(),
        capture_output=True,
    )
    site = context / "site"
    with zipfile.ZipFile(next((context / "wheel").glob("nvidia_cuda_runtime-13.0.96-*.whl"))) as z:
        z.extractall(site)  # as pip installs it: the files and the dist-info with their RECORD
    _dist_info(site, "torch", "2.13.0+cu130", ["nvidia-cuda-runtime==13.0.96"])
    _dist_info(site, "torchvision", "0.28.0+cu129", ["torch==2.13.0+cu129"])
    (context / "Dockerfile").write_text(f"FROM {ref}\nCOPY site/ {SITE}/\n")
    tag = f"k3-vet-standin:{smoke.repository.rsplit('-', 1)[-1]}"
    subprocess.run(
        ["docker", "buildx", "build", "--load", "-q", "-t", tag, str(context)], check=True, capture_output=True
    )
    yield smoke, tag
    subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)


def _vet(smoke, image: str, *extra: str) -> tuple[int, dict, str]:
    r = cli("--matrix", str(smoke.matrix), "vet", "--target", "smoke", "--image", image, "--json", *extra)
    assert "Traceback" not in r.err, r.err[-3000:]
    return r.code, json.loads(r.out), r.err


def test_the_demo_image_is_fit_with_its_na_rows_listed(built):
    smoke, ref = built
    code, doc, err = _vet(smoke, ref)
    assert code == 0, err[-3000:]
    assert doc["fit"] and doc["pinned"] == ref and doc["prefix"] == "/opt/k3/venv"
    rows = {c["name"]: c for c in doc["checks"]}
    assert set(rows) == set(contract.CHECKS)
    for name, why in contract.VET_NOT_APPLICABLE.items():
        assert rows[name]["status"] == "n/a" and rows[name]["finding"].endswith(why), rows[name]
    failed = {n: c["finding"] for n, c in rows.items() if c["status"] == "fail"}
    assert not failed, failed
    for name in ("cuda_runtime", "no_other_cuda_major", "shared_libraries", "recipe_cli", "pip_check"):
        assert rows[name]["status"] == "pass", rows[name]


def test_a_standin_for_upstreams_cu129_image_names_each_defect(standin):
    smoke, tag = standin
    code, doc, err = _vet(smoke, tag)
    assert code == 1, err[-3000:]
    assert not doc["fit"]
    failed = {c["name"]: c["finding"] for c in doc["checks"] if c["status"] == "fail"}
    other = failed.get("no_other_cuda_major", "")
    # each CUDA 13 piece named: the library, its wheel, and the torch build
    assert "libcudart.so.13" in other and "torch 2.13.0+cu130" in other and "nvidia-cuda-runtime 13.0.96" in other
    # #56829's symptom: torchvision built for cu129 torch beside a cu130 torch
    assert "torchvision 0.28.0+cu129 has requirement torch==2.13.0+cu129" in failed.get("pip_check", ""), failed
    # a second CUDA runtime that reports CUDA 13, not 12.9
    assert "reports 13000" in failed.get("loaded_libraries", ""), failed
    assert set(failed) <= {"no_other_cuda_major", "pip_check", "loaded_libraries"} | set(contract.VET_ADVISORY), failed
    deciding = [n for n in contract.CHECKS if n in failed and n not in contract.VET_ADVISORY]
    assert f"NOT fit for smoke's hosts: {', '.join(deciding)} failed" in doc["verdict"]

"""doctor, evidence and compare against real images and containers."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile

import pytest

from tests.conftest import REPO
from tests.integration.conftest import cli

SMI = REPO / "tests" / "fixtures" / "nvidia-smi"


# r550 on an L4 (8.9, covered by the smoke's generic sm_80 SASS) is below the smoke's driver floor:
# its PTX is ISA 8.8, which only a 12.9 driver (575.51.03) JIT-compiles, so doctor refuses it.
@pytest.mark.parametrize(
    "sample,code", [("r575-h100.txt", 0), ("r550-l4.txt", 1), ("no-gpu.txt", 1), ("garbage.txt", 2)]
)
def test_doctor_exit_codes_on_the_smoke_image(built, sample, code):
    smoke, ref = built
    r = cli("--matrix", str(smoke.matrix), "doctor", "--target", "smoke", "--nvidia-smi-file", str(SMI / sample))
    assert r.code == code, r.err
    if code != 2:
        assert ref in r.out.splitlines()[0] and "expires" in r.out


@pytest.fixture()
def variant(built):
    smoke, ref = built
    tag = f"k3-compare-variant:{smoke.repository.rsplit('-', 1)[-1]}"
    site = "/opt/k3/venv/lib/python3.11/site-packages"
    dockerfile = (
        f"FROM {ref}\nUSER 0\nRUN mkdir {site}/extra_pkg-2.0.dist-info && printf "
        f"'Metadata-Version: 2.1\\nName: extra-pkg\\nVersion: 2.0\\n' > {site}/extra_pkg-2.0.dist-info/METADATA"
        f'\nUSER 2000:2000\nLABEL "io.k3-cu129.owner"="someone-else@example.org"\n'
    )
    subprocess.run(
        ["docker", "buildx", "build", "--load", "-q", "-t", tag, "-"],
        input=dockerfile,
        text=True,
        capture_output=True,
        check=True,
    )
    yield smoke, ref, tag
    subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)


def test_compare_reports_the_known_differences(variant):
    smoke, ref, tag = variant
    r = cli("--matrix", str(smoke.matrix), "compare", "--target", "smoke", "--against", tag, "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["ours"] == ref
    assert doc["python distributions"]["only_reference"] == [["extra-pkg", "2.0"]]
    assert doc["python distributions"]["only_ours"] == [] and doc["python distributions"]["changed"] == []
    assert doc["labels"]["changed"] == [["io.k3-cu129.owner", "gpu-platform@example.org", "someone-else@example.org"]]
    assert doc["os packages"]["changed"] == [] and doc["os packages"]["same"] > 50
    assert doc["cuda"]["same"] == 1
    summary = cli("--matrix", str(smoke.matrix), "compare", "--target", "smoke", "--against", tag).out
    assert "python distributions: " in summary and "1 only in the reference" in summary
    assert "extra-pkg" not in summary  # the summary counts; --all lists
    text = cli("--matrix", str(smoke.matrix), "compare", "--target", "smoke", "--against", tag, "--all").out
    assert "- extra-pkg 2.0 (only in the reference)" in text


def test_evidence_bundle_from_a_real_container(built, tmp_path):
    smoke, ref = built
    name = f"k3-evidence-{smoke.repository.rsplit('-', 1)[-1]}"
    # On a GPU host the container runtime injects libcuda.so.1; here the base's compat copy stands in.
    subprocess.run(
        ["docker", "run", "--name", name, "-e", "LD_LIBRARY_PATH=/usr/local/cuda/compat", ref],
        capture_output=True,
        check=True,
    )
    try:
        env = dict(os.environ, HF_TOKEN="hf_evidence_secret_123", INDEX_URL="https://u:pw-evidence@example.org/s")
        r = cli(
            "evidence",
            "--image",
            ref,
            "--container",
            name,
            "--out",
            str(tmp_path),
            "--nvidia-smi-file",
            str(SMI / "r575-h100.txt"),
            env=env,
        )
        assert r.code == 0, r.err
        archive = r.out.strip().splitlines()[-1]
        with tarfile.open(archive) as tar:
            files = {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode() for m in tar.getmembers()}
        manifest = json.loads(files["manifest.json"])
        # What only a GPU/RDMA host has may be missing here (each with why); the smoke image has no NCCL.
        assert set(manifest["missing"]) <= {
            "nvidia-modules.txt",
            "nvidia-driver-version.txt",
            "nvidia-smi-topo.txt",
            "infiniband.txt",
            "ibv_devinfo.txt",
            "nccl-version.txt",
        }
        assert manifest["missing"]["nccl-version.txt"].startswith(f"no NCCL in {ref}: no nvidia-nccl-* distribution")
        assert {
            "date-utc.txt",
            "nvidia-smi.txt",
            "docker-version.txt",
            "docker-info.txt",
            "image-inspect.json",
            "vllm-version.txt",
            "environment.txt",
            "container.log",
            "uname.txt",
            "hostname.txt",
            "containers.txt",
        } <= set(manifest["captured"])
        assert "rms([3, 4]) = 3.5355" in files["container.log"]
        assert "org.opencontainers.image.version=0.1.0" in files["vllm-version.txt"]
        assert ref.split("@")[1] in files["vllm-version.txt"]
        assert "Driver Version: 575.57.08" in files["nvidia-smi.txt"]
        everything = "".join(files.values())
        assert "hf_evidence_secret_123" not in everything and "pw-evidence" not in everything
        assert "HF_TOKEN=***" in files["environment.txt"]
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)

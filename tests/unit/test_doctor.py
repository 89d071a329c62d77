"""doctor on captured nvidia-smi outputs (table and -q formats, no GPU, garbage) and evidence
without Docker: no GPU needed anywhere."""

from __future__ import annotations

import datetime as dt
import json
import tarfile

import pytest

from builder import compat, contract, doctor, evidence
from builder.errors import ConfigError, EngineUnavailable
from tests.conftest import REPO

SMI = REPO / "tests" / "fixtures" / "nvidia-smi"
CU129 = ({contract.LABEL_CUDA: "12.9.1", contract.LABEL_EXPIRES: "2027-06-30", contract.LABEL_OWNER: "o@e.org"}, {})
OFFICIAL = ({}, {"NVIDIA_REQUIRE_CUDA": "cuda>=13.0 brand=unknown,driver>=535", "CUDA_VERSION": "13.0.2"})


def _diag(sample: str, image=CU129, today=dt.date(2026, 11, 29)):
    return doctor.diagnose((SMI / sample).read_text(), sample, image[0], image[1], "img", today)


@pytest.mark.parametrize("sample,driver,cuda,gpus", [
    ("r575-h100.txt", (575, 57, 8), "12.9", ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3")),
    ("r575-q.txt", (575, 51, 3), "12.9", ("NVIDIA RTX 6000 Ada Generation",)),
    ("r580-b200.txt", (580, 95, 5), "13.0", ("NVIDIA B200",)),
    ("r580-q.txt", (580, 82, 7), "13.0", ("NVIDIA H200",)),
    ("r550-l4.txt", (550, 163, 1), "12.4", ("NVIDIA L4",)),
])
def test_parses_both_nvidia_smi_formats(sample, driver, cuda, gpus):
    host = compat.parse_smi((SMI / sample).read_text())
    assert (host.driver, host.cuda, host.gpus) == (driver, cuda, gpus)


def test_csv_query_format():
    host = compat.parse_smi("575.57.08, NVIDIA A100-SXM4-80GB\n575.57.08, NVIDIA A100-SXM4-80GB\n")
    assert host.driver == (575, 57, 8) and len(host.gpus) == 2 and host.data_center


@pytest.mark.parametrize("sample,image,compatible,words", [
    ("r575-h100.txt", CU129, True, "needs driver >= 575.57.08; host has 575.57.08 (r575)"),
    ("r575-q.txt", CU129, True, "minor-version compatibility"),  # 12.9 GA driver, 12.9 U1 image
    ("r550-l4.txt", CU129, True, "minor-version compatibility within CUDA 12.x"),
    ("r580-b200.txt", CU129, True, "host has 580.95.05 (r580)"),
    ("r575-h100.txt", OFFICIAL, False, "CUDA 13.0.2 needs driver >= 580.95.05 (branch r580); host has 575.57.08"),
    ("r580-b200.txt", OFFICIAL, True, "needs driver >= 580.95.05"),
    ("r580-q.txt", OFFICIAL, True, "minor-version compatibility within CUDA 13.x"),
    ("no-gpu.txt", CU129, False, "no usable NVIDIA driver"),
])
def test_verdicts(sample, image, compatible, words):
    d = _diag(sample, image)
    assert d.compatible is compatible
    assert words in d.line and "\n" not in d.line
    assert d.line.startswith("compatible: " if compatible else "INCOMPATIBLE: ")


def test_routes_for_the_official_image_on_r575():
    dc = _diag("r575-h100.txt", OFFICIAL)
    assert "use the cu129 build" in dc.route and "forward compatibility (cuda-compat-13-0) is possible" in dc.route
    ws = _diag("r575-q.txt", OFFICIAL)  # RTX 6000 Ada: a workstation GPU
    assert "use the cu129 build" in ws.route and "data-center GPUs only" in ws.route


def test_expiry_is_reported():
    assert _diag("r575-h100.txt").expiry.startswith("expires 2027-06-30 (213 days left")
    assert _diag("r575-h100.txt", today=dt.date(2027, 7, 1)).expiry.startswith("EXPIRED on 2027-06-30")


def test_garbage_and_unlabelled_images_are_bad_input():
    with pytest.raises(ConfigError, match="no 'Driver Version'"):
        _diag("garbage.txt")
    with pytest.raises(ConfigError, match="no CUDA version"):
        _diag("r575-h100.txt", ({}, {}))


SECRETS = {"HF_TOKEN": "hf_abcdefghijklmnop", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMIK7MDENG",
           "PIP_INDEX_URL": "https://deploy:s3cr3tpass@pypi.internal.example/simple",
           "DB_PASSWORD": "hunter2hunter2", "PATH": "/usr/bin", "MY_API_KEY": "k-123456789"}


def test_evidence_redacts_by_name_value_and_shape():
    env = {"DOCKER_PASS": "plain", "GH_PAT": "ghp_0123456789abcdefghij", "CI_JOB_JWT": "eyJhbGciOi.x.y",
           "HF_HUB_ACCESS": "whatever", "SOME_VAR": "ghp_notanameclue0123456789", "OPAQUE": "a" * 40,
           "WEIRD": "x'y\"z", "LANG": "C.UTF-8", "HOME": "/root"}
    text = evidence.redacted_environment(env)
    for value in ("plain", "ghp_0123456789abcdefghij", "eyJhbGciOi.x.y", "whatever", "ghp_notanameclue",
                  "a" * 40, "x'y"):
        assert value not in text, value
    assert "LANG=C.UTF-8" in text and "HOME=/root" in text


def test_evidence_out_must_be_a_directory(tmp_path):
    (tmp_path / "file").write_text("x")
    for bad in (tmp_path / "file", "/dev/null", "/proc/self"):
        with pytest.raises(ConfigError, match="--out"):
            evidence.evidence(_NoDocker(), __import__("pathlib").Path(bad), None, None, environ={})


def test_environment_is_sorted_and_redacted():
    text = evidence.redacted_environment(SECRETS)
    for value in ("hf_abcdefghijklmnop", "wJalrXUtnFEMIK7MDENG", "s3cr3tpass", "hunter2hunter2", "k-123456789"):
        assert value not in text
    assert "PATH=/usr/bin" in text and "PIP_INDEX_URL=https://***@pypi.internal.example/simple" in text
    names = [line.split("=", 1)[0] for line in text.splitlines()]
    assert names == sorted(names)


class _NoDocker:
    """The engine seam with no Docker behind it."""

    def describe(self):
        raise EngineUnavailable("docker CLI not found")

    def image_inspect(self, ref):
        raise EngineUnavailable("docker CLI not found")

    class containers:
        @staticmethod
        def logs(name):
            raise EngineUnavailable("docker CLI not found")


def test_evidence_without_gpu_nvidia_smi_or_docker(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    path, manifest = evidence.evidence(_NoDocker(), tmp_path, "img:1", "vllm-1", environ=SECRETS)
    assert path.name.startswith("k3-evidence-") and path.suffixes == [".tar", ".gz"]
    assert set(manifest["captured"]) == {"date-utc.txt", "environment.txt"}
    assert set(manifest["missing"]) == {"nvidia-smi.txt", "docker-version.txt", "docker-info.txt",
                                        "image-inspect.json", "vllm-version.txt", "container.log"}
    assert manifest["missing"]["nvidia-smi.txt"] == "nvidia-smi not installed"
    with tarfile.open(path) as tar:
        names = sorted(m.name.split("/", 1)[1] for m in tar.getmembers())
        blob = b"".join(tar.extractfile(m).read() for m in tar.getmembers())
    assert names == ["date-utc.txt", "environment.txt", "manifest.json"]
    for value in SECRETS.values():
        if value != "/usr/bin":
            assert value.encode() not in blob
    assert json.loads(blob[blob.index(b"{"):].decode())  # the manifest is JSON


def test_evidence_with_a_captured_smi(tmp_path):
    _, manifest = evidence.evidence(_NoDocker(), tmp_path, None, None, SMI / "r575-h100.txt", environ={})
    assert "nvidia-smi.txt" in manifest["captured"]

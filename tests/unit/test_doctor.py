"""doctor on captured nvidia-smi outputs (table and -q formats, no GPU, garbage) and evidence
without Docker: no GPU needed anywhere."""

from __future__ import annotations

import datetime as dt
import json
import tarfile

import pytest

from builder import compat, contract, doctor, evidence, log
from builder.errors import ConfigError, EngineUnavailable
from tests.conftest import REPO


@pytest.fixture(autouse=True)
def no_registered_secrets(monkeypatch):
    """Values another test registered for redaction (process-wide) must not shape these outputs."""
    monkeypatch.setattr(log, "_secrets", set())


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


def test_expiry_boundaries_and_odd_labels():
    labels = {contract.LABEL_EXPIRES: "2027-06-30", contract.LABEL_OWNER: "o@e.org"}
    assert doctor._expiry(labels, dt.date(2027, 6, 30)) == "expires 2027-06-30 (0 days left; owner o@e.org)"
    assert doctor._expiry(labels, dt.date(2027, 6, 29)) == "expires 2027-06-30 (1 days left; owner o@e.org)"
    assert doctor._expiry(labels, dt.date(2027, 7, 1)) == (
        "EXPIRED on 2027-06-30: this bridge build is past its exit date; ask o@e.org")
    assert doctor._expiry({contract.LABEL_EXPIRES: "2027-06-30"}, dt.date(2027, 7, 1)).endswith("ask its owner")
    assert doctor._expiry({}, dt.date(2027, 7, 1)) is None
    assert doctor._expiry({contract.LABEL_EXPIRES: "soon"}, dt.date(2027, 7, 1)) == (
        "expiry label io.k3-cu129.expires='soon' is not a date")


def test_the_diagnosis_records_its_facts():
    d = _diag("r575-h100.txt")
    assert d.line == "compatible: img: CUDA 12.9.1 needs driver >= 575.57.08; host has 575.57.08 (r575)"
    assert d.route == "run the image as it is"
    assert d.facts == {"image": "img", "image_cuda": "12.9.1", "image_cuda_from": "label io.k3-cu129.cuda-version",
                       "host_driver": "575.57.08", "host_branch": "r575", "host_cuda": "12.9",
                       "gpus": ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"], "data_center": True,
                       "nvidia_smi": "r575-h100.txt"}
    official = _diag("r575-h100.txt", OFFICIAL)
    assert official.facts["image_cuda_from"] == "env CUDA_VERSION" and official.facts["image_cuda"] == "13.0.2"
    assert official.expiry is None  # the official image carries no expiry label


def test_no_nvidia_smi_at_all_is_a_verdict_not_an_error():
    d = doctor.diagnose(None, "nvidia-smi not installed", CU129[0], CU129[1], "img", dt.date(2026, 11, 29))
    assert not d.compatible and d.line.startswith("INCOMPATIBLE: img: image needs CUDA 12.9.1")
    assert "(nvidia-smi not installed)" in d.line and d.route.startswith("install a driver")
    assert d.facts["host_driver"] == "none" and d.facts["gpus"] == []


def test_an_unreadable_image_cuda_version_is_bad_input():
    with pytest.raises(ConfigError, match=r"img: label io.k3-cu129.cuda-version: not a CUDA version: 'twelve'"):
        _diag("r575-h100.txt", ({contract.LABEL_CUDA: "twelve"}, {}))


def test_read_nvidia_smi_from_a_file_or_the_path(tmp_path, monkeypatch):
    text, where = doctor.read_nvidia_smi(SMI / "r575-h100.txt")
    assert where == str(SMI / "r575-h100.txt") and "Driver Version: 575.57.08" in text
    odd = tmp_path / "latin1.txt"
    odd.write_bytes(b"Driver Version: 575.57.08 \xe9\n")  # not UTF-8: read anyway, replaced
    assert doctor.read_nvidia_smi(odd)[0] == "Driver Version: 575.57.08 \ufffd\n"
    with pytest.raises(ConfigError) as info:
        doctor.read_nvidia_smi(tmp_path)  # a directory
    assert info.value.message == f"{tmp_path}: not a regular file (a captured nvidia-smi output)"
    monkeypatch.setenv("PATH", str(tmp_path))
    assert doctor.read_nvidia_smi(None) == (None, "nvidia-smi not installed")
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'Driver Version: 575.57.08'\necho oops >&2\n")
    fake.chmod(0o755)
    text, where = doctor.read_nvidia_smi(None)
    assert where == str(fake) and text == "Driver Version: 575.57.08\noops\n"


def test_garbage_and_unlabelled_images_are_bad_input():
    with pytest.raises(ConfigError, match="no 'Driver Version'"):
        _diag("garbage.txt")
    with pytest.raises(ConfigError) as info:
        _diag("r575-h100.txt", ({}, {}))
    assert info.value.message == ("img: no CUDA version in its labels (io.k3-cu129.cuda-version) or env "
                                  "(CUDA_VERSION, NVIDIA_REQUIRE_CUDA); is it a CUDA image?")


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


def test_nvidia_smi_gets_a_minute_at_most(tmp_path, monkeypatch):
    # A hung driver must not hang `build doctor`: the call carries its timeout.
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    seen = {}

    def run(cmd, **kwargs):
        seen.update(kwargs, cmd=cmd)
        return __import__("subprocess").CompletedProcess(cmd, 0, "out\n", "err\n")

    monkeypatch.setattr(doctor.subprocess, "run", run)
    assert doctor.read_nvidia_smi(None) == ("out\nerr\n", str(fake))
    assert seen == {"cmd": [str(fake)], "capture_output": True, "text": True, "timeout": 60}

"""doctor on captured nvidia-smi outputs (table and -q formats, no GPU, garbage) and evidence
without Docker: no GPU needed anywhere."""

from __future__ import annotations

import datetime as dt
import json
import tarfile

import pytest

from builder import log
from builder.config import contract
from builder.errors import ConfigError, EngineUnavailable
from builder.host import compat, decisionmd, doctor, evidence
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


@pytest.mark.parametrize(
    "sample,driver,cuda,gpus",
    [
        ("r575-h100.txt", (575, 57, 8), "12.9", ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3")),
        ("r575-q.txt", (575, 51, 3), "12.9", ("NVIDIA RTX 6000 Ada Generation",)),
        ("r580-b200.txt", (580, 95, 5), "13.0", ("NVIDIA B200",)),
        ("r580-q.txt", (580, 82, 7), "13.0", ("NVIDIA H200",)),
        ("r550-l4.txt", (550, 163, 1), "12.4", ("NVIDIA L4",)),
    ],
)
def test_parses_both_nvidia_smi_formats(sample, driver, cuda, gpus):
    host = compat.parse_smi((SMI / sample).read_text())
    assert (host.driver, host.cuda, host.gpus) == (driver, cuda, gpus)


# Real captures (tests/fixtures/nvidia-smi/SOURCES.md names where each comes from): what each reads as.
H100, B2080 = "NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 2080 SUPER"


@pytest.mark.parametrize(
    "sample,driver,cuda,gpus,platform,form",
    [
        (
            "r610-rtx2080s-table.txt",
            (610, 57, 4),
            "13.3",
            ("NVIDIA GeForce RTX 2080 ...",),
            "linux",
            "table",
        ),  # KMD header
        ("r610-b200-table.txt", (610, 43, 2), "13.3", ("NVIDIA B200",) * 2, "linux", "table"),
        ("r610-rtx2080s-q.txt", (610, 57, 4), "13.3", (B2080,), "linux", "query"),  # "[Deprecated ...]" lines
        ("r610-rtx2080s-version.txt", (610, 57, 4), "13.3", (), "linux", "version"),  # KMD version
        ("r590-h100-version.txt", (590, 48, 1), "13.1", (), "linux", "version"),  # the older DRIVER version
        ("r610-rtx2080s-query.csv", (610, 57, 4), None, (B2080,), "linux", "csv"),  # 241 columns
        ("r565-8xh100-table.txt", (565, 57, 1), "12.7", (H100,) * 8, "linux", "table"),
        ("r590-h100-mig-table.txt", (590, 48, 1), "13.1", (H100,), "linux", "table"),
        ("r595-l40s-table.txt", (595, 80), "13.2", ("NVIDIA L40S",), "linux", "table"),  # two-part, Linux
        ("r410-cuda-na-table.txt", (410, 78), None, ("GeForce GTX 108...",), "linux", "table"),
        ("win-r610-rtx2080s-table.txt", (610, 62), "13.3", ("NVIDIA GeForce RTX 2080 ...",), "windows", "table"),
        ("win-r591-rtx2080s-q.txt", (591, 86), "13.1", (B2080,), "windows", "query"),
        ("wsl-r555-rtx4070-table.txt", (555, 99), "12.5", ("NVIDIA GeForce RTX 4070 ...",), "wsl", "table"),
        ("wsl-r546-cuda-err-table.txt", (546, 80), None, ("NVIDIA GeForce RTX 3060 ...",), "wsl", "table"),
    ],
)
def test_every_real_capture_form(sample, driver, cuda, gpus, platform, form):
    host = compat.parse_smi((SMI / sample).read_text())
    assert (host.driver, host.cuda, host.gpus, host.platform, host.form, host.fault) == (
        driver,
        cuda,
        gpus,
        platform,
        form,
        None,
    )


@pytest.mark.parametrize(
    "sample,fault,nvml",
    [
        ("nvml-mismatch-570.txt", "nvml-mismatch", "570.124"),
        ("nvml-mismatch-ci-log.txt", "nvml-mismatch", "550.144"),  # a CI log's "CUDA Version" banner around it
        ("nvml-mismatch.txt", "nvml-mismatch", None),
        ("no-libnvidia-ml.txt", "no-nvml-library", None),
        ("no-driver-wsl.txt", "no-driver", None),
        ("no-devices.txt", "no-devices", None),
    ],
)
def test_every_real_failure_capture(sample, fault, nvml):
    host = compat.parse_smi((SMI / sample).read_text())
    assert (host.driver, host.fault, host.nvml, host.gpus) == (None, fault, nvml, ())


def test_the_mig_table_counts_its_mig_devices():
    d = _diag("r590-h100-mig-table.txt")
    assert d.facts["mig_devices"] == 4 and d.facts["gpus"] == [H100]
    assert d.notes == ["MIG is on: 4 MIG devices; each runs the image with its GPU's driver"]


def test_nvidia_smi_L_is_a_verdict_naming_the_capture_to_make():
    d = _diag("r590-h100-mig-L.txt")
    assert (d.compatible, d.name, d.facts["gpus"]) == (False, "driver-unknown", [H100])
    assert d.reason == (
        "image needs CUDA 12.9.1; `nvidia-smi -L` output (1 GPUs, 4 MIG devices) names no "
        "driver version; capture `nvidia-smi` or `nvidia-smi -q` instead"
    )
    assert d.route == "capture `nvidia-smi` (or `nvidia-smi -q`) on the host and run doctor on it"
    doc = doctor.decision(d, CU129[0], None, None, dt.datetime(2026, 11, 29, tzinfo=dt.timezone.utc))
    assert doc["chosen"] is None and doc["chosen_why"].startswith("no path until this is resolved (driver-unknown)")


def test_csv_query_format():
    host = compat.parse_smi("575.57.08, NVIDIA A100-SXM4-80GB\n575.57.08, NVIDIA A100-SXM4-80GB\n")
    assert host.driver == (575, 57, 8) and len(host.gpus) == 2 and host.data_center


@pytest.mark.parametrize(
    "sample,image,compatible,words",
    [
        ("r575-h100.txt", CU129, True, "needs driver >= 575.57.08; host has 575.57.08 (r575)"),
        ("r575-q.txt", CU129, True, "minor-version compatibility"),  # 12.9 GA driver, 12.9 U1 image
        ("r550-l4.txt", CU129, True, "minor-version compatibility within CUDA 12.x"),
        ("r580-b200.txt", CU129, True, "host has 580.95.05 (r580)"),
        ("r575-h100.txt", OFFICIAL, False, "CUDA 13.0.2 needs driver >= 580.95.05 (branch r580); host has 575.57.08"),
        ("r580-b200.txt", OFFICIAL, True, "needs driver >= 580.95.05"),
        ("r580-q.txt", OFFICIAL, True, "minor-version compatibility within CUDA 13.x"),
        ("no-gpu.txt", CU129, False, "no usable NVIDIA driver"),
        # real captures (SOURCES.md)
        ("r610-rtx2080s-table.txt", OFFICIAL, True, "CUDA 13.0.2 needs driver >= 580.95.05; host has 610.57.04 (r610)"),
        ("r610-rtx2080s-q.txt", CU129, True, "CUDA 12.9.1 needs driver >= 575.57.08; host has 610.57.04 (r610)"),
        # --version names no GPU: the driver is read, the GPUs are not: never "run it" (gpu-unread)
        ("r590-h100-version.txt", OFFICIAL, False, "driver was read (590.48.01) but no GPU row"),
        ("r590-h100-mig-table.txt", OFFICIAL, True, "needs driver >= 580.95.05; host has 590.48.01 (r590)"),
        ("win-r610-rtx2080s-table.txt", CU129, True, "610.62 is a Windows driver that reports CUDA up to 13.3"),
        ("nvml-mismatch-ci-log.txt", OFFICIAL, False, "differ (user-space NVML library 550.144)"),
        ("nvml-mismatch.txt", CU129, False, "driver library differ (a driver upgraded or reinstalled without"),
        ("r610-b200-table.txt", OFFICIAL, True, "CUDA 13.0.2 needs driver >= 580.95.05; host has 610.43.02 (r610)"),
        ("r610-rtx2080s-version.txt", CU129, False, "driver was read (610.57.04) but no GPU row"),
        ("r610-rtx2080s-query.csv", OFFICIAL, True, "host has 610.57.04 (r610)"),
        ("r565-8xh100-table.txt", CU129, True, "minor-version compatibility within CUDA 12.x"),
        (
            "r565-8xh100-table.txt",
            OFFICIAL,
            False,
            "CUDA 13.0.2 needs driver >= 580.95.05 (branch r580); host has 565.57.01 (r565)",
        ),
        ("r595-l40s-table.txt", OFFICIAL, True, "needs driver >= 580.95.05; host has 595.80 (r595)"),
        ("r410-cuda-na-table.txt", CU129, False, "needs driver >= 575.57.08 (branch r575); host has 410.78 (r410)"),
        ("win-r591-rtx2080s-q.txt", OFFICIAL, True, "591.86 is a Windows driver that reports CUDA up to 13.1"),
        (
            "wsl-r555-rtx4070-table.txt",
            CU129,
            False,
            "555.99 is a WSL host's Windows driver that reports CUDA up to 12.5",
        ),
        ("wsl-r546-cuda-err-table.txt", CU129, False, "546.80 is a WSL host's Windows driver that reports no CUDA"),
        ("nvml-mismatch-570.txt", CU129, False, "differ (user-space NVML library 570.124)"),
        ("no-libnvidia-ml.txt", CU129, False, "nvidia-smi finds no libnvidia-ml.so"),
        ("no-driver-wsl.txt", CU129, False, "couldn't communicate with the NVIDIA driver"),
        ("no-devices.txt", OFFICIAL, False, "the NVIDIA driver is loaded but reports no GPU"),
    ],
)
def test_verdicts(sample, image, compatible, words):
    d = _diag(sample, image)
    assert d.compatible is compatible
    assert words in d.line and "\n" not in d.line
    assert d.line.startswith("compatible: " if compatible else "INCOMPATIBLE: ")


def test_routes_on_real_captures():
    h100 = _diag("r565-8xh100-table.txt", OFFICIAL).route
    assert h100.startswith("use the cu129 build") and "cuda-compat-13-0) is possible on these data-center" in h100
    wsl = _diag("wsl-r555-rtx4070-table.txt", OFFICIAL).route
    assert wsl.startswith("use the cu129 build (this project) on this CUDA 12 driver, or upgrade the Windows driver")
    assert _diag("r410-cuda-na-table.txt", OFFICIAL).route.startswith("upgrade the driver to r580+ (even the cu129")
    mismatch = _diag("nvml-mismatch-570.txt")
    assert mismatch.route.startswith("reboot the host, or stop every GPU process and reload the NVIDIA kernel")
    assert mismatch.save.startswith("/proc/driver/nvidia/version") and mismatch.facts["nvml_library"] == "570.124"
    assert "the container runtime did not mount the driver" in _diag("no-libnvidia-ml.txt").route
    assert _diag("r410-cuda-na-table.txt").notes == [
        "the driver reports 'CUDA Version: N/A': its CUDA library (libcuda) is not usable here (not installed, or "
        "not mounted into this container)",
    ]


def test_truncated_names_are_not_claimed_as_data_center_gpus():
    d = _diag("r610-rtx2080s-table.txt", OFFICIAL)
    assert d.facts["data_center"] is False and d.notes == []  # "GeForce" survives the cut: consumer
    text = (SMI / "r565-8xh100-table.txt").read_text().replace("NVIDIA H100 80GB HBM3 ", "NVIDIA A10...          ")
    cut = doctor.diagnose(text, "cut", OFFICIAL[0], OFFICIAL[1], "img", dt.date(2026, 11, 29))
    assert cut.facts["data_center"] is False and "is possible" not in cut.route
    assert cut.notes == [
        "nvidia-smi cut the GPU name NVIDIA A10...: its class (data-center or not) is unknown; "
        "`nvidia-smi -q` or `nvidia-smi -L` prints the full name"
    ]


def test_windows_captures_with_a_bom_crlf_or_utf16(tmp_path):
    raw = (SMI / "win-r610-rtx2080s-table.txt").read_bytes()
    crlf = raw.replace(b"\n", b"\r\n")
    for name, data in {
        "bom8": b"\xef\xbb\xbf" + crlf,
        "utf16": crlf.decode().encode("utf-16"),
        "utf16be": b"\xfe\xff" + crlf.decode().encode("utf-16-be"),
    }.items():
        (tmp_path / name).write_bytes(data)
        text, _ = doctor.read_nvidia_smi(tmp_path / name)
        host = compat.parse_smi(text)
        assert (host.driver, host.cuda, host.platform, host.gpus) == (
            (610, 62),
            "13.3",
            "windows",
            ("NVIDIA GeForce RTX 2080 ...",),
        ), name
    assert doctor.decode_capture(b"\xef\xbb\xbfDriver") == "Driver"


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
        "EXPIRED on 2027-06-30: this bridge build is past its exit date; ask o@e.org"
    )
    assert doctor._expiry({contract.LABEL_EXPIRES: "2027-06-30"}, dt.date(2027, 7, 1)).endswith("ask its owner")
    assert doctor._expiry({}, dt.date(2027, 7, 1)) is None
    assert doctor._expiry({contract.LABEL_EXPIRES: "soon"}, dt.date(2027, 7, 1)) == (
        "expiry label io.k3-cu129.expires='soon' is not a date"
    )


def test_the_diagnosis_records_its_facts():
    d = _diag("r575-h100.txt")
    assert d.line == "compatible: img: CUDA 12.9.1 needs driver >= 575.57.08; host has 575.57.08 (r575)"
    assert d.route == "run the image as it is"
    assert d.facts == {
        "image": "img",
        "image_cuda": "12.9.1",
        "image_cuda_from": "label io.k3-cu129.cuda-version",
        "host_driver": "575.57.08",
        "host_branch": "r575",
        "host_cuda": "12.9",
        "gpus": ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"],
        "data_center": True,
        "nvidia_smi": "r575-h100.txt",
        "nvidia_smi_form": "table",
        "platform": "linux",
        "fault": None,
        "nvml_library": None,
        "mig_devices": 0,
        "host_kind": "linux",
        "forward_capable": True,
        "cpu": {
            "host": None,
            "from": "",
            "image": [],
            "match": None,
        },
        "gpu_findings": [
            {
                "name": H100,
                "cc": "9.0",
                "class": "data-center",
                "from": "table",
                "coverage": None,
                "missing_kernels": [],
                "per_kernel": False,
            },
        ]
        * 2,
        "driver_floor": None,
        "gpu_families": None,
        "kernels": {},
    }
    assert d.notes == [] and d.save == "" and d.name == "compatible"
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
    with pytest.raises(ConfigError, match=r"garbage.txt: no nvidia-smi output: the capture holds the shell's"):
        _diag("garbage.txt")
    with pytest.raises(ConfigError) as info:
        _diag("r575-h100.txt", ({}, {}))
    assert info.value.message == (
        "img: no CUDA version in its labels (io.k3-cu129.cuda-version) or env "
        "(CUDA_VERSION, NVIDIA_REQUIRE_CUDA); is it a CUDA image?"
    )


SECRETS = {
    "HF_TOKEN": "hf_abcdefghijklmnop",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMIK7MDENG",
    "PIP_INDEX_URL": "https://deploy:s3cr3tpass@pypi.internal.example/simple",
    "DB_PASSWORD": "hunter2hunter2",
    "PATH": "/usr/bin",
    "MY_API_KEY": "k-123456789",
}


def test_evidence_redacts_by_name_value_and_shape():
    env = {
        "DOCKER_PASS": "plain",
        "GH_PAT": "ghp_0123456789abcdefghij",
        "CI_JOB_JWT": "eyJhbGciOi.x.y",
        "HF_HUB_ACCESS": "whatever",
        "SOME_VAR": "ghp_notanameclue0123456789",
        "OPAQUE": "a" * 40,
        "WEIRD": "x'y\"z",
        "LANG": "C.UTF-8",
        "HOME": "/root",
    }
    text = evidence.redacted_environment(env)
    for value in (
        "plain",
        "ghp_0123456789abcdefghij",
        "eyJhbGciOi.x.y",
        "whatever",
        "ghp_notanameclue",
        "a" * 40,
        "x'y",
    ):
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

        @staticmethod
        def run_python(ref, script):
            raise EngineUnavailable("docker CLI not found")


@pytest.fixture()
def bare_host(tmp_path, monkeypatch):
    """A host with no NVIDIA module, no driver, no RDMA device and none of the tools on PATH."""
    (tmp_path / "modules").write_text("ext4 1097728 1 - Live 0x0000000000000000\n")
    monkeypatch.setattr(evidence, "PROC_MODULES", tmp_path / "modules")
    monkeypatch.setattr(evidence, "DRIVER_VERSION", tmp_path / "no-driver-version")
    monkeypatch.setattr(evidence, "SYS_INFINIBAND", tmp_path / "no-infiniband")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    return tmp_path


def test_evidence_without_gpu_nvidia_smi_or_docker(tmp_path, bare_host):
    path, manifest = evidence.evidence(_NoDocker(), tmp_path, "img:1", "vllm-1", environ=SECRETS)
    assert path.name.startswith("k3-evidence-") and path.suffixes == [".tar", ".gz"]
    assert set(manifest["captured"]) == {"date-utc.txt", "environment.txt", "nvidia-modules.txt"}
    assert manifest["missing"] == {
        "nvidia-smi.txt": "nvidia-smi not installed",
        "uname.txt": "uname not installed",
        "hostname.txt": "hostname not installed",
        "nvidia-driver-version.txt": f"no {bare_host / 'no-driver-version'} (no NVIDIA kernel module loaded)",
        "nvidia-smi-topo.txt": "nvidia-smi not installed",
        "infiniband.txt": f"no {bare_host / 'no-infiniband'} (no RDMA device or no RDMA driver loaded)",
        "ibv_devinfo.txt": "ibv_devinfo not installed",
        "docker-version.txt": "docker CLI not found",
        "docker-info.txt": "docker CLI not found",
        "containers.txt": "docker not installed",
        "image-inspect.json": "docker CLI not found",
        "vllm-version.txt": "no labels (image not inspected)",
        "nccl-version.txt": "docker CLI not found",
        "container.log": "docker CLI not found",
    }
    with tarfile.open(path) as tar:
        names = sorted(m.name.split("/", 1)[1] for m in tar.getmembers())
        blob = b"".join(tar.extractfile(m).read() for m in tar.getmembers())
    assert names == ["date-utc.txt", "environment.txt", "manifest.json", "nvidia-modules.txt"]
    for value in SECRETS.values():
        if value != "/usr/bin":
            assert value.encode() not in blob
    with tarfile.open(path) as tar:
        manifest_member = next(m for m in tar.getmembers() if m.name.endswith("/manifest.json"))
        assert json.loads(tar.extractfile(manifest_member).read()) == manifest  # the manifest is JSON


class _Engine(_NoDocker):
    """An engine seam whose image carries NCCL 2.30.7 (and whose output leaks a registered secret)."""

    class containers(_NoDocker.containers):
        @staticmethod
        def run_python(ref, script):
            assert "nvidia-nccl" in script and ref == "img:1"
            return "nvidia-nccl-cu12 2.30.7\ntorch.cuda.nccl 2.30.7\ntoken hf_evidence_nccl_secret\n"


def test_evidence_of_a_gpu_host(tmp_path, bare_host, monkeypatch):
    (bare_host / "modules").write_text(
        "nvidia_uvm 1794048 0 - Live 0x0\nnvidia_drm 118784 2 - Live 0x0\nnvidia 56840192 12 nvidia_uvm, Live 0x0\n"
        "ext4 1097728 1 - Live 0x0\nnvidia_peermem 16384 0 - Live 0x0\nnv_peer_mem 16384 0 - Live 0x0\n"
        "snvidia 1 0 - Live 0x0\n"
    )
    (bare_host / "no-driver-version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  575.57.08\n")
    port = bare_host / "no-infiniband" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    for name, value in {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": "400 Gb/sec (4X NDR)"}.items():
        (port / name).write_text(value + "\n")
    log.register_secret("hf_evidence_nccl_secret")
    seen = []

    def run(args):
        seen.append(args)
        if args[0] == "ibv_devinfo":
            raise OSError("ibv_devinfo not installed")
        return {
            "uname": "Linux gpu-7 6.8.0 x86_64 GNU/Linux\n",
            "hostname": "gpu-7\n",
            "nvidia-smi": "GPU0 X NV18\n",
            "docker": "",
        }[args[0]]

    _, manifest = evidence.evidence(_Engine(), tmp_path, "img:1", None, SMI / "r575-h100.txt", environ={}, run=run)
    assert ["nvidia-smi", "topo", "-m"] in seen and ["uname", "-a"] in seen and seen[-1][:2] == ["docker", "ps"]
    assert manifest["missing"] == {
        "ibv_devinfo.txt": "ibv_devinfo not installed",
        "docker-version.txt": "docker CLI not found",
        "docker-info.txt": "docker CLI not found",
        "image-inspect.json": "docker CLI not found",
        "vllm-version.txt": "no labels (image not inspected)",
    }
    path = next(tmp_path.glob("k3-evidence-*.tar.gz"))
    with tarfile.open(path) as tar:
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode() for m in tar.getmembers()}
    assert files["nvidia-modules.txt"].splitlines() == [
        "nvidia_uvm 1794048 0 - Live 0x0",
        "nvidia_drm 118784 2 - Live 0x0",
        "nvidia 56840192 12 nvidia_uvm, Live 0x0",
        "nvidia_peermem 16384 0 - Live 0x0",
        "nv_peer_mem 16384 0 - Live 0x0",
    ]
    assert files["nvidia-driver-version.txt"].endswith("Kernel Module  575.57.08\n")
    assert (
        files["infiniband.txt"] == "mlx5_0 port 1: state 4: ACTIVE, phys_state 5: LinkUp, rate 400 Gb/sec (4X NDR), "
        "link_layer ?\n"
    )
    assert files["nccl-version.txt"].startswith("nvidia-nccl-cu12 2.30.7\ntorch.cuda.nccl 2.30.7\n")
    assert "hf_evidence_nccl_secret" not in "".join(files.values())
    assert files["containers.txt"] == "no running container\n" and files["hostname.txt"] == "gpu-7\n"
    assert files["nvidia-smi-topo.txt"] == "GPU0 X NV18\n"


def test_an_image_without_nccl_is_listed_with_why():
    class engine(_NoDocker):
        class containers(_NoDocker.containers):
            @staticmethod
            def run_python(ref, script):
                return "torch.cuda.nccl: not readable: ModuleNotFoundError\n"

    with pytest.raises(ValueError, match=r"no NCCL in img: no nvidia-nccl-\* distribution and no torch NCCL"):
        evidence.image_nccl(engine(), "img")


def test_infiniband_with_no_device_and_run_tool(tmp_path, monkeypatch):
    (tmp_path / "ib").mkdir()
    monkeypatch.setattr(evidence, "SYS_INFINIBAND", tmp_path / "ib")
    assert evidence.infiniband() == f"{tmp_path / 'ib'} lists no device\n"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in {"ok": "echo out; echo err >&2", "bad": "echo broken >&2; exit 3"}.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert evidence.run_tool(["ok"]) == "out\nerr\n"
    with pytest.raises(OSError, match=r"^`bad` exited 3: broken$"):
        evidence.run_tool(["bad"])
    with pytest.raises(OSError, match="^nope not installed$"):
        evidence.run_tool(["nope"])


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


# --- the decision record ---------------------------------------------------------------------------

NOW = dt.datetime(2026, 11, 29, 10, 0, 0, tzinfo=dt.timezone.utc)


def _record(sample, image=CU129, built=None, archive=None):
    d = _diag(sample, image)
    return d, doctor.decision(d, image[0], built, archive, NOW)


def _paths(doc):
    return {o["path"]: (o["chosen"], o["why"]) for o in doc["paths"]}


def test_record_of_the_bridge_on_a_cuda12_data_center_host():
    built = {"target": "cu129", "image": "img", "digest": "sha256:ab", "checks": "passed", "record": "locks/x"}
    archive = {"archive": "k3-evidence-20261129T095900Z.tar.gz", "sha256": "0" * 64}
    d, doc = _record("r565-8xh100-table.txt", built=built, archive=archive)
    assert doc["chosen"] == "the cu129 bridge" and doc["schema"] == 1 and doc["created"] == "2026-11-29T10:00:00Z"
    paths = _paths(doc)
    assert paths["the cu129 bridge"][0] is True and paths["the cu129 bridge"][1].startswith("the bridge runs on this")
    assert paths["upgrade the driver"] == (
        False,
        "not now: CUDA 13 needs r580+ on the host (it runs r565); TO FILL (a person): when",
    )
    assert paths["an isolated environment"][1].startswith("possible on these data-center GPUs (cuda-compat")
    ev = doc["fault_evidence"]
    assert (
        ev["verdict"] == d.line
        and ev["evidence_archive"] == archive
        and ev["host"]["gpus"] == ["NVIDIA H100 80GB HBM3"] * 8
    )
    assert ev["host"]["host_driver"] == "565.57.01" and ev["save_first"] is None
    ver = doc["verification"]
    assert ver["checks"] == "passed" and ver["build_record"] == built and ver["compatible"] is True
    assert (
        ver["labels"]["io.k3-cu129.cuda-version"] == "12.9.1"
        and ver["labels"]["org.opencontainers.image.version"] is None
    )
    assert doc["exit_conditions"]["owner"] == "o@e.org" and doc["exit_conditions"]["expires"] == "2027-06-30"
    assert doc["exit_conditions"]["status"].startswith("expires 2027-06-30 (213 days left")
    assert (
        doc["rollback"] == "redeploy the previous image (TO FILL (a person): the image to roll back to) and "
        "retire this deployment"
    )
    assert doc["next_review"] == "2026-12-29"  # 30 days on: sooner than the expiry
    assert doc["to_fill"] == {name: None for name in doctor.BLANKS}


def test_record_checks_only_from_a_build_record_of_the_same_image():
    other = {"target": "cu129", "image": "other", "digest": "sha256:cd", "checks": "passed", "record": "r"}
    _, doc = _record("r565-8xh100-table.txt", built=other)
    assert doc["verification"]["checks"] is None and doc["verification"]["build_record"] is None
    assert "image checks: unknown: no build record names this image" in doctor.decision_markdown(doc)


def test_record_of_the_official_image_on_r575_chooses_the_bridge():
    _, doc = _record("r575-h100.txt", OFFICIAL)
    assert doc["chosen"] == "the cu129 bridge"
    assert _paths(doc)["the cu129 bridge"][1] == "this host runs a CUDA 12 driver (r575); the cu129 build runs on it"
    assert doc["exit_conditions"] == {
        "bridge": False,
        "owner": None,
        "expires": None,
        "status": "no expiry label: this image is not a bridge build",
    }
    consumer = _paths(_record("r575-q.txt", OFFICIAL)[1])["an isolated environment"][1]
    assert (
        consumer == "not available: forward compatibility (cuda-compat) needs data-center GPUs; host has "
        "NVIDIA RTX 6000 Ada Generation"
    )


def test_record_on_r580_and_newer_hosts():
    _, doc = _record("r610-b200-table.txt")  # the bridge on r610: the official image runs here
    assert doc["chosen"] == "upgrade the driver"
    assert _paths(doc)["upgrade the driver"][1] == (
        "done: the host driver (610.43.02) already runs this image; on "
        "r580+ the bridge is not needed: run the official CUDA 13 image"
    )
    assert (
        _paths(doc)["the cu129 bridge"][1] == "not needed: the host driver runs the image (r580+ runs the "
        "official CUDA 13 image)"
    )
    assert doc["rollback"] == "none needed: the host already runs the image"
    official = _record("r610-b200-table.txt", OFFICIAL)[1]
    assert _paths(official)["upgrade the driver"][1] == "done: the host driver (610.43.02) already runs this image"
    assert _paths(official)["the cu129 bridge"] == (False, "not needed: the host driver runs the image")
    unnamed = _record("r590-h100-version.txt")[1]  # no GPU read: no path until doctor reads them
    assert unnamed["chosen"] is None and _paths(unnamed)["an isolated environment"][1] == "not yet: gpu-unread first"
    mixed = doctor.diagnose(
        (SMI / "r575-h100.txt")
        .read_text()
        .replace("|   1  NVIDIA H100 80GB HBM3   ", "|   1  NVIDIA GeForce RTX 4090 "),
        "mixed",
        *CU129,
        "img",
        dt.date(2026, 11, 29),
    )
    assert mixed.facts["gpus"] == ["NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 4090"]
    assert _paths(doctor.decision(mixed, CU129[0], None, None, NOW))["an isolated environment"][1].endswith(
        "host has NVIDIA GeForce RTX 4090, NVIDIA H100 80GB HBM3"
    )


def test_the_bridge_on_r580_is_not_chosen():
    for sample in ("r580-b200.txt", "r580-q.txt"):  # 580.95.05 and 580.82.07: the r580 boundary itself
        assert _record(sample)[1]["chosen"] == "upgrade the driver", sample
    assert _record("r575-h100.txt")[1]["chosen"] == "the cu129 bridge"
    d = _diag("r575-h100.txt")
    assert d.reason == "CUDA 12.9.1 needs driver >= 575.57.08; host has 575.57.08 (r575)"
    assert d.line == f"compatible: img: {d.reason}"


def test_record_on_a_driver_too_old_for_the_bridge():
    _, doc = _record("r410-cuda-na-table.txt")
    assert doc["chosen"] == "upgrade the driver"
    assert _paths(doc)["the cu129 bridge"][1] == "the bridge itself does not start here (see the verdict)"
    assert doc["rollback"] == "reinstall the driver the host runs now (410.78) and reboot"
    assert doc["fault_evidence"]["notes"][0].startswith("the driver reports 'CUDA Version: N/A'")
    official = _record("r410-cuda-na-table.txt", OFFICIAL)[1]
    assert _paths(official)["the cu129 bridge"][1] == (
        "does not help: the bridge needs a CUDA 12 driver (>= 525.60.13); the host runs r410"
    )
    wsl = _paths(_record("wsl-r555-rtx4070-table.txt")[1])
    assert (
        wsl["an isolated environment"][1] == "not assessed: forward compatibility (cuda-compat) on a Windows/WSL driver"
    )


def test_record_of_a_broken_host_chooses_nothing_yet():
    d, doc = _record("nvml-mismatch-570.txt")
    assert doc["chosen"] is None and all(not o["chosen"] for o in doc["paths"])
    assert [o["why"] for o in doc["paths"]][1:] == ["not yet: repair the host first"] * 2
    assert doc["paths"][0]["why"] == "not yet: repair the host first"
    assert doc["fault_evidence"]["host"]["fault"] == "nvml-mismatch"
    assert doc["fault_evidence"]["host"]["nvml_library"] == "570.124" and doc["fault_evidence"]["save_first"] == d.save
    assert doc["rollback"] == "none: nothing is changed until the host is repaired"
    md = doctor.decision_markdown(doc)
    assert f"- save first: {d.save}" in md
    assert doc["chosen_why"] == f"no path until the host has a usable driver: {d.route}"
    assert f"\nChosen: none yet: no path until the host has a usable driver: {d.route}\n" in md


def test_record_without_nvidia_smi_chooses_nothing_yet():
    d = doctor.diagnose(None, "nvidia-smi not installed", CU129[0], CU129[1], "img", dt.date(2026, 11, 29))
    doc = doctor.decision(d, CU129[0], None, None, NOW)
    assert doc["chosen"] is None and doc["fault_evidence"]["host"]["fault"] is None
    assert doc["chosen_why"] == (
        "no path until the host has a usable driver: install a driver (r575 for the cu129 "
        "build, r580 for the official CUDA 13 image), then run doctor again"
    )


def test_the_why_of_each_recommendation_quotes_the_verdict():
    assert _record("r565-8xh100-table.txt")[1]["chosen_why"] == (
        "the bridge runs on this host as it is (CUDA 12.9.1 runs on driver 565.57.01 (r565) through minor-version "
        "compatibility within CUDA 12.x (family minimum 525.60.13) (full support from 575.57.08); features that need "
        "a newer driver (PTX JIT of newer code) are unavailable)"
    )
    assert _record("r410-cuda-na-table.txt")[1]["chosen_why"] == (
        "the image does not start on this driver: CUDA 12.9.1 needs driver >= 575.57.08 (branch r575); host has "
        "410.78 (r410); route: upgrade the driver to at least 575.57.08"
    )
    doc = _record("r565-8xh100-table.txt")[1]
    assert [o["why"] for o in doc["paths"] if o["chosen"]] == [doc["chosen_why"]]


def test_record_fields_from_the_labels():
    soon = ({contract.LABEL_CUDA: "12.9.1", contract.LABEL_EXPIRES: "2026-12-10", contract.LABEL_OWNER: "o@e.org"}, {})
    _, doc = _record("r565-8xh100-table.txt", soon)
    assert doc["next_review"] == "2026-12-10"  # the expiry comes before 30 days are up
    owned = ({contract.LABEL_CUDA: "12.9.1", contract.LABEL_OWNER: "team@e.org"}, {})
    assert _record("r565-8xh100-table.txt", owned)[1]["exit_conditions"]["owner"] == "team@e.org"


def test_a_record_file_name_keeps_only_safe_characters(tmp_path):
    _, doc = _record("r565-8xh100-table.txt")
    doc["image"] = "127.0.0.1:5000/k3/smoke-test-abcdef@sha256:" + "0123456789abcdef" * 4
    md, _ = doctor.write_decision(tmp_path, doc)
    assert (
        md.name
        == "k3-decision-20261129T100000Z-"
        + ("1:5000/k3/smoke-test-abcdef@sha256:" + "0123456789abcdef" * 4)
        .replace(":", "_")
        .replace("/", "_")
        .replace("@", "_")[-60:]
        + ".md"
    )
    assert len(md.stem) == len("k3-decision-20261129T100000Z-") + 60


def test_notes_name_each_cut_gpu_once():
    text = (SMI / "r575-h100.txt").read_text().replace("NVIDIA H100 80GB HBM3 ", "NVIDIA RTX PRO 6000 Blac...", 1)
    text = text.replace("NVIDIA H100 80GB HBM3 ", "NVIDIA A10...          ", 1)
    d = doctor.diagnose(text, "cut", *CU129, "img", dt.date(2026, 11, 29))
    assert d.notes == [
        "nvidia-smi cut the GPU name NVIDIA RTX PRO 6000 Blac..., NVIDIA A10...: its class (data-center or not) is "
        "unknown; `nvidia-smi -q` or `nvidia-smi -L` prints the full name"
    ]


def test_output_dir(tmp_path):
    nested = tmp_path / "a" / "b"
    assert doctor.output_dir(nested, "--record") == nested.resolve() and nested.is_dir()
    assert doctor.output_dir(nested, "--record") == nested.resolve()  # an existing directory is fine
    for bad in ("/sys/x", "/dev/x", "/proc/x"):
        with pytest.raises(ConfigError) as info:
            doctor.output_dir(__import__("pathlib").Path(bad), "--opt")
        assert info.value.message == f"--opt {bad}: not a place for an archive or a record"


def test_next_review_is_at_the_latest_the_expiry():
    today = dt.date(2027, 6, 20)
    assert doctor._next_review("2027-06-30", today) == dt.date(2027, 6, 30)
    assert doctor._next_review("2027-06-30", dt.date(2027, 7, 5)) == dt.date(2027, 7, 5)  # expired: review today
    assert doctor._next_review(None, today) == dt.date(2027, 7, 20)
    assert doctor._next_review("soon", today) == dt.date(2027, 7, 20)


def test_write_decision_writes_markdown_and_json_with_marked_blanks(tmp_path):
    _, doc = _record("r565-8xh100-table.txt")
    md, js = doctor.write_decision(tmp_path / "records", doc)
    assert md.name == "k3-decision-20261129T100000Z-img.md" and js.with_suffix(".md") == md
    assert json.loads(js.read_text()) == doc
    text = md.read_text()
    for heading in (
        "# Decision record: img",
        "## Fault evidence",
        "## Paths",
        "## Verification",
        "## Exit conditions",
        "## Rollback",
        "## Next review",
        "## For a person",
    ):
        assert f"\n{heading}\n" in f"\n{text}", heading
    for blank in doctor.BLANKS.values():
        assert f"- {blank}: **TO FILL (a person): {blank}**" in text
    assert "- **chosen**: the cu129 bridge: " in text and "- not chosen: upgrade the driver: not now" in text
    assert "- evidence archive: **TO FILL (a person): run `build evidence --out DIR` and name its archive**" in text
    assert "- owner: o@e.org" in text and "- expires: 2027-06-30" in text and "- 2026-12-29" in text
    assert "GPUs: 8 x NVIDIA H100 80GB HBM3 (data-center)" in text
    assert decisionmd._gpu_summary(["A", "B", "A"]) == "2 x A, B" and decisionmd._gpu_summary([]) == "none listed"
    assert (
        "- label io.k3-cu129.owner: o@e.org" in text and "- label org.opencontainers.image.revision: (absent)" in text
    )
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="--record .*file: exists and is not a directory"):
        doctor.write_decision(tmp_path / "file", doc)
    with pytest.raises(ConfigError, match="--record /proc/x: not a place"):
        doctor.output_dir(__import__("pathlib").Path("/proc/x"), "--record")


def test_archive_facts(tmp_path):
    archive = tmp_path / "k3-evidence-x.tar.gz"
    archive.write_bytes(b"abc")
    assert doctor.archive_facts(archive) == {
        "archive": "k3-evidence-x.tar.gz",
        "sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
    }
    assert doctor.archive_facts(None) is None
    with pytest.raises(ConfigError, match="--evidence .*missing: not a file"):
        doctor.archive_facts(tmp_path / "missing")


def test_image_record_reads_the_targets_build_record(tmp_path):
    from types import SimpleNamespace

    plan = SimpleNamespace(root=tmp_path, target=SimpleNamespace(name="cu129"))
    assert doctor.image_record(plan) is None  # never built here
    path = contract.record_path(tmp_path, "cu129")
    path.parent.mkdir(parents=True)
    doc = {
        "schema": contract.RECORD_SCHEMA,
        "target": "cu129",
        "image": "reg/k3@sha256:ab",
        "digest": "sha256:ab",
        "bases": {},
        "source": {},
        "lock_sha256": "",
        "build_lock_sha256": "",
        "dockerfile_sha256": "",
        "source_date_epoch": 0,
        "input_key": "",
        "tool_version": "",
        "checks": "skipped",
        "build": {},
    }
    path.write_text(json.dumps(doc))
    assert doctor.image_record(plan) == {
        "target": "cu129",
        "image": "reg/k3@sha256:ab",
        "digest": "sha256:ab",
        "checks": "skipped",
        "record": str(path),
    }


# Lines both records below share: the head, the labels neither test image has, the review and the blanks.
HEAD = (
    "# Decision record: img\n"
    "\n"
    "Created 2026-11-29T10:00:00Z by `build doctor --record`. Lines marked **TO FILL (a person)** are for a person to complete.\n"
    "\n"
    "## Fault evidence\n"
    "\n"
)
ABSENT_LABELS = (
    "- label io.k3-cu129.target: (absent)\n"
    "- label io.k3-cu129.lock-sha256: (absent)\n"
    "- label io.k3-cu129.builder.source: (absent)\n"
    "- label org.opencontainers.image.version: (absent)\n"
    "- label org.opencontainers.image.revision: (absent)\n"
    "- label org.opencontainers.image.source: (absent)\n"
    "- label org.opencontainers.image.created: (absent)\n"
    "- label org.opencontainers.image.base.name: (absent)\n"
    "- label org.opencontainers.image.base.digest: (absent)\n"
)
# Before `build accept --record` adds a run (issue 47): a marked blank.
LAUNCH_BLANK = (
    "\n"
    "## Launch verification\n"
    "\n"
    "- **TO FILL (a person): launch the server, then run `build accept --endpoint URL --record DIR`**\n"
    "\n"
)
REVIEW_AND_PERSON = (
    "## Next review\n"
    "\n"
    "- 2026-12-29\n"
    "\n"
    "## For a person\n"
    "\n"
    "- who decided: **TO FILL (a person): who decided**\n"
    "- the platform lead who approved: **TO FILL (a person): the platform lead who approved**\n"
    "- teams and services that run on these hosts: **TO FILL (a person): teams and services that run on these hosts**\n"
    "- when the hosts can move to driver r580+ (maintenance window): **TO FILL (a person): when the hosts can move to driver r580+ (maintenance window)**\n"
    "- the image to roll back to: **TO FILL (a person): the image to roll back to**\n"
)


GOLDEN = (
    HEAD
    + (  # the whole Markdown of one record: every line is the format
        "- verdict: compatible: img: CUDA 12.9.1 needs driver >= 575.57.08; host has 590.48.01 (r590)\n"
        "- route: run the image as it is\n"
        "- host: driver 590.48.01 (r590, linux), CUDA 13.1, GPUs: NVIDIA H100 80GB HBM3 (data-center)\n"
        "- host kind: linux; CPU: unknown (give --evidence ARCHIVE: its uname says it); image platforms: unknown\n"
        "- GPU NVIDIA H100 80GB HBM3: cc 9.0, data-center, image coverage not declared\n"
        "- nvidia-smi: r590-h100-mig-table.txt (table)\n"
        "- note: MIG is on: 4 MIG devices; each runs the image with its GPU's driver\n"
        "- evidence archive: k3-evidence-20261129T095900Z.tar.gz (sha256 0000000000000000000000000000000000000000000000000000000000000000)\n"
        "\n"
        "## Paths\n"
        "\n"
        "- **chosen**: upgrade the driver: done: the host driver (590.48.01) already runs this image; on r580+ the bridge is not needed: run the official CUDA 13 image\n"
        "- not chosen: the cu129 bridge: not needed: the host driver runs the image (r580+ runs the official CUDA 13 image)\n"
        "- not chosen: an isolated environment: possible on these data-center GPUs (cuda-compat in an isolated environment), not needed while the chosen path (upgrade the driver) holds; it swaps the driver's user-space libraries inside the container\n"
        "\n"
        "Chosen: upgrade the driver (doctor's recommendation; **TO FILL (a person): confirm or change it**)\n"
        "\n"
        "## Verification\n"
        "\n"
        "- doctor: compatible (image CUDA 12.9.1)\n"
        "- image checks: passed (build record locks/cu129/image.json, digest sha256:ab)\n"
        "- label io.k3-cu129.cuda-version: 12.9.1\n"
        "- label io.k3-cu129.owner: o@e.org\n"
        "- label io.k3-cu129.expires: 2027-06-30\n"
    )
    + ABSENT_LABELS
    + LAUNCH_BLANK
    + (
        "## Exit conditions\n"
        "\n"
        "- bridge: yes\n"
        "- owner: o@e.org\n"
        "- expires: 2027-06-30\n"
        "- status: expires 2027-06-30 (213 days left; owner o@e.org)\n"
        "- exit when: the hosts run driver r580+ and the official CUDA 13 image passes `build doctor` and `build compare` against this one; at the expiry date at the latest\n"
        "\n"
        "## Rollback\n"
        "\n"
        "- none needed: the host already runs the image\n"
        "\n"
    )
    + REVIEW_AND_PERSON
)


def test_the_markdown_of_a_record_line_by_line():
    built = {
        "target": "cu129",
        "image": "img",
        "digest": "sha256:ab",
        "checks": "passed",
        "record": "locks/cu129/image.json",
    }
    archive = {"archive": "k3-evidence-20261129T095900Z.tar.gz", "sha256": "0" * 64}
    _, doc = _record("r590-h100-mig-table.txt", built=built, archive=archive)
    assert doctor.decision_markdown(doc).splitlines() == GOLDEN.splitlines()
    md, js = doctor.write_decision(__import__("pathlib").Path(__import__("tempfile").mkdtemp()), doc)
    assert md.read_text() == GOLDEN and js.read_text() == json.dumps(doc, indent=2) + "\n"


GOLDEN_BROKEN = (
    HEAD
    + (  # a broken host and an image that is not a bridge: the other branches
        "- verdict: INCOMPATIBLE: img: image needs CUDA 13.0.2 but this host has no usable NVIDIA driver: nvidia-smi cannot initialise NVML: the loaded NVIDIA kernel module and the user-space driver library differ (user-space NVML library 570.124) (a driver upgraded or reinstalled without reloading the module)\n"
        "- route: reboot the host, or stop every GPU process and reload the NVIDIA kernel modules (`rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia`, then `modprobe nvidia`); then run doctor again\n"
        "- host: driver none (none, linux), CUDA not reported, GPUs: none listed\n"
        "- host kind: linux; CPU: unknown (give --evidence ARCHIVE: its uname says it); image platforms: unknown\n"
        "- nvidia-smi: nvml-mismatch-570.txt (a failure message)\n"
        "- save first: /proc/driver/nvidia/version (the loaded module's version), `lsmod` and the installed driver packages (`build evidence` saves the first two), `dmesg | grep -i nvrm`\n"
        "- evidence archive: **TO FILL (a person): run `build evidence --out DIR` and name its archive**\n"
        "\n"
        "## Paths\n"
        "\n"
        "- not chosen: upgrade the driver: not yet: repair the host first\n"
        "- not chosen: the cu129 bridge: not yet: repair the host first\n"
        "- not chosen: an isolated environment: not yet: repair the host first\n"
        "\n"
        "Chosen: none yet: no path until the host has a usable driver: reboot the host, or stop every GPU process and reload the NVIDIA kernel modules (`rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia`, then `modprobe nvidia`); then run doctor again\n"
        "\n"
        "## Verification\n"
        "\n"
        "- doctor: INCOMPATIBLE (image CUDA 13.0.2)\n"
        "- image checks: unknown: no build record names this image (run `build test --image REF`)\n"
        "- label io.k3-cu129.cuda-version: (absent)\n"
        "- label io.k3-cu129.owner: (absent)\n"
        "- label io.k3-cu129.expires: (absent)\n"
    )
    + ABSENT_LABELS
    + LAUNCH_BLANK
    + (
        "## Exit conditions\n"
        "\n"
        "- bridge: no\n"
        "- owner: (no owner label)\n"
        "- expires: (no expiry label)\n"
        "- status: no expiry label: this image is not a bridge build\n"
        "\n"
        "## Rollback\n"
        "\n"
        "- none: nothing is changed until the host is repaired\n"
        "\n"
    )
    + REVIEW_AND_PERSON
)


def test_the_markdown_of_a_broken_hosts_record():
    _, doc = _record("nvml-mismatch-570.txt", OFFICIAL)
    assert doctor.decision_markdown(doc).splitlines() == GOLDEN_BROKEN.splitlines()


def test_decode_capture_replaces_what_it_cannot_read():
    assert doctor.decode_capture(b"\xff\xfeD\x00\x00\xd8") == "D\ufffd"  # UTF-16LE with a lone surrogate
    assert doctor.decode_capture(b"\xfe\xff\x00D") == "D"  # UTF-16BE
    assert doctor.decode_capture(b"\xef\xbb\xbfKMD \xff") == "KMD \ufffd"
    assert doctor.decode_capture(b"\xff\xfe") == ""


def test_two_evidence_runs_in_the_same_second_keep_both_archives(tmp_path, bare_host, monkeypatch):
    fixed = dt.datetime(2026, 12, 2, 4, 0, 0, tzinfo=dt.timezone.utc)

    class _Clock(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return fixed

    monkeypatch.setattr(evidence.dt, "datetime", _Clock)
    first, _ = evidence.evidence(_NoDocker(), tmp_path, None, None, environ={})
    second, _ = evidence.evidence(_NoDocker(), tmp_path, None, None, environ={})
    assert first != second and first.is_file() and second.is_file()
    assert {first.name, second.name} == {"k3-evidence-20261202T040000Z.tar.gz", "k3-evidence-20261202T040000Z-2.tar.gz"}

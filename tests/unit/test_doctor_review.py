"""doctor, round four: what an independent review fed it. A GPU row cut off partway, two hosts'
captures pasted into one file, a driver that says "CUDA Version: N/A", a pathological line of spaces,
many GPUs, and a table copied from a web page (no-break spaces). The rule throughout: never "run it"
(exit 0) when doctor did not read the whole host. Captures: tests/fixtures/nvidia-smi (SOURCES.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from builder.cli import main
from builder.errors import ConfigError
from builder.host import compat, gpus
from builder.host.compat import Route
from tests.conftest import REPO
from tests.unit.fakeengine import FakeEngine
from tests.unit.test_doctor_binary import LABELS, SMI, diag
from tests.unit.test_doctor_gpus import _push


def test_the_uncut_capture_is_compatible():  # the baseline the cut forms are made from
    d = diag("a100-r580-bottlerocket-table.txt")
    assert (d.name, d.compatible) == ("compatible", True)


@pytest.mark.parametrize("sample", ["a100-v100-r580-cut-after-name.txt", "a100-v100-r580-cut-in-row.txt"])
def test_a_row_cut_off_partway_is_unread(sample, monkeypatch, capsys):
    host = compat.parse_smi((SMI / sample).read_text())
    assert host.gpus == ("NVIDIA A100-SXM4-40GB",) and host.unread
    d = diag(sample)
    assert (d.name, d.compatible, d.kind) == ("gpu-unread", False, Route.CAPTURE)
    engine = FakeEngine()
    ref = _push(engine, LABELS, "amd64")
    monkeypatch.setattr("builder.commands.doctor.docker_engine", lambda: engine)
    with pytest.raises(SystemExit) as info:
        main(["doctor", "--image", ref, "--nvidia-smi-file", str(SMI / sample)])
    out = capsys.readouterr().out
    assert info.value.code == 1 and "verdict: gpu-unread" in out and "CUDA_VISIBLE_DEVICES" not in out


def test_a_table_without_its_closing_border_is_unread():
    text = (SMI / "a100-r580-bottlerocket-table.txt").read_text().rstrip("\n")
    cut = text[: text.rindex("\n")]  # the border under the last row gone: the capture stops in the row
    assert compat.parse_smi(cut).unread.startswith("the table ends inside a GPU row")
    assert diag("x", text=cut).name == "gpu-unread"
    assert diag("x", text=cut + "\n+----+\n$ exit\n").compatible  # a prompt after the table is not the table


@pytest.mark.parametrize(
    "sample,words",
    [
        ("two-hosts-a100-r580-l4-r570.txt", "more than one driver version (570.133.20, 580.126.09)"),
        ("two-hosts-v100-a100-r580.txt", "more than one nvidia-smi table header"),
        ("two-hosts-a100-h100-query.csv", "more than one driver version (570.86.15, 580.95.05)"),
    ],
)
def test_two_hosts_pasted_together_are_refused_naming_the_file(sample, words, capsys):
    with pytest.raises(ConfigError, match=rf"^{sample}: .*capture one host at a time"):
        diag(sample)
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        diag(sample)
    with pytest.raises(SystemExit) as info:
        main(["doctor", "--image", "127.0.0.1:5000/k3/img:x", "--nvidia-smi-file", str(SMI / sample)])
    assert info.value.code == 2 and sample in capsys.readouterr().err


def test_a_repeated_gpu_index_is_refused():
    text = (SMI / "a100-r580-bottlerocket-table.txt").read_text().replace("|   1  NVIDIA", "|   0  NVIDIA")
    with pytest.raises(ConfigError, match="GPU index 0 shown twice; capture one host at a time"):
        diag("pasted.txt", text=text)


def test_cuda_na_on_a_new_enough_driver_is_not_run_it():
    host = compat.parse_smi((SMI / "rtx5070-r575-cuda-na-table.txt").read_text())
    assert host.cuda is None and host.cuda_unusable and host.driver == (575, 64, 3)
    d = diag("rtx5070-r575-cuda-na-table.txt")
    assert (d.name, d.compatible, d.kind) == ("cuda-unusable", False, Route.REPAIR_HOST)
    assert not compat.parse_smi((SMI / "vgpu-manager-r580-q.txt").read_text()).cuda_unusable  # "Not Found"


def test_a_long_line_of_spaces_is_read_in_linear_time():
    """900k spaces in a GPU row (under the 1 MiB cap) used to never finish; the timeout only guards a hang."""
    code = (
        "from builder.host import compat\n"
        "text = 'Driver Version: 580.95.05  CUDA Version: 13.0\\n|   0  NVIDIA H100' + ' ' * 900_000 + 'x\\n'\n"
        "print(compat.parse_smi(text).gpus)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "()"


def test_no_break_spaces_from_a_web_page_read_as_spaces():
    text = (SMI / "a100-r580-bottlerocket-table.txt").read_text()
    pasted = text.replace("  ", "\u00a0 ").replace("GPU  Name", "GPU\u202f Name")
    assert compat.parse_smi(pasted).gpus == compat.parse_smi(text).gpus == ("NVIDIA A100-SXM4-40GB",) * 2


def test_identify_is_cached_by_name():
    gpus.identify.cache_clear()
    for _ in range(50):
        gpus.identify("NVIDIA A100-SXM4-40GB", None, None)
    assert gpus.identify.cache_info().hits == 49


def test_thor_is_not_told_that_sbsa_images_cannot_run():
    """JetPack 7 puts Thor on the unified Arm (SBSA) CUDA 13 stack (NVIDIA's CUDA 13.0 for Jetson Thor
    blog); a CUDA 12 image is still not judged compatible. The capture is made up in the form of
    r570-titanv-rtx5880-query.csv (name as NVIDIA's Thor tables print it, capability 11.0)."""
    d = diag("thor.csv", text="name, compute_cap, driver_version\nNVIDIA Thor, 11.0, 580.00\n")
    assert (d.name, d.compatible, d.kind) == ("jetson", False, Route.OTHER_IMAGE)
    assert "does not run on an integrated GPU" not in d.line and "CUDA 13" in d.line
    orin = diag("jetson-orin-r540-table.txt")
    assert (orin.name, orin.kind) == ("jetson", Route.JETSON)

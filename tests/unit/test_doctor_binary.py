"""doctor, round three (issue 48): where GPU code runs (one rule, ``GpuArch.runs_on``, for the checks
and doctor), each required kernel judged per GPU, unread GPU rows, one host platform, Jetson hosts,
routes as values; and the hostile inputs of issue 49 that reach doctor (deep XML, Unicode controls).
Captures: tests/fixtures/nvidia-smi (SOURCES.md names where each comes from)."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest

from builder import log
from builder.checks import gpurules
from builder.cli import main
from builder.config import contract
from builder.config.gpu import PTX, SASS, CoverageCell, GpuArch, Served, cell_runs
from builder.errors import ConfigError
from builder.host import compat, doctor, hostctx, imagefacts
from builder.host.compat import Route
from builder.host.hostctx import HostContext
from tests.conftest import REPO
from tests.unit.fakeengine import FakeEngine
from tests.unit.test_doctor_gpus import _push, push_index

SMI = REPO / "tests" / "fixtures" / "nvidia-smi"
TODAY = dt.date(2026, 11, 29)
LABELS = {
    contract.LABEL_CUDA: "12.9.1",
    contract.LABEL_EXPIRES: "2027-06-30",
    contract.LABEL_OWNER: "o@e.org",
    contract.LABEL_DRIVER_FLOOR: "575.51.03",
    contract.LABEL_GPU_FAMILIES: "8.0 9.0 10.0 12.0",
}
BOTH = ("linux/amd64", "linux/arm64")
# The build record's coverage table as the gpu_coverage check writes it for a cu129-like image:
# the stable-ABI extension carries generic SASS, FlashKDA only arch-specific code (12.0a, ...).
KERNELS = {
    "vllm._C_stable_libtorch": {"8.0": "SASS sm_80", "9.0": "SASS sm_90", "10.0": "SASS sm_100", "12.0": "SASS sm_120"},
    "vllm._flashkda_C": {"9.0": "SASS sm_90a", "10.0": "SASS sm_100a", "12.0": "SASS sm_120a"},
    "vllm.vllm_flash_attn._vllm_fa2_C": {"8.0": "SASS sm_80", "12.0": "SASS sm_120"},
}


@pytest.fixture(autouse=True)
def no_registered_secrets(monkeypatch):
    monkeypatch.setattr(log, "_secrets", set())


def facts(words: str = LABELS[contract.LABEL_GPU_FAMILIES], coverage=None, platforms=BOTH):
    return imagefacts.from_labels({**LABELS, contract.LABEL_GPU_FAMILIES: words}, platforms, coverage)


def diag(sample: str, found=None, ctx=None, text=None, labels=LABELS):
    text = (SMI / sample).read_text() if text is None else text
    return doctor.diagnose(text, sample, labels, {}, "img", TODAY, facts=found or facts(), ctx=ctx)


# --- the one rule --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arch,cc,runs",
    [
        ("sm_80", (8, 0), True),
        ("sm_80", (8, 6), True),  # generic SASS runs upward within its major: A10G, RTX 3090
        ("sm_80", (8, 9), True),  # RTX 4070, L40S
        ("sm_80", (8, 7), True),  # Orin's capability (the host kind refuses a Jetson on its own)
        ("sm_86", (8, 0), False),  # never downward
        ("sm_80", (9, 0), False),  # never across a major
        ("sm_90a", (9, 0), True),  # arch-specific: exactly
        ("sm_100a", (10, 3), False),
        ("sm_120a", (12, 1), False),  # K3's 12.0a kernels on a GB10
        ("sm_120", (12, 1), True),
        ("sm_100f", (10, 3), True),  # family-specific: later members of its family
        ("sm_103f", (10, 0), False),
        ("sm_100f", (12, 0), False),
        ("compute_80", (12, 1), True),  # PTX: JIT upward, across majors
        ("compute_90", (8, 9), False),
        ("compute_100a", (10, 3), False),
        ("compute_100f", (10, 3), True),
        ("compute_100f", (11, 0), False),
    ],
)
def test_where_code_runs(arch, cc, runs):
    code = GpuArch.parse(arch, isa="8.8")
    assert code is not None and code.runs_on(cc) is runs
    # the gpu_code check's probe objects answer the same through gpurules.loads_on
    m = arch.split("_")[1]
    obj = {"kind": code.kind, "sm": int(m.rstrip("af")), "variant": m[-1] if m[-1] in "af" else "", "isa": "8.8"}
    assert gpurules.loads_on(obj, cc, (12, 9)) is runs


def test_ptx_needs_a_driver_that_knows_its_isa():
    ptx = GpuArch.parse("compute_80", isa="8.8")
    assert ptx is not None and ptx.runs_on((8, 6), (12, 9)) and not ptx.runs_on((8, 6), (12, 8))
    assert not GpuArch(PTX, (8, 0), "", "9.9").runs_on((8, 6), (13, 0))  # an ISA the table does not know
    assert GpuArch(PTX, (8, 0)).runs_on((8, 6), (12, 0))  # a label's PTX: the driver floor speaks for it
    assert not GpuArch("LTO-IR", (9, 0)).runs_on((9, 0))


def test_label_words_keep_their_variants():
    assert [c.arch for c in GpuArch.of_family("9.0a")] == ["sm_90a"]
    assert [c.arch for c in GpuArch.of_family("10.3f")] == ["sm_103f"]
    assert [(c.kind, c.arch) for c in GpuArch.of_family("8.0+PTX")] == [(SASS, "sm_80"), (PTX, "compute_80")]
    assert GpuArch.of_family("sm_90") == () and GpuArch.of_family("9") == ()
    odd = facts("8.0 9.0a 10.3f junk")
    assert odd.families == ("8.0", "9.0a", "10.3f") and len(odd.notes) == 1
    assert odd.status("9.0") == "sass" and odd.status("10.3") == "sass" and odd.status("10.0") == "none"


@pytest.mark.parametrize(
    "text",
    [
        "SASS sm_90a",
        "SASS sm_100 sm_100a",
        "PTX JIT compute_80 (ISA 8.8)",
        "none (has PTX compute_80 ISA 8.8, SASS sm_100a)",
    ],
)
def test_a_coverage_cell_is_a_value_and_reads_back(text):
    cell = CoverageCell.read(text)
    assert cell is not None and cell.show() == text
    assert cell.runs is (cell.served is not Served.NONE)
    assert CoverageCell.read("SASS everything") is None and CoverageCell.read(3) is None
    # the one reader the checks, verify and the build summary share: a forged cell is never "served"
    assert cell_runs(text) is cell.runs and not cell_runs("SASS-ish but forged") and not cell_runs(None)


# --- A10G, RTX 3090/4070 against 8.0 code; the driver floor is never hidden ------------------------


def _a10g(driver: str) -> str:
    return (SMI / "a10g-r510-q.txt").read_text().replace("510.85.02", driver).replace(": 11.6", ": 12.9")


@pytest.mark.parametrize("sample", ["a10g-r510-q.txt", "rtx4070-r550-table.txt", "rtx5090-rtx4090-r580-table.txt"])
def test_8_0_code_serves_later_ampere_and_ada_gpus(sample):
    d = diag(sample, facts("8.0 12.0"))
    assert d.name not in ("gpu-none", "gpu-partial"), d.line
    assert {g["coverage"] for g in d.facts["gpu_findings"]} == {"sass"}


def test_the_floor_boundary_on_a_gpu_served_only_by_8_0_code():
    only_80 = facts("8.0", platforms=("linux/amd64",))
    below = diag("a10g", only_80, HostContext("x86_64", "uname"), text=_a10g("575.51.02"))
    assert (below.name, below.compatible) == ("driver-below-floor", False)
    assert "needs driver >= 575.51.03" in below.reason and below.kind is Route.UPGRADE_DRIVER
    at = diag("a10g", only_80, HostContext("x86_64", "uname"), text=_a10g("575.51.03"))
    assert (at.name, at.compatible) == ("compatible", True)
    # a GPU the image cannot serve still names the driver that fails too
    volta = (SMI / "volta-r535-v100-q.txt").read_text()
    d = diag("v", only_80, HostContext("x86_64", "uname"), text=volta)
    assert d.name == "gpu-none" and any(n.startswith("also: driver-below-floor") for n in d.notes)


# --- per-kernel verdicts --------------------------------------------------------------------------


def test_a_gb10_against_12_0a_kernels_names_the_kernel():
    d = diag("gb10-r580-table.txt", facts(coverage=KERNELS))
    assert (d.name, d.compatible) == ("gpu-none", False)
    assert "NVIDIA GB10 (cc 12.1): no code in vllm._flashkda_C" in d.reason
    assert "judged kernel by kernel from the build record" in d.reason
    (gpu,) = d.facts["gpu_findings"]
    assert (gpu["coverage"], gpu["missing_kernels"], gpu["per_kernel"]) == ("partial", ["vllm._flashkda_C"], True)
    assert "no code in vllm._flashkda_C" in doctor.gpu_lines(d)[0]
    # the same image for an RTX PRO 6000 Blackwell (12.0): every kernel has code
    pro = (SMI / "gb10-r580-table.txt").read_text().replace("NVIDIA GB10       ", "NVIDIA RTX PRO 6000 Blackwell")
    assert diag("pro", facts(coverage=KERNELS), HostContext("x86_64", "u"), text=pro).name == "compatible"


def test_a_label_alone_says_the_per_kernel_view_is_missing():
    d = diag("gb10-r580-table.txt", facts("8.0 9.0 10.0 12.0"))  # sm_120 generic runs on 12.1
    assert d.compatible and any("per-kernel view (the build record's coverage table) is missing" in n for n in d.notes)
    assert doctor.gpu_lines(d)[0].endswith("(label only: the per-kernel view is missing)")
    arch_only = diag("gb10-r580-table.txt", facts("9.0a 10.0a 12.0a"))
    assert arch_only.name == "gpu-none" and "the per-kernel view is missing" in arch_only.reason


# --- unread GPU rows, indented and line-mangled tables ------------------------------------------


@pytest.mark.parametrize(
    "clean,pasted",
    [
        ("gb10-r580-table.txt", "gb10-r580-indented.txt"),
        ("gb10-r580-table.txt", "gb10-r580-mangled.txt"),
        ("h200-r570-table.txt", "h200-r570-indented.txt"),
        ("rtx4070-r550-table.txt", "rtx4070-r550-mangled.txt"),
    ],
)
def test_indented_and_mangled_tables_read_as_the_clean_one(clean, pasted):
    a, b = compat.parse_smi((SMI / clean).read_text()), compat.parse_smi((SMI / pasted).read_text())
    assert (b.gpus, b.driver, b.cuda) == (a.gpus, a.driver, a.cuda) and b.gpus
    found = facts("9.0a 10.0a 12.0a")
    assert diag(pasted, found).name == diag(clean, found).name


def test_a_whitespace_collapsed_table_is_read():
    h = compat.parse_smi((SMI / "v100-r410-collapsed-table.txt").read_text())
    assert h.gpus == ("Tesla V100-PCIE...",) * 2 and h.driver_text == "410.48"


def test_unread_gpu_rows_are_never_run_it(monkeypatch, capsys, tmp_path):
    rows_lost = re.sub(r"0000000\d:[0-9A-F]{2}:00\.0", "", (SMI / "r575-h100.txt").read_text())
    assert compat.parse_smi(rows_lost).gpus == ()
    d = diag("x", text=rows_lost)
    assert (d.name, d.compatible, d.kind) == ("gpu-unread", False, Route.CAPTURE)
    assert "--query-gpu=name,compute_cap,driver_version --format=csv" in d.route and "nvidia-smi -L" in d.route
    capture = tmp_path / "smi.txt"
    capture.write_text(rows_lost)
    engine = FakeEngine()
    ref = _push(engine, LABELS, "amd64")
    monkeypatch.setattr("builder.commands.doctor.docker_engine", lambda: engine)
    with pytest.raises(SystemExit) as info:
        main(["doctor", "--image", ref, "--nvidia-smi-file", str(capture)])
    out = capsys.readouterr().out
    assert info.value.code == 1 and "verdict: gpu-unread" in out and not out.startswith("compatible")


# --- Grace and Jetson hosts without evidence; one host platform ---------------------------------


def _index(engine: FakeEngine) -> str:
    for arch in ("amd64", "arm64"):
        _push(engine, {**LABELS, contract.LABEL_GPU_FAMILIES: f"8.0 12.0 {arch}-only-word"}, arch)
    return push_index(engine)


@pytest.mark.parametrize("sample", ["gb10-r580-table.txt", "gh200-r560-table.txt"])
def test_a_grace_capture_picks_the_arm64_platform(sample, monkeypatch, capsys):
    monkeypatch.setattr("platform.machine", lambda: "x86_64")  # the tool runs on an amd64 laptop
    engine = FakeEngine()
    ref = _index(engine)
    monkeypatch.setattr("builder.commands.doctor.docker_engine", lambda: engine)
    with pytest.raises(SystemExit):
        main(["doctor", "--json", "--image", ref, "--nvidia-smi-file", str(SMI / sample)])
    doc = json.loads(capsys.readouterr().out)
    assert doc["image_platform"] == "linux/arm64" and doc["cpu"]["host"] == "arm64"
    assert "arm64-only-word" in " ".join(doc["notes"])  # the labels read are the arm64 image's
    with pytest.raises(SystemExit):
        main(["doctor", "--image", ref, "--nvidia-smi-file", str(SMI / sample)])
    assert "platform: linux/arm64 of linux/amd64, linux/arm64 (the host's)" in capsys.readouterr().out


def test_the_host_platform_is_one_function_of_the_evidence_and_the_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    gb10 = compat.parse_smi((SMI / "gb10-r580-table.txt").read_text())
    h100 = compat.parse_smi((SMI / "r575-h100.txt").read_text())
    orin = compat.parse_smi((SMI / "jetson-orin-r540-table.txt").read_text())
    captured = hostctx.gather(SMI / "r575-h100.txt", None, None)
    assert captured.machine is None  # a capture from elsewhere: never this machine's uname
    assert hostctx.host_platform(captured, h100) == (None, "")
    assert hostctx.host_platform(captured, gb10)[0] == "arm64"
    assert hostctx.host_platform(captured, orin)[0] == "arm64"
    assert hostctx.host_platform(HostContext("aarch64", "uname.txt"), h100) == ("arm64", "uname.txt")
    assert doctor.host_arch((SMI / "gb10-r580-table.txt").read_text(), "f", captured) == "arm64"


def test_a_host_diagnosed_from_a_machine_of_the_other_architecture(tmp_path, monkeypatch):
    """The build record of an index is the diagnosed host's platform's, whatever runs the tool."""
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    records = tmp_path / "locks" / "t"
    for slug in ("linux-amd64", "linux-arm64"):
        (records / slug).mkdir(parents=True)
        (records / slug / "image.json").write_text("{}")
    path = records / "index.json"
    path.write_text("{}")
    from builder.records import index as index_mod

    entries = {p: {"record": f"{p.replace('/', '-')}/image.json", "digest": "sha256:" + "2" * 64} for p in BOTH}
    found = index_mod.IndexRecord.__new__(index_mod.IndexRecord)
    object.__setattr__(found, "target", "t")
    object.__setattr__(found, "image", "r/i@sha256:" + "3" * 64)
    object.__setattr__(found, "digest", "sha256:" + "3" * 64)
    object.__setattr__(found, "platforms", entries)
    monkeypatch.setattr(index_mod, "read", lambda _p: found)
    monkeypatch.setattr("builder.records.store.read", lambda _p: None)
    arch = doctor.host_arch((SMI / "gh200-r560-table.txt").read_text(), "f", HostContext())
    assert doctor._index_record(path, arch)["platform"] == "linux/arm64"
    assert doctor._index_record(path, "amd64")["platform"] == "linux/amd64"
    assert doctor._index_record(path, None)["platform"] == "linux/amd64"  # unknown: the first, never uname's


@pytest.mark.parametrize(
    "sample",
    ["jetson-orin-r540-table.txt", "jetson-orin-r540-cuda126-table.txt", "jetson-orin-r540-driver-na-table.txt"],
)
def test_a_jetson_is_its_own_host_kind(sample):
    d = diag(sample)
    assert (d.name, d.compatible, d.kind, d.facts["host_kind"]) == ("jetson", False, Route.JETSON, "jetson")
    assert "JetPack" in d.route and "r575" not in d.route and "upgrade the driver to" not in d.route
    assert d.facts["host_driver"] in ("540.4.0", "540.3.0") and "540.04" not in d.line
    assert d.facts["cpu"]["host"] == "arm64"
    assert doctor.decision(d, LABELS, None, None, dt.datetime(2026, 11, 29, tzinfo=dt.timezone.utc))["chosen"] is None


def test_a_jetson_list_and_an_l4t_uname():
    d = diag("jetson-orin-r540-L.txt")
    assert d.name == "jetson"
    h100 = diag("r575-h100.txt", ctx=HostContext("aarch64", "uname.txt", tegra=True))
    assert h100.facts["host_kind"] == "jetson"


def test_inconsistent_headers_are_noted():
    d = diag("t4-smi450-driver418-table.txt")
    assert any("NVIDIA-SMI version (450.66) differs from its driver version (418.67)" in n for n in d.notes)
    low = (SMI / "r575-h100.txt").read_text().replace("CUDA Version: 12.9", "CUDA Version: 12.4")
    assert any(
        "CUDA Version (12.4) is lower than driver 575.57.08 supports (12.9)" in n for n in diag("x", text=low).notes
    )
    assert not any("does not add up" in n or "differs" in n for n in diag("r575-h100.txt").notes)


def test_routes_are_values_the_record_keys_on():
    official = diag("volta-r535-v100-q.txt", imagefacts.ImageFacts(), labels={contract.LABEL_CUDA: "13.0.2"})
    assert official.kind is Route.USE_CU129
    reworded = doctor.Diagnosis(**{**official.__dict__, "route": "something else entirely"})
    assert doctor._choice(reworded, False)[0] == "the cu129 bridge"  # the wording never decides


# --- hostile input: deep XML, Unicode controls -------------------------------------------------------


def test_deep_xml_is_refused_naming_the_file(tmp_path, capsys):
    head = "<nvidia_smi_log><driver_version>575.57.08</driver_version><gpu><product_name>H100</product_name></gpu>"
    deep = tmp_path / "deep.xml"
    deep.write_text(head + "<a>" * 3000 + "</a>" * 3000 + "</nvidia_smi_log>")
    with pytest.raises(ConfigError, match="deep.xml: the nvidia-smi XML nests deeper than 32 levels"):
        doctor.host_of(deep.read_text(), str(deep))
    with pytest.raises(SystemExit) as info:
        main(["doctor", "--image", "127.0.0.1:5000/k3/img:x", "--nvidia-smi-file", str(deep)])
    assert info.value.code == 2 and "deep.xml" in capsys.readouterr().err


HIDDEN = "\u061c\u2028\u2029\u200d\u202e\u2066\u00ad"


def test_unicode_controls_in_a_gpu_name_are_escaped_everywhere(tmp_path, monkeypatch, capsys):
    csv = tmp_path / "smi.csv"
    csv.write_text(f"driver_version, name, compute_cap\n575.57.08, NVIDIA H100{HIDDEN}X, 9.0\n")
    engine = FakeEngine()
    ref = _push(engine, {**LABELS, contract.LABEL_OWNER: "o@e.org\ncompatible: forged"}, "amd64")
    monkeypatch.setattr("builder.commands.doctor.docker_engine", lambda: engine)
    record = tmp_path / "rec"
    with pytest.raises(SystemExit):
        main(["doctor", "--image", ref, "--nvidia-smi-file", str(csv), "--record", str(record)])
    out = capsys.readouterr().out
    for ch in HIDDEN:
        assert ch not in out, repr(ch)
    assert "H100\\u061c\\u2028\\u2029\\u200d\\u202e\\u2066\\xadX" in out
    assert "\ncompatible: forged" not in out  # a label's newline never starts a line of its own
    (md,) = record.glob("*.md")
    assert not any(ch in md.read_text() for ch in HIDDEN) and "\ncompatible: forged" not in md.read_text()
    assert "o@e.org\\x0acompatible: forged" in md.read_text()
    with pytest.raises(SystemExit):
        main(["doctor", "--json", "--image", ref, "--nvidia-smi-file", str(csv)])
    doc = json.loads(capsys.readouterr().out)  # valid JSON, the name kept as the capture had it
    assert doc["gpus"] == [f"NVIDIA H100{HIDDEN}X"]


def test_a_names_line_break_from_xml_never_reaches_a_line_of_its_own():
    xml = (
        "<nvidia_smi_log><driver_version>575.57.08</driver_version><gpu>"
        "<product_name>NVIDIA H100&#10;compatible: img: forged</product_name></gpu></nvidia_smi_log>"
    )
    d = diag("x.xml", text=xml)
    assert all("\n" not in line for line in doctor.gpu_lines(d)) and "\n" not in d.line


def test_the_markdown_summary_is_escaped(tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    log.step_summary(f"| torch{HIDDEN} | 2.13.0 |\n")
    text = summary.read_text()
    assert not any(ch in text for ch in HIDDEN) and "\\u202e" in text and text.endswith("|\n")


def test_compare_and_evidence_lines_go_through_the_one_helper(capsys):
    """`build compare` prints its rows with Output.line, `build evidence` its manifest with log.info:
    both go through log.printable, so a foreign package name's controls are shown, not obeyed."""
    from builder.commands._common import Output

    Output(False).line(f"only in reference: torch{HIDDEN} 2.13.0")
    log.info(f"    not captured: nccl-version.txt: no NCCL in img{HIDDEN}")
    seen = capsys.readouterr()
    assert not any(ch in seen.out + seen.err for ch in HIDDEN)
    assert "torch\\u061c\\u2028\\u2029\\u200d\\u202e\\u2066\\xad 2.13.0" in seen.out

"""doctor against what the image really carries: the GPU table, the host kinds, the broken states,
the XML and headerless CSV forms, the CPU, the driver floor, and one rule over every capture: the
routes doctor prints for one host never contradict each other. Captures: tests/fixtures/nvidia-smi
(SOURCES.md names where each comes from). Images: the FakeEngine (tests/unit/fakeengine.py)."""

from __future__ import annotations

import datetime as dt
import io
import json
import tarfile

import pytest

from builder import log
from builder.cli import main
from builder.config import contract
from builder.errors import ConfigError
from builder.host import compat, doctor, gpus, hostctx, imagefacts, verdicts
from builder.host.hostctx import HostContext
from tests.conftest import REPO
from tests.unit.fakeengine import FakeEngine

SMI = REPO / "tests" / "fixtures" / "nvidia-smi"
TODAY = dt.date(2026, 11, 29)
FAMILIES = "7.5 8.0 8.6 8.9 9.0 10.0 12.0"  # upstream's cu129 x86 list: no 10.3 (B300), no 7.0 (Volta)
LABELS = {
    contract.LABEL_CUDA: "12.9.1",
    contract.LABEL_EXPIRES: "2027-06-30",
    contract.LABEL_OWNER: "o@e.org",
    contract.LABEL_DRIVER_FLOOR: "575.51.03",
    contract.LABEL_GPU_FAMILIES: FAMILIES,
}
AMD64 = imagefacts.from_labels(LABELS, ("linux/amd64",))
OFFICIAL = ({}, {"CUDA_VERSION": "13.0.2"})


@pytest.fixture(autouse=True)
def no_registered_secrets(monkeypatch):
    monkeypatch.setattr(log, "_secrets", set())


def diag(sample: str, facts=AMD64, ctx=None, labels=LABELS, env=None, text=None):
    text = (SMI / sample).read_text() if text is None else text
    return doctor.diagnose(text, sample, labels, env or {}, "img", TODAY, facts=facts, ctx=ctx)


# --- the GPU table -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,cc,klass",
    [
        ("Tesla V100S-PCIE-32GB", "7.0", "data-center"),  # V100S, not V100 + "S"
        ("Tesla V100-SXM2-16GB", "7.0", "data-center"),
        ("GRID V100D-8C", "7.0", "data-center"),  # a vGPU guest's profile name
        ("NVIDIA B300 SXM6 AC", "10.3", "data-center"),
        ("NVIDIA GB300", "10.3", "data-center"),
        ("NVIDIA B200", "10.0", "data-center"),
        ("NVIDIA GH200 480GB", "9.0", "data-center"),  # not an H200
        ("NVIDIA H200", "9.0", "data-center"),
        ("NVIDIA A100-SXM4-40GB", "8.0", "data-center"),
        ("NVIDIA A10G", "8.6", "data-center"),
        ("Tesla T4", "7.5", "data-center"),
        ("NVIDIA L40S", "8.9", "data-center"),
        ("NVIDIA GeForce RTX 4070 Laptop GPU", "8.9", "consumer"),  # a laptop part: its desktop's capability
        ("NVIDIA GeForce RTX 3050 Ti Laptop GPU", "8.6", "consumer"),
        ("NVIDIA RTX 6000 Ada Generation", "8.9", "consumer"),
        ("Quadro RTX 6000", "7.5", "consumer"),
        ("NVIDIA RTX A6000", "8.6", "consumer"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "12.0", "data-center"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "12.0", "consumer"),
        ("NVIDIA GeForce RTX 5090", "12.0", "consumer"),
        ("NVIDIA TITAN V", "7.0", "consumer"),
        ("GeForce GTX 108...", "6.1", "consumer"),  # cut: only the GTX 1080 starts so
        ("NVIDIA GeForce RTX 2080 ...", "7.5", "consumer"),
        ("NVIDIA L4...", "8.9", "data-center"),  # L4, L40 or L40S: all 8.9, all data-center
        ("NVIDIA A10...", None, "unknown"),  # A10 (8.6), A100 (8.0) or A1000 (8.6, workstation)
        ("NVIDIA Graphics Device", None, "unknown"),
    ],
)
def test_the_gpu_table(name, cc, klass):
    g = gpus.identify(name)
    assert (g.cc, g.klass) == (cc, klass)


def test_compute_cap_wins_and_the_architecture_narrows():
    assert gpus.identify("NVIDIA Graphics Device", "10.3").ccs == ("10.3",)
    assert gpus.identify("NVIDIA Tesla V100", "8.0").source == "compute_cap"  # the capture, not the table
    assert gpus.identify("NVIDIA Graphics Device", None, "Hopper").cc == "9.0"
    assert gpus.identify("NVIDIA A10...", None, "Ampere").ccs == ("8.0", "8.6")  # still two: unknown
    assert gpus.identify("NVIDIA Graphics Device", "[N/A]").ccs == ()
    assert gpus.identify("NVIDIA GH200 480GB").grace and not gpus.identify("NVIDIA H200").grace
    assert gpus.identify("Tesla V100S-PCIE-32GB").cuda13 is False and gpus.identify("Tesla T4").cuda13 is True


# --- forms ---------------------------------------------------------------------------------------


def test_the_xml_form():
    h = compat.parse_smi((SMI / "r510-a100-mig.xml").read_text())
    assert (h.driver, h.cuda, h.gpus, h.form, h.mig_devices) == (
        (510, 47, 3),
        "11.6",
        ("NVIDIA A100-SXM4-40GB",),
        "xml",
        2,
    )
    assert h.archs == ("Ampere",) and h.platform == "linux" and h.vgpu is None


@pytest.mark.parametrize(
    "doc",
    [
        '<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;">]>'
        "<nvidia_smi_log><driver_version>&b;</driver_version></nvidia_smi_log>",
        '<?xml version="1.0"?><!DOCTYPE l [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
        "<nvidia_smi_log><driver_version>&x;</driver_version></nvidia_smi_log>",
        '<?xml version="1.0"?><!DOCTYPE l [<!ENTITY % p SYSTEM "http://127.0.0.1:9/x.dtd"> %p;]>'
        "<nvidia_smi_log><driver_version>575.57.08</driver_version></nvidia_smi_log>",
    ],
)
def test_xml_entities_are_refused_not_expanded(doc):
    with pytest.raises(ConfigError, match="declares an entity; refused"):
        doctor.host_of(doc, "hostile.xml")


def test_a_cut_xml_is_bad_input_naming_the_capture():
    text = (SMI / "r510-a100-mig.xml").read_text()
    with pytest.raises(
        ConfigError, match=r"cut.xml: the nvidia-smi XML is cut or malformed .*capture `nvidia-smi -q -x`"
    ):
        doctor.host_of(text[: len(text) // 2], "cut.xml")


def test_a_headerless_csv_with_its_columns_in_any_order():
    text = (SMI / "r575-h100-noheader.csv").read_text()
    h = compat.parse_smi(text, ("driver_version", "name", "compute_cap", "index"))
    assert (h.driver, h.gpus, h.caps) == ((575, 57, 8), ("NVIDIA H100 80GB HBM3",) * 2, ("9.0", "9.0"))
    shuffled = "\n".join(",".join(reversed(line.split(","))) for line in text.splitlines())
    again = compat.parse_smi(shuffled, ("index", "compute_cap", "name", "driver_version"))
    assert again.driver == (575, 57, 8) and again.caps == ("9.0", "9.0")
    piped = "$ nvidia-smi --query-gpu=driver_version,name,compute_cap,index --format=csv,noheader\n" + text
    assert compat.parse_smi(piped).caps == ("9.0", "9.0")  # the command line the capture carries
    unknown = diag("r575-h100-noheader.csv")  # no columns anywhere: a verdict saying which it needs
    assert (unknown.name, unknown.compatible) == ("driver-unknown", False)
    assert "give them with --columns" in unknown.reason and "compute_cap" in unknown.reason
    with pytest.raises(ConfigError, match="names no driver_version or kmd_version"):
        doctor.host_of(text, "x.csv", ("name", "compute_cap", "index", "pstate"))


def test_the_exporters_csv_carries_compute_cap():
    h = compat.parse_smi((SMI / "r610-rtx2080s-query.csv").read_text())
    assert h.caps == ("7.5",) and h.infos[0].source == "compute_cap"


# --- verdicts ------------------------------------------------------------------------------------


def test_an_aarch64_host_against_an_amd64_image():
    d = diag("r575-h100.txt", ctx=HostContext("aarch64", "uname.txt"))
    assert (d.name, d.compatible) == ("cpu-mismatch", False)
    assert d.reason == "the host's CPU is arm64 (uname.txt); the image is built for linux/amd64 only"
    grace = diag("gh200-r560-table.txt")  # no uname: a Grace GPU says aarch64
    assert (
        grace.name == "cpu-mismatch" and "a Grace GPU (GH200, GB200, GB300, GB10) is on an aarch64 host" in grace.reason
    )
    both = imagefacts.from_labels(LABELS, ("linux/amd64", "linux/arm64"))
    assert diag("gh200-r560-table.txt", facts=both).name == "driver-below-floor"  # 560 < 575.51.03
    assert diag("r575-h100.txt", ctx=HostContext("x86_64", "uname.txt")).name == "compatible"


def test_a_volta_host():
    d = diag("volta-r535-v100-q.txt")
    assert (d.name, d.compatible) == ("gpu-none", False)
    assert "Tesla V100-PCIE-16GB (cc 7.0)" in d.reason and FAMILIES in d.reason
    assert "CUDA 13 dropped Volta" in d.route
    official = diag("volta-r535-v100-q.txt", facts=imagefacts.ImageFacts(), labels={}, env=OFFICIAL[1])
    assert official.name == "driver-too-old" and "use the cu129 build" in official.route
    assert "is possible" not in official.route and "CUDA 13 supports compute capability 7.5 and up" in official.route
    assert diag("volta-r535-v100-q.txt").facts["forward_capable"] is False


def _families(words: str, coverage: dict | None = None) -> imagefacts.ImageFacts:
    return imagefacts.from_labels({**LABELS, contract.LABEL_GPU_FAMILIES: words}, ("linux/amd64",), coverage)


def test_a_b300_host_by_binary_compatibility():
    # Generic sm_100 SASS runs on 10.3 (same major, higher minor): the label without 10.3 serves a B300,
    # and says the per-kernel view is missing; 10.0a (arch-specific) does not; 10.0f (family) does.
    d = diag("b300-r595-table.txt")
    assert (d.name, d.compatible) == ("compatible", True)
    assert any("judged by the gpu-families label alone" in n for n in d.notes)
    arch_only = diag("b300-r595-table.txt", facts=_families("9.0a 10.0a 12.0a"))
    assert (arch_only.name, arch_only.compatible) == ("gpu-none", False)
    assert "NVIDIA B300 SXM6 AC (cc 10.3)" in arch_only.reason and "9.0a 10.0a 12.0a" in arch_only.reason
    assert "the per-kernel view is missing" in arch_only.reason
    assert arch_only.route.startswith("run an image with code for compute capability 10.3")
    assert diag("b300-r595-table.txt", facts=_families("10.0f")).name == "compatible"
    ptx = {"vllm._C": {"10.0": "PTX JIT compute_80 (ISA 8.8)"}}
    jit = diag("b300-r595-table.txt", facts=_families(FAMILIES, ptx))
    assert (jit.name, jit.compatible) == ("compatible-ptx-jit", True) and jit.route.startswith("run the image")


def test_some_gpus_uncovered_is_partial():
    d = diag("r570-titanv-rtx5880-query.csv")
    assert d.name == "gpu-partial" and "NVIDIA TITAN V (cc 7.0)" in d.reason
    assert "CUDA_VISIBLE_DEVICES=1" in d.route


def test_a_vgpu_manager_and_a_vgpu_guest():
    d = diag("vgpu-manager-r580-q.txt")
    assert (d.name, d.compatible, d.facts["host_kind"]) == ("vgpu-manager", False, "vgpu-manager")
    assert "runs no CUDA" in d.reason and "virtual machine" in d.route
    guest = diag("vgpu-guest-r470-v100d-table.txt")
    assert guest.facts["host_kind"] == "linux-vgpu-guest" and guest.name == "gpu-none"  # a V100 profile


def test_a_tcc_host():
    d = diag("tcc-win-r555-l40s-table.txt")
    assert (d.name, d.compatible, d.facts["host_kind"]) == ("windows-tcc", False, "windows-tcc")
    assert "WDDM" in d.route
    doc = doctor.decision(d, LABELS, None, None, dt.datetime(2026, 11, 29, tzinfo=dt.timezone.utc))
    assert doc["chosen"] is None and "windows-tcc" in doc["chosen_why"]  # never the bridge it just refused


@pytest.mark.parametrize(
    "sample,fault,fix",
    [
        ("nvml-unknown-error.txt", "nvml-unknown-error", "recreate the container"),
        ("insufficient-permissions.txt", "insufficient-permissions", "/dev/nvidia*"),
        ("wsl-blocked.txt", "wsl-blocked", "WDDM mode"),
        ("device-handle-unknown.txt", "device-handle", "Xid 79"),
        ("device-handle-not-found.txt", "device-handle", "reset it"),
        ("device-handle-gpu-lost.txt", "device-handle", "reboot"),
    ],
)
def test_the_broken_states(sample, fault, fix):
    d = diag(sample)
    assert (d.name, d.compatible, d.facts["fault"]) == ("broken-host", False, fault)
    assert fix in d.route and d.save


def test_an_unknown_error_line_is_a_broken_host_quoted_safely():
    d = diag("x", text="Failed to frobnicate the GPU: \x1b[31mboom\x07\n")
    assert (d.name, d.facts["fault"]) == ("broken-host", "unknown-error")
    assert (
        "nvidia-smi printed an error this tool does not know: Failed to frobnicate the GPU: \\x1b[31mboom\\x07"
        in d.line
    )
    assert "\x1b" not in d.line
    with pytest.raises(ConfigError, match="no 'Driver Version'"):  # not an error message: bad input
        diag("x", text="hello\n")


def test_a_cuda12_driver_below_the_floor_is_not_minor_version_compatible():
    d = diag("r550-l4.txt")  # 550.163.01: minor-version compatible with 12.9, but older than the floor
    assert (d.name, d.compatible) == ("driver-below-floor", False)
    assert "ISA 8.8" in d.reason and d.route == "upgrade the driver to >= 575.51.03 (r575) or to r580+"
    no_floor = imagefacts.from_labels({k: v for k, v in LABELS.items() if k != contract.LABEL_DRIVER_FLOOR})
    assert diag("r550-l4.txt", facts=no_floor).name == "compatible"
    doc = doctor.decision(d, LABELS, None, None, dt.datetime(2026, 11, 29, tzinfo=dt.timezone.utc))
    assert doc["chosen"] == "upgrade the driver"


def test_an_unknown_gpu_asks_for_its_compute_capability():
    text = (SMI / "r575-h100.txt").read_text().replace("NVIDIA H100 80GB HBM3", "NVIDIA Graphics Device")
    d = diag("x", text=text)
    assert d.name == "gpu-unknown" and "--query-gpu=name,compute_cap" in d.route


def test_a_container_without_the_gpu_runtime():
    d = doctor.diagnose(None, "nvidia-smi not installed", LABELS, {}, "img", TODAY, ctx=HostContext(in_container=True))
    assert (d.name, d.compatible) == ("container-no-runtime", False) and "--gpus all" in d.route
    assert doctor.diagnose(None, "nvidia-smi not installed", LABELS, {}, "img", TODAY).name == "no-driver"


# --- every capture: one verdict, and routes that agree --------------------------------------------

NO_OUTPUT = {"garbage.txt"}  # the only capture with no nvidia-smi output in it
# Two hosts' captures in one file: refused as ambiguous (bad input), never judged (test_doctor_review.py).
NO_OUTPUT |= {"two-hosts-a100-h100-query.csv", "two-hosts-a100-r580-l4-r570.txt", "two-hosts-v100-a100-r580.txt"}


@pytest.mark.parametrize("sample", sorted(p.name for p in SMI.iterdir() if p.name != "SOURCES.md"))
@pytest.mark.parametrize("image", ["bridge", "official"])
def test_routes_never_contradict(sample, image):
    labels, env, facts = (LABELS, {}, AMD64) if image == "bridge" else ({}, OFFICIAL[1], imagefacts.ImageFacts())
    if sample in NO_OUTPUT:
        with pytest.raises(ConfigError):
            diag(sample, facts=facts, labels=labels, env=env)
        return
    d = diag(sample, facts=facts, labels=labels, env=env)
    assert verdicts.EXIT[d.name] == (0 if d.compatible else 1)
    assert d.compatible == d.route.startswith("run the image")
    doc = doctor.decision(d, labels, None, None, dt.datetime(2026, 11, 29, tzinfo=dt.timezone.utc))
    chosen, why = doc["chosen"], [p["why"] for p in doc["paths"]]
    if chosen == "the cu129 bridge":  # recommended only where it runs, or where the route names it
        assert (image == "bridge" and d.compatible) or "cu129 build" in d.route
    if not d.compatible:
        assert chosen != "the cu129 bridge" or image != "bridge"
        assert not why[1].startswith("not needed")
    if d.name not in ("compatible", "compatible-ptx-jit", "driver-too-old", "driver-below-floor"):
        assert chosen is None and doc["chosen_why"].startswith("no path until")  # the route alone says what to do
    forward = "is possible" in d.route or why[2].startswith("possible")
    assert not forward or d.facts["forward_capable"]
    uncovered = any(g["coverage"] in ("none", "partial", "unknown") for g in d.facts["gpu_findings"])
    if d.facts["cpu"]["match"] is False or uncovered:  # a host the image has no code for never "runs it"
        assert not d.compatible


# --- the image side (FakeEngine) and the host context ---------------------------------------------


def _push(engine: FakeEngine, labels: dict, arch: str = "amd64") -> str:
    config = {"architecture": arch, "os": "linux", "config": {"Labels": labels}}
    engine.registry.push("127.0.0.1:5000/k3/img", arch, config, [b"layer"])
    return f"127.0.0.1:5000/k3/img:{arch}"


def push_index(engine: FakeEngine, archs=("amd64", "arm64"), extra=()) -> str:
    """An image index of the images _push pushed for ``archs`` (plus ``extra`` entries), tagged multi."""
    manifests = [
        {"digest": engine.registry.tags[("127.0.0.1:5000/k3/img", a)], "platform": {"os": "linux", "architecture": a}}
        for a in archs
    ]
    doc = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": manifests + list(extra),
    }
    engine.registry.manifests[("127.0.0.1:5000/k3/img", "sha256:" + "1" * 64)] = json.dumps(doc).encode()
    engine.registry.tags[("127.0.0.1:5000/k3/img", "multi")] = "sha256:" + "1" * 64
    return "127.0.0.1:5000/k3/img:multi"


def test_image_facts_from_the_registry_and_an_index():
    engine = FakeEngine()
    ref = _push(engine, LABELS)
    facts = imagefacts.read(engine, ref, LABELS)
    assert (facts.platforms, facts.floor, facts.families) == (("linux/amd64",), "575.51.03", tuple(FAMILIES.split()))
    arm = _push(engine, LABELS, "arm64")
    push_index(
        engine, extra=[{"digest": "sha256:" + "0" * 64, "platform": {"os": "unknown", "architecture": "unknown"}}]
    )
    assert imagefacts.platforms(engine, "127.0.0.1:5000/k3/img:multi") == (("linux/amd64", "linux/arm64"), "")
    assert arm.endswith(":arm64")
    local = imagefacts.platforms(engine, "img:local")  # no registry in the name: the engine's inspect
    assert local[0] == () and "could not be read" in local[1]


def test_record_coverage_and_odd_labels(tmp_path):
    record = tmp_path / "image.json"
    # image.json's gpu block as publish.gpu_record writes it: extension -> cc -> what serves it.
    coverage = {
        "vllm._C_stable_libtorch": {
            "9.0": "SASS sm_90a",
            "10.3": "PTX JIT compute_80 (ISA 8.8)",
            "12.0": "SASS sm_120",
        },
        "vllm._flashkda_C": {"9.0": "SASS sm_90a", "10.3": "SASS sm_103a", "12.0": "none (has SASS sm_100a)"},
        "vllm._fa3_C": {"9.0": "SASS sm_90a"},
        "forged": {"9.0": "SASS whatever", "x": "none (has no GPU code)"},
    }
    record.write_text(json.dumps({"gpu": {"driver_floor": "575.51.03", "coverage": coverage}}))
    facts = imagefacts.from_labels(LABELS, (), imagefacts.record_coverage(record))
    assert set(facts.kernels) == {"vllm._C_stable_libtorch", "vllm._flashkda_C", "vllm._fa3_C"}
    assert any("2 cells this tool cannot read" in n for n in facts.notes)
    assert facts.status("9.0") == "sass" and facts.status("10.3") == "ptx-jit-only"
    assert facts.serves("12.0") == imagefacts.Coverage("partial", ("vllm._flashkda_C",), True)
    assert facts.serves("8.0") == imagefacts.Coverage("none", (), True)  # no kernel for major 8
    assert imagefacts.from_labels({}).status("7.0") is None
    odd = imagefacts.from_labels(
        {**LABELS, contract.LABEL_DRIVER_FLOOR: "soon", contract.LABEL_GPU_FAMILIES: "9.0a 10.3f sm_100"}
    )
    assert odd.floor is None and odd.families == ("9.0a", "10.3f") and len(odd.notes) == 2  # variants kept
    assert imagefacts.record_coverage(tmp_path / "missing.json") == {}


def _archive(tmp_path, files: dict[str, str]):
    path = tmp_path / "k3-evidence.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"k3-evidence-x/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_the_host_context_reads_the_evidence_archive(tmp_path):
    uname = "Linux gh 6.8.0-1027-nvidia-64k #30 SMP PREEMPT_DYNAMIC aarch64 aarch64 aarch64 GNU/Linux\n"
    ctx = hostctx.gather(SMI / "r575-h100.txt", _archive(tmp_path, {"uname.txt": uname}), "driver_version,name")
    assert (ctx.machine, ctx.machine_from, ctx.columns) == (
        "aarch64",
        "k3-evidence.tar.gz: uname.txt",
        ("driver_version", "name"),
    )
    assert hostctx.gather(SMI / "r575-h100.txt", None, None).machine is None  # a capture may come from elsewhere
    assert hostctx.gather(None, None, None).machine  # doctor runs here: this machine's
    (tmp_path / "bad.tar.gz").write_bytes(b"not a tar")
    with pytest.raises(ConfigError, match="not a readable `build evidence` archive"):
        hostctx.gather(None, tmp_path / "bad.tar.gz", None)


@pytest.mark.parametrize(
    "sample,labels,code",
    [
        ("b300-r595-table.txt", {**LABELS, contract.LABEL_GPU_FAMILIES: "9.0a 10.0a"}, 1),
        ("b300-r595-table.txt", LABELS, 0),  # sm_100 SASS runs on 10.3
        ("r575-h100.txt", LABELS, 0),
        ("r590-h100-mig-L.txt", LABELS, 1),
        ("nvml-unknown-error.txt", LABELS, 1),
        ("garbage.txt", LABELS, 2),
    ],
)
def test_build_doctor_exit_codes_on_a_fake_registry(sample, labels, code, monkeypatch, capsys):
    engine = FakeEngine()
    ref = _push(engine, labels)
    monkeypatch.setattr("builder.commands.doctor.docker_engine", lambda: engine)
    with pytest.raises(SystemExit) as info:
        main(["doctor", "--image", ref, "--nvidia-smi-file", str(SMI / sample)])
    assert info.value.code == code, capsys.readouterr()
    out = capsys.readouterr().out
    if code != 2:
        assert "verdict: " in out and (code == 0) == out.startswith("compatible")


def test_what_is_nvidia_smis_and_what_is_the_shells():
    loader = "nvidia-smi: error while loading shared libraries: libnvidia-ml.so.1: cannot open shared object file"
    assert diag("x", text=loader + "\n").facts["fault"] == "no-nvml-library"  # nvidia-smi ran: a broken host
    other = (
        "nvidia-smi: error while loading shared libraries: libfoo.so.1: cannot open shared object file: No such file"
    )
    assert diag("x", text=other + "\n").facts["fault"] == "unknown-error"
    for shell in ("bash: /usr/bin/nvidia-smi: No such file or directory", "sh: 1: nvidia-smi: not found"):
        with pytest.raises(ConfigError):
            diag("x", text=shell + "\n")


def test_notes_say_what_was_not_compared():
    d = diag("r590-h100-version.txt")  # --version names no GPU
    assert "this nvidia-smi output names no GPU: the image's GPU coverage is not checked" in d.notes[0]
    assert any(n.startswith("the host's CPU architecture is unknown (give --evidence ARCHIVE") for n in d.notes)
    assert not any("CPU architecture" in n for n in diag("r575-h100.txt", ctx=HostContext("x86_64", "u")).notes)


def test_more_shapes_of_the_same_states():
    header = "| NVIDIA-SMI 610.43.02   KMD Version: 610.43.02   CUDA UMD Version: Not Found |\n"
    assert compat.parse_smi(header).vgpu == "manager"  # an R610 vGPU manager's table
    assert diag("x", text=header).name == "vgpu-manager"
    assert diag("x", text="Failed to initialize NVML: Driver Not Loaded\n").facts["fault"] == "no-driver"
    wddm = (SMI / "win-r591-rtx2080s-q.txt").read_text()
    tcc_q = wddm.replace(
        "Current                                        : WDDM", "Current                                        : TCC"
    )
    assert tcc_q != wddm and diag("x", text=tcc_q).name == "windows-tcc"
    tcc_csv = "name, driver_version, driver_model.current, compute_cap\nNVIDIA L40S, 555.85, TCC, 8.9\n"
    assert diag("x", text=tcc_csv).name == "windows-tcc"


def test_names_outside_the_table_and_cut_in_mid_entry():
    assert gpus.identify("Tesla K20c").klass == "data-center"  # not in the table: the Tesla brand
    assert gpus.identify("NVIDIA GeForce MX450").klass == "consumer"  # nor this: the GeForce brand
    assert gpus.identify("Quadro M1000M...").klass == "consumer"  # cut, and in no entry: the brand still shows
    assert gpus.identify("NVIDIA Tesla...").ccs == () and gpus.identify("NVIDIA Tesla...").klass == "data-center"
    assert gpus.identify("NVIDIA GeForce RTX 4090 Laptop G...").cc == "8.9"  # cut after the entry and a space
    assert gpus.identify("NVIDIA A100-SXM4-4...").cc == "8.0"  # cut after the entry and a dash
    assert gpus.identify("NVIDIA A10...").describe() == "NVIDIA A10... (cc 8.0/8.6, unknown)"
    assert gpus.identify("NVIDIA Graphics Device").describe() == "NVIDIA Graphics Device (cc ?, unknown)"
    assert gpus.identify("NVIDIA H100 80GB HBM3").describe() == "NVIDIA H100 80GB HBM3 (cc 9.0, data-center)"

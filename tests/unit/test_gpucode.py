"""The gpucode probe and the GPU-code rules on real binaries: cubins and PTX NVRTC 12.9 makes here,
fatbins nvcc 13 makes (compressed and not), NCCL 2.30.7 (CUDA 12.9: passes) and vLLM 0.30.0's
CUDA 13 wheel (fails, naming CUDA 13 code), each cross-checked against cuobjdump's listing."""

from __future__ import annotations

import collections
import shutil
from pathlib import Path

import pytest

from builder.checks import gpurules
from tests.unit import gpuassets, gpuhost

CUDA129 = (12, 9)
SITE = "venv/lib/python3.12/site-packages"


def probe(*roots: Path, cuda_home: str | None = None, env: dict | None = None) -> dict:
    """The facts gpu_code judges, read on the host; the probe's header listing agrees with them."""
    found = gpuhost.read(*roots, cuda_home=cuda_home, env=env)
    assert found["mismatches"] == [], found["mismatches"]
    return found


def objects(found: dict, path: Path) -> list[dict]:
    return found["files"][str(path)]["objects"]


def listing(found: dict, path: Path) -> collections.Counter:
    """The probe's entries as cuobjdump lists them: "ELF sm_100" for SASS (cuobjdump names family
    cubins by their generic arch), "PTX sm_90" for PTX."""
    out: collections.Counter = collections.Counter()
    for o in objects(found, path):
        kind = "ELF" if o["kind"] == "SASS" else "PTX"
        arch = f"sm_{o['sm']}" + (o["variant"] if o["variant"] == "a" and kind == "ELF" else "")
        out[f"{kind} {arch}"] += o["count"]
    return out


def test_nvrtc_12_9_cubins_and_ptx_a_f_generic_and_their_toolkit(tmp_path):
    for arch in ("sm_80", "sm_90a", "sm_100a", "sm_100f", "sm_103a", "sm_120"):
        (tmp_path / f"k3_{arch}.cubin").write_bytes(gpuassets.nvrtc(arch))
    (tmp_path / "k3.ptx").write_bytes(gpuassets.nvrtc("compute_90", ptx=True))
    found = probe(tmp_path)
    got = {Path(p).name: o for p, e in found["files"].items() for o in e["objects"]}
    assert {n: (o["arch"], o.get("toolkit"), o["abi"]) for n, o in got.items() if n.endswith(".cubin")} == {
        # ptxas 12.9 writes ELF ABI 7 and no toolkit note below sm_100, ABI 8 with tkinfo from sm_100
        "k3_sm_80.cubin": ("sm_80", None, 7),
        "k3_sm_90a.cubin": ("sm_90a", None, 7),
        "k3_sm_100a.cubin": ("sm_100a", "12.9", 8),
        "k3_sm_100f.cubin": ("sm_100f", "12.9", 8),  # f from tkinfo's "-arch sm_100f"
        "k3_sm_103a.cubin": ("sm_103a", "12.9", 8),
        "k3_sm_120.cubin": ("sm_120", "12.9", 8),
    }
    assert got["k3_sm_80.cubin"]["toolkit_from"] == "no note"
    assert (got["k3.ptx"]["kind"], got["k3.ptx"]["arch"], got["k3.ptx"]["isa"]) == ("PTX", "compute_90", "8.8")
    result = gpurules.floor(found, CUDA129, {})
    assert result.problems == [] and result.cuda == (12, 9) and result.unknown == {"no note": 2}
    assert gpurules.driver_for(result.cuda) == ("575.51.03", True)


@pytest.mark.parametrize("compress", ["-compress-all", "-compress=false"])
def test_nvcc_13_fatbin_in_an_extension_equals_cuobjdump(tmp_path, compress):
    gencode = []
    for virt, real in (("80", "80"), ("90a", "90a"), ("100f", "100f"), ("103a", "103a")):
        gencode += ["-gencode", f"arch=compute_{virt},code=sm_{real}"]
    gencode += ["-gencode", "arch=compute_90,code=compute_90"]
    site = tmp_path / SITE / "k3x"
    site.mkdir(parents=True)
    ext = gpuassets.nvcc13(site / "_C.abi3.so", "-shared", "-Xcompiler", "-fPIC", *gencode, "-Xfatbin", compress)
    found = probe(tmp_path)
    assert listing(found, ext) == collections.Counter(gpuassets.listed(ext))
    # nvcc puts two containers in the section; each has one entry per arch
    arches = {(o["arch"], o["count"]) for o in objects(found, ext)}
    assert arches == {("sm_80", 2), ("sm_90a", 2), ("sm_100f", 2), ("sm_103a", 2), ("compute_90", 1)}
    compressed = compress == "-compress-all"
    assert all(o["compressed"] == compressed for o in objects(found, ext))
    sass = [o for o in objects(found, ext) if o["kind"] == "SASS"]
    # compressed (ZSTD, 0x8000, nvcc 13's default) or not, every cubin is read: its own note names CUDA 13.0
    assert {o["arch"]: (o.get("toolkit"), o.get("toolkit_from")) for o in sass} == {
        arch: ("13.0", "tkinfo") for arch in ("sm_80", "sm_90a", "sm_100f", "sm_103a")
    }
    result = gpurules.floor(found, CUDA129, {})
    text = "; ".join(result.problems)
    assert "PTX compute_90 of PTX ISA 9.0 (CUDA 13.0), newer than CUDA 12.9" in text
    assert "sm_90a x2 built by CUDA 13" in text
    waived = gpurules.floor(found, CUDA129, {"*/k3x/*": "a CUDA 13 extension on purpose"})
    assert waived.problems == [] and len(waived.waived) == len(result.problems)
    table = gpurules.coverage(found, {"k3x._C": ("8.0", "9.0", "10.0", "10.3", "12.0")}, (), (12, 9))
    assert table["k3x._C"] == {
        "8.0": "SASS sm_80",
        "9.0": "SASS sm_90a",
        "10.0": "SASS sm_100f",
        "10.3": "SASS sm_100f sm_103a",
        "12.0": "none (has PTX compute_90 ISA 9.0, SASS sm_100f, SASS sm_103a, SASS sm_80, SASS sm_90a)",
    }


def test_nccl_2_30_7_cuda_12_9_passes_and_equals_cuobjdump():
    lib = gpuassets.wheel("nvidia-nccl-cu12", "2.30.7") / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    found = probe(lib.parent)
    assert listing(found, lib) == collections.Counter(gpuassets.listed(lib))
    by_arch = collections.Counter()
    for o in objects(found, lib):
        by_arch[o["arch"]] += o["count"]
    assert by_arch == {
        "sm_60": 28,
        "sm_61": 28,
        "sm_70": 28,
        "sm_80": 28,
        "sm_90": 28,
        "sm_100": 28,
        "sm_100f": 10,
        "sm_120": 28,
        "compute_120": 27,
    }
    assert {o["isa"] for o in objects(found, lib) if o["kind"] == "PTX"} == {"8.8"}
    result = gpurules.floor(found, CUDA129, {})
    assert result.problems == [] and result.cuda == (12, 9), result.problems
    assert gpurules.driver_for(result.cuda) == ("575.51.03", True)
    # LZ4 (0x2000), decoded: cubins below sm_100 carry no note (ptxas 12.9), the rest say 12.9 in tkinfo
    assert all(o["compressed"] and not o.get("unread") for o in objects(found, lib)), objects(found, lib)
    assert {o.get("toolkit") for o in objects(found, lib) if o["kind"] == "SASS" and o["sm"] >= 100} == {"12.9"}
    below_100 = sum(o["count"] for o in objects(found, lib) if o["kind"] == "SASS" and o["sm"] < 100)
    assert below_100 == 140 and result.unknown == {"no note": below_100}


def test_vllm_0_30_0_cuda_13_wheel_fails_naming_cuda_13(tmp_path):
    member = gpuassets.wheel_member("vllm", "0.30.0", "manylinux_2_28_x86_64", "vllm/_flashkda_C.abi3.so")
    ext = tmp_path / SITE / "vllm" / "_flashkda_C.abi3.so"
    ext.parent.mkdir(parents=True)
    shutil.copy(member, ext)
    found = probe(tmp_path)
    assert listing(found, ext) == collections.Counter(gpuassets.listed(ext))
    assert {o["arch"] for o in objects(found, ext)} == {"sm_90a", "sm_100f", "sm_120f"}
    result = gpurules.floor(found, CUDA129, {})
    # its cubins are ZSTD-compressed: decoded, each one's own tkinfo note says CUDA 13.0 (before, only
    # sm_90a was caught, by inference from its ELF ABI; the family cubins' toolkit was unknown)
    assert result.problems == [
        f"{ext}: SASS {arch} built by CUDA 13.0 (tkinfo), not CUDA 12" for arch in ("sm_100f", "sm_120f", "sm_90a")
    ]
    table = gpurules.coverage(found, {"vllm._flashkda_C": ("9.0", "10.0", "10.3", "12.0")}, (), CUDA129)
    assert table["vllm._flashkda_C"]["10.3"] == "SASS sm_100f"  # CUDA 13's family cubins load on B300


def _triton(root: Path, ptxas: Path, blackwell: Path | None = None) -> Path:
    bindir = root / SITE / "triton" / "backends" / "nvidia" / "bin"
    bindir.mkdir(parents=True)
    shutil.copy(ptxas, bindir / "ptxas")
    if blackwell:
        shutil.copy(blackwell, bindir / "ptxas-blackwell")
    return bindir


def test_the_assembler_triton_selects_and_a_ptxas_newer_than_12_9(tmp_path):
    ptxas13 = gpuassets.NVCC13.parent / "ptxas"
    if not ptxas13.exists():
        pytest.skip(f"no CUDA 13 ptxas at {ptxas13}")
    ptxas129 = gpuassets.wheel("nvidia-cuda-nvcc-cu12", "12.9.86") / "nvidia" / "cuda_nvcc" / "bin" / "ptxas"
    bindir = _triton(tmp_path, ptxas129, ptxas13)
    found = probe(tmp_path)
    assert found["assemblers"][str(bindir / "ptxas")]["version"] == "12.9.86"
    assert found["assemblers"][str(bindir / "ptxas-blackwell")]["version"].startswith("13.0.")
    chosen = {s["archs"]: (s["path"], s["set"]) for s in found["selected"]}
    assert chosen == {"<100": (str(bindir / "ptxas"), False), ">=100": (str(bindir / "ptxas-blackwell"), False)}
    (problem,) = gpurules.floor(found, CUDA129, {}).problems
    assert "ptxas-blackwell is ptxas/nvcc 13.0" in problem and "TRITON_PTXAS_BLACKWELL_PATH unset" in problem
    # the override the cu129 image sets: the toolkit's ptxas for Blackwell
    fixed = probe(tmp_path, env={"TRITON_PTXAS_BLACKWELL_PATH": str(ptxas129)})
    assert gpurules.floor(fixed, CUDA129, {}).problems == []
    assert {s["archs"]: s["path"] for s in fixed["selected"]}[">=100"] == str(ptxas129)


def test_loading_rules():
    def sass(arch, sm, variant=""):
        return {"kind": "SASS", "arch": arch, "sm": sm, "variant": variant}

    def ptx(sm, isa, variant=""):
        return {"kind": "PTX", "arch": f"compute_{sm}{variant}", "sm": sm, "variant": variant, "isa": isa}

    jit = (12, 9)
    assert gpurules.loads_on(sass("sm_100a", 100, "a"), (10, 0), jit)
    assert not gpurules.loads_on(sass("sm_100a", 100, "a"), (10, 3), jit)
    assert gpurules.loads_on(sass("sm_100f", 100, "f"), (10, 3), jit)
    assert not gpurules.loads_on(sass("sm_103f", 103, "f"), (10, 0), jit)
    assert gpurules.loads_on(sass("sm_80", 80), (8, 6), jit) and not gpurules.loads_on(sass("sm_80", 80), (9, 0), jit)
    assert not gpurules.loads_on(sass("sm_100f", 100, "f"), (12, 0), jit)
    assert gpurules.loads_on(ptx(80, "8.8"), (12, 0), jit)  # PTX JITs across majors
    assert not gpurules.loads_on(ptx(80, "9.0"), (12, 0), jit)  # ...if the driver knows its ISA
    assert not gpurules.loads_on(ptx(90, "8.8", "a"), (10, 0), jit)
    assert gpurules.loads_on(ptx(100, "8.8", "f"), (10, 3), jit) and not gpurules.loads_on(
        ptx(100, "8.8", "f"), (12, 0), jit
    )
    assert gpurules.cuda_of_driver("575.51.03") == (12, 9) and gpurules.cuda_of_driver("570.26") == (12, 0)
    assert gpurules.driver_for((12, 8)) == ("575.51.03", False) and gpurules.driver_for((13, 1)) == (None, False)
    assert (
        gpurules.module_of(
            "/opt/k3/venv/lib/python3.12/site-packages/vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so"
        )
        == "vllm.third_party.deep_gemm._C"
    )


def test_verify_holds_the_record_s_gpu_block_to_the_matrix():
    import dataclasses
    import types

    from builder.config.gpu import GpuCode
    from builder.records import verify
    from tests.unit.test_records import GPU, _record

    claim = GpuCode(
        families={"9.0": "H100", "10.0": "B200", "10.3": "B300"}, required={"vllm._C": "all"}, driver_floor="575.51.03"
    )

    def row(gpu, checks="passed", target_gpu=claim):
        v = verify.Verifier.__new__(verify.Verifier)
        v.t = types.SimpleNamespace(gpu=target_gpu)
        v._record = dataclasses.replace(_record(), gpu=gpu, checks=checks)
        return v._gpu_record()

    assert row(GPU) == "; GPU floor 575.51.03 <= 575.51.03, 3 families covered"
    assert row(None, checks="skipped") == "; GPU code not checked (--no-checks)"
    for broken, message in (
        ({**GPU, "driver_floor": "570.26"}, "gpu.driver_floor 570.26 != matrix 575.51.03"),
        ({**GPU, "families": ["9.0", "10.0"]}, "gpu.families"),
        ({**GPU, "derived_floor": "580.65.06"}, "gpu.derived_floor 580.65.06 exceeds the claimed 575.51.03"),
        (
            {**GPU, "coverage": {"vllm._C": {**GPU["coverage"]["vllm._C"], "10.3": "none (has SASS sm_100a)"}}},
            "vllm._C on 10.3",
        ),
        (None, "lacks the gpu block"),
    ):
        with pytest.raises(verify._Fail, match=message):
            row(broken)
    with pytest.raises(verify._Fail, match="claims no GPU code"):
        row(GPU, target_gpu=None)


def test_the_record_and_the_summary_carry_what_the_checks_proved():
    from builder.commands.build import gpu_summary
    from builder.pipeline.publish import gpu_record
    from tests.unit.test_records import GPU

    facts = {"gpu": {k: v for k, v in GPU.items() if k != "coverage"}, "gpu_coverage": GPU["coverage"]}
    assert gpu_record(facts) == GPU and gpu_record({}) is None
    assert (
        gpu_summary(GPU) == "GPU floor 575.51.03 (CUDA 12.9) <= 575.51.03, 9.0 10.0 10.3: 3/3 extension x family served"
    )


def test_entries_of_other_kinds_are_listed_not_judged():
    found = {
        "files": {"/x/site-packages/k/_C.so": {"objects": [{"kind": "kind 4", "arch": "sm_90", "sm": 90, "count": 3}]}}
    }
    result = gpurules.floor(found, CUDA129, {})
    assert (result.problems, result.unknown, result.cuda) == ([], {}, (0, 0))
    assert gpurules.coverage(found, {"k._C": ("9.0",)}, (), CUDA129) == {"k._C": {"9.0": "none (has kind 4 sm_90)"}}

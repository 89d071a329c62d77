"""The smoke's GPU code: its CMake picks each kernel's archs as vLLM's does, and its device pass
(builder/smoke_assets/src/tools/nvrtc_fatbin.py) gives an extension whose fat binary NVIDIA's own
cuobjdump reads.

The arch selection runs the smoke's CMake lines in script mode (`cmake -P`, the machine's cmake).
The device pass runs NVRTC 12.9 from PyPI's wheel and is read by PyPI's cuobjdump (tests/nvidia_tools.py).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from builder.smoke import smoke
from tests import nvidia_tools

SRC = smoke.ASSETS / "src"
CMAKELISTS = SRC / "CMakeLists.txt.in"


def _cmake_script(script: str) -> str:
    """What `cmake -P` prints (message() goes to stderr) for ``script``."""
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("no cmake on this machine")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "script.cmake"
        path.write_text("cmake_minimum_required(VERSION 3.25)\n" + script)
        proc = subprocess.run([cmake, "-P", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def _selection(arch_list: list[str], cuda: str) -> dict[str, list[str]]:
    """CUDA_ARCHS and each kernel's archs, from CMakeLists.txt's own selection lines."""
    text = CMAKELISTS.read_text()
    start = text.index("include(${CMAKE_CURRENT_LIST_DIR}/cmake/utils.cmake)")
    block = text[start : text.index("# End of the arch selection")].replace("${CMAKE_CURRENT_LIST_DIR}", str(SRC))
    script = (
        f'set(CMAKE_CUDA_COMPILER_VERSION {cuda})\nset(ENV{{TORCH_CUDA_ARCH_LIST}} "{" ".join(arch_list)}")\n{block}'
        'foreach(v CUDA_ARCHS RMS_NORM_ARCHS FUSED_ADD_RMS_NORM_ARCHS)\n  message("${v}=${${v}}")\nendforeach()\n'
    )
    found = re.findall(r"^(\w+)=(.*)$", _cmake_script(script), re.M)
    return {k: v.split(";") if v else [] for k, v in found}


def test_the_smoke_arch_list_has_a_generic_an_arch_specific_and_a_family_arch():
    forms = {re.sub(r"[0-9.]", "", a) for a in smoke.ARCH_LIST}
    assert forms == {"", "a", "f"}, smoke.ARCH_LIST


def test_below_cuda_13_the_sm90plus_kernel_takes_the_a_list_and_10_3_only_through_10_3f():
    got = _selection(smoke.ARCH_LIST, "12.9.1")
    assert sorted(got["CUDA_ARCHS"]) == ["10.0", "10.3f", "8.0", "9.0a"]
    assert sorted(got["RMS_NORM_ARCHS"]) == ["10.0", "8.0+PTX", "9.0a"]
    assert sorted(got["FUSED_ADD_RMS_NORM_ARCHS"]) == ["10.0a", "10.3f", "9.0a"]
    # vLLM's B300 gap, reproduced: without 10.3 in the list the `a` list has nothing for 10.3.
    dropped = _selection([a for a in smoke.ARCH_LIST if not a.startswith("10.3")], "12.9.1")
    assert sorted(dropped["FUSED_ADD_RMS_NORM_ARCHS"]) == ["10.0a", "9.0a"]


def test_from_cuda_13_the_sm90plus_kernel_takes_the_family_list():
    got = _selection(smoke.ARCH_LIST, "13.0.1")
    assert sorted(got["FUSED_ADD_RMS_NORM_ARCHS"]) == ["10.0f", "9.0a"]


def test_loose_intersection_gives_vllms_documented_results():
    """The examples in vLLM 0.30.0's cmake/utils.cmake comment, and its a/f rules (each expected
    value is what vLLM's own function gives, run in script mode from its sdist)."""
    cases = {
        ("7.5;8.0;8.6;9.0;9.0a", "8.0;8.9;9.0"): "9.0a;8.0;8.6",
        ("8.0+PTX", "9.0"): "8.0+PTX",
        ("9.0a;10.0a;10.3a;12.0a", "9.0;10.0;12.0"): "9.0a;10.0a;12.0a",
        # 10.0f takes 10.0; 10.3 gets nothing of its own (sm_100f loads there).
        ("9.0a;10.0f;12.0f", "9.0;10.0;10.3;12.0"): "9.0a;10.0f;12.0f",
        ("10.0f", "10.3a"): "10.3a",
        ("12.0f", "12.1a"): "12.1a",
        # A suffixed target keeps its suffix; 10.3f takes the highest plain 10.x below it.
        ("8.0;9.0;10.0", "9.0a;10.3f"): "9.0a;10.0",
    }
    lines = [f"include({SRC}/cmake/utils.cmake)"]
    for i, (src, tgt) in enumerate(cases):
        lines.append(f'cuda_archs_loose_intersection(out "{src}" "{tgt}")\nmessage("{i}=${{out}}")')
    got = dict(re.findall(r"^(\d+)=(.*)$", _cmake_script("\n".join(lines) + "\n"), re.M))
    assert {k: got[str(i)] for i, k in enumerate(cases)} == cases


@pytest.fixture(scope="module")
def wheels() -> Path:
    return nvidia_tools.unpacked()


def _device_pass(site: Path, out: Path, kernel: str, archs: list[str]) -> Path:
    proc = subprocess.run(
        [
            sys.executable,
            str(SRC / "tools" / "nvrtc_fatbin.py"),
            "--source",
            str(SRC / "csrc" / "cuda" / f"{kernel}.cu"),
        ]
        + ["--name", kernel, "--archs", ",".join(archs), "--out-dir", str(out), "--cubin-dir", str(out / "cubins")],
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    return out / f"{kernel}.fatbin.c"


@pytest.fixture(scope="module")
def extension(wheels, tmp_path_factory) -> tuple[Path, Path]:
    """A shared library linked from the smoke's two host stubs, as k3smoke._C is, and the cubin dir."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on this machine")
    out = tmp_path_factory.mktemp("kernels")
    got = _selection(smoke.ARCH_LIST, smoke.CUDA)
    stubs = [
        _device_pass(wheels, out, "rms_norm", got["RMS_NORM_ARCHS"]),
        _device_pass(wheels, out, "fused_add_rms_norm", got["FUSED_ADD_RMS_NORM_ARCHS"]),
    ]
    (out / "main.c").write_text("int k3_entry(void) { return 0; }\n")
    so = out / "_C.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(so), str(out / "main.c"), *map(str, stubs)],
        check=True,
    )
    return so, out / "cubins"


def test_cuobjdump_lists_every_cubin_and_the_ptx_of_the_extension(wheels, extension):
    so, _ = extension
    listing = nvidia_tools.cuobjdump(wheels, "-lelf", "-lptx", str(so))
    # -lelf names an sm_103f cubin sm_103; the full dump below gives its real arch.
    assert re.findall(r"^(ELF|PTX) file\s+\d+: _C\.\d+\.(\w+)\.(?:cubin|ptx)$", listing, re.M) == [
        ("ELF", "sm_90a"), ("ELF", "sm_100"), ("ELF", "sm_80"), ("PTX", "sm_80"),
        ("ELF", "sm_100a"), ("ELF", "sm_90a"), ("ELF", "sm_103"),
    ], listing  # fmt: skip
    dump = nvidia_tools.cuobjdump(wheels, str(so))
    entries = re.findall(r"Fatbin (elf|ptx) code:\s*=+\s*arch = (\w+)\s*code version = \[(\d+),(\d+)\]", dump)
    assert entries == [
        ("elf", "sm_90a", "1", "7"), ("elf", "sm_100", "1", "8"), ("elf", "sm_80", "1", "7"),
        ("ptx", "sm_80", "8", "8"), ("elf", "sm_100a", "1", "8"), ("elf", "sm_90a", "1", "7"),
        ("elf", "sm_103f", "1", "8"),
    ], dump  # fmt: skip
    ptx = nvidia_tools.cuobjdump(wheels, "-ptx", str(so))
    assert re.search(r"^\.version 8\.8$", ptx, re.M) and re.search(r"^\.target sm_80$", ptx, re.M), ptx[:500]


def test_the_extension_has_nvccs_two_sections(extension):
    so, _ = extension
    sections = subprocess.run(["readelf", "-SW", str(so)], capture_output=True, text=True, check=True).stdout
    assert re.search(r"\.nv_fatbin\s+PROGBITS\s+\S+\s+\S+\s+\S+\s+00\s+A\s", sections), sections
    assert re.search(r"\.nvFatBinSegment\s+PROGBITS\s+\S+\s+\S+\s+0+30\s+00\s+WA\s", sections), sections


def test_the_standalone_cubins_are_cuda_12_9_sass_for_their_arch(wheels, extension):
    _, cubins = extension
    names = sorted(p.name for p in cubins.glob("*.cubin"))
    assert names == [
        "fused_add_rms_norm.sm_100a.cubin", "fused_add_rms_norm.sm_103f.cubin", "fused_add_rms_norm.sm_90a.cubin",
        "rms_norm.sm_100.cubin", "rms_norm.sm_80.cubin", "rms_norm.sm_90a.cubin",
    ]  # fmt: skip
    for path in cubins.glob("*.cubin"):
        data = path.read_bytes()
        assert data[:4] == b"\x7fELF" and int.from_bytes(data[18:20], "little") == 190  # EM_CUDA
        arch = path.name.split(".")[1]
        if data[8] >= 8:  # ELF ABI 8 (sm_100 and later): .note.nv.tkinfo names the toolkit and options
            assert b"Cuda compilation tools, release 12.9, V12.9.86" in data, path.name
            assert f"-arch {arch} ".encode() in data, path.name
        else:  # ABI 7 (sm_80, sm_90a): no toolkit note at all, as from ptxas 12.9 (tried here)
            assert b".note.nv.tkinfo" not in data and b"Cuda compilation tools" not in data, path.name
        listing = nvidia_tools.cuobjdump(wheels, "-lelf", str(path))
        assert listing.strip().startswith("ELF file    1:"), listing


def test_the_device_pass_maps_cmake_archs_to_nvcc_gencodes_and_refuses_others():
    tool = SRC / "tools" / "nvrtc_fatbin.py"
    sys.path.insert(0, str(tool.parent))
    try:
        import nvrtc_fatbin  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tool.parent))
    assert nvrtc_fatbin.gencodes(["9.0a", "8.0+PTX", "10.3f"]) == ["sm_90a", "sm_80", "compute_80", "sm_103f"]
    with pytest.raises(SystemExit, match="not an arch"):
        nvrtc_fatbin.gencodes(["sm_90"])


def test_a_kernel_that_does_not_compile_fails_the_device_pass_with_nvrtcs_log(wheels, tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text('extern "C" __global__ void k(float *x) { x[0] = undeclared; }\n')
    proc = subprocess.run(
        [sys.executable, str(SRC / "tools" / "nvrtc_fatbin.py"), "--source", str(bad), "--name", "bad"]
        + ["--archs", "9.0a", "--out-dir", str(tmp_path), "--cubin-dir", str(tmp_path / "cubins")],
        env={"PYTHONPATH": str(wheels), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and "compiling bad.cu for sm_90a" in proc.stderr and "undeclared" in proc.stderr
    assert not (tmp_path / "bad.fatbin.c").exists()

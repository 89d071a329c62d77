"""The check logic on facts shaped like the probe's, and on a stand-in for testinfra's host (the
real probe and commands run in the integration tests, on real images)."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import hashlib
import inspect
import io
import json
import tarfile
from pathlib import Path

import pytest

from builder.checks import checklist, checklist_gpu, checklist_image, checklist_runtime, imagefiles, probes
from builder.checks import runner as checks
from builder.config import contract, matrix
from builder.config.gpu import GpuCode
from builder.config.matrix import Extensions
from builder.deps import lock, oslock
from builder.engine.seam import ImageConfig
from builder.errors import BuildError, CheckFailed, SourceError
from builder.fsutil import sha256_bytes, sha256_file
from builder.source import extensions
from tests.conftest import REPO

CUDA12 = {
    "/opt/k3/venv/lib/python3.12/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12": {
        "real": "x",
        "version": 12090,
        "error": None,
    }
}


def _expect(**kw) -> checks.Expectations:
    base = dict(
        target="t",
        cuda_version="12.9.1",
        modules=extensions.ModulePlan(("vllm._C_stable_libtorch",), (), ()),
        ops=("torch.ops._C.rms_norm",),
        pins={"nvidia-nccl-cu12": "2.30.7"},
        labels={"io.k3-cu129.owner": "o@e.org"},
        expires=dt.date(2027, 6, 30),
        build_date=dt.date(2026, 11, 29),
        today=dt.date(2026, 11, 29),
        warning_days=45,
        horizon_days=270,
        lock={"torch": "2.13.0+cu129", "nvidia-nccl-cu12": "2.30.7"},
        overrides=frozenset({"nvidia-nccl-cu12"}),
        source_package=("vllm", "0.30.0"),
    )
    base.update(kw)
    return checks.Expectations(**base)


def _facts(**kw):
    base = {
        "errors": {},
        "uid": 2000,
        "libs": dict(CUDA12),
        "version_json": "12.9.1",
        "dists": [["torch", "2.13.0+cu129"], ["nvidia-nccl-cu12", "2.30.7"], ["vllm", "0.30.0"]],
        "modules": {"vllm._C_stable_libtorch": None},
        "ops": {"torch.ops._C.rms_norm": None},
        "absent": {},
        "libcuda": None,
        "torch": {"version": "2.13.0+cu129", "cuda": "12.9"},
    }
    base.update(kw)
    # what the modules' imports mapped: the image's libcudart copies unless a test says otherwise
    base.setdefault("mapped", [p for p in base["libs"] or {} if "libcudart.so" in p][:1])
    return base


def _image(labels=None, env=None, user="2000:2000"):
    return ImageConfig(
        ref="r",
        id="i",
        labels=labels or {},
        env=env or {"CUDA_VERSION": "12.9.1"},
        user=user,
        entrypoint=("vllm", "serve"),
    )


class _Ran:
    def __init__(self, rc=0, stdout="", stderr=""):
        self.rc, self.stdout, self.stderr = rc, stdout, stderr


TOOLCHAIN_OK = (
    "cc=/usr/bin/gcc\nincludepy=/usr/include/python3.12\npython_h=yes\npyinclude=/usr/include/python3.12\n"
    "cc_link=yes\ncc_python=yes\nnvcc_version=12.9\nnvcc_compile=yes\nnvcc_headers=yes\n"
    "TRITON_PTXAS_PATH=ok\nTRITON_PTXAS_BLACKWELL_PATH=ok\n"
)

# What the other probes report on a correct image.
TREES_OK = {
    "setup": {},
    "trees": {"vllm.third_party": None},
    "imported": {"vllm.third_party": None, "vllm.third_party.triton_kernels.topk": None},
    "skipped": {"vllm.third_party.fmha_sm100.cute.test_x": "vllm.third_party.fmha_sm100.cute.*"},
}
ELF_OK = {"elves": 3, "unresolved": [], "other_major": [], "preloaded": 12, "ld_cache": 40}
# The files probe's answer for an image that holds the source's vllm/ (data files included).
SITE = "/opt/k3/venv/lib/python3.12/site-packages"
FILES_OK = {
    "root": f"{SITE}/vllm",
    "files": {"vllm/__init__.py": False, "vllm/utils/numa_wrapper.sh": True, "vllm/configs/E=8.json": False},
}

HYGIENE_OK = {
    "links": 2,
    "files": 40,
    "dangling": [],
    "outside": [],
    "named": [],
    "counts": {"dangling": 0, "outside": 0, "named": 0},
}
RECIPE_OK = {
    "parse": None,
    "validate": None,
    "options": {"tool_call_parser": None, "load_format": None},
    "architecture": None,
}
RECIPE = {
    "command": "vllm serve m --tool-call-parser kimi_k3",
    "argv": ["m", "--tool-call-parser", "kimi_k3"],
    "parser": "a:b",
    "parser_class": "a:C",
    "validator": None,
    "resolve": {"tool_call_parser": "a:T", "load_format": "a:L"},
    "architecture": "K3",
    "architecture_resolver": "a:R",
}


# cu129's OS packages as the check gets them (from locks/cu129/os-packages.txt and the matrix).
OS_OK = checks.OsExpectations(
    locked=(("libibverbs1", "39.0-1", "amd64"), ("libnuma1", "2.0.14-3ubuntu2", "amd64")),
    listed=("libibverbs1", "libnuma1"),
    loads=("libibverbs.so.1", "libnuma.so.1"),
    runs=(("numactl", "--show"),),
)


class FakeHost:
    """testinfra's host as the checks use it: ``run(command, *args)`` -> rc, stdout, stderr.
    Answers like a correct cu129 image unless told otherwise; records every call."""

    def __init__(self, pip=(0, ""), find="", toolchain=(0, TOOLCHAIN_OK), probe=None, os_probe=None, **probes):
        self.pip, self.find, self.toolchain, self.probe = pip, find, toolchain, probe
        self.probes = copy.deepcopy(
            {
                "trees": TREES_OK,
                "elf": ELF_OK,
                "hygiene": HYGIENE_OK,
                "recipe": RECIPE_OK,
                "files": FILES_OK,
                "gpucode": GPU_OK,
            }
        )
        self.probes.update(probes)
        self.os_probe = os_probe if os_probe is not None else {"problems": [], "checked": len(OS_OK.locked)}
        self.calls: list[tuple[str, tuple]] = []
        self.files = image_files()  # the host's reading of the image (the image_files fixture)
        # the GPU code the host reads is what the probe lists (the same objects: a break changes both)
        self.files.gpu = dict(self.probes["gpucode"]["files"])

    def run(self, command, *args):
        self.calls.append((command, args))
        if args and args[0] == probes.script("os"):
            request = json.loads(args[1])
            assert request["locked"] == [list(x) for x in OS_OK.locked] and request["runs"] == [["numactl", "--show"]]
            assert request["status_dir"] == contract.OS_STATUS_DIR
            return _Ran(0, "apt says hi\n" + probes.MARKER + json.dumps(self.os_probe) + "\n")
        if args and args[0] == probes.pip_script():
            return _Ran(*self.pip)
        if "sh -c %s" in command:
            return _Ran(*self.toolchain)
        if f"{probes.PYTHON} -c %s %s" in command:
            name = next(n for n in probes.NAMES if probes.script(n) == args[0])
            doc = self.probe if name == "facts" else self.probes[name]
            if doc is None:
                return _Ran(1, "", "Traceback (most recent call last):\nno python")
            return _Ran(0, "vLLM says hello on stdout\n" + probes.MARKER + json.dumps(doc) + "\n")
        raise AssertionError(f"unexpected command {command!r}")


_EXT = "/opt/k3/venv/lib/python3.12/site-packages/vllm/_C_stable_libtorch.abi3.so"
# The gpucode probe's facts for a correct image: Hopper SASS, family Blackwell SASS, PTX 8.8 for the rest.
GPU_OK = {
    "files": {
        _EXT: {
            "shape": "elf",
            "objects": [
                {"kind": "SASS", "arch": "sm_90a", "sm": 90, "variant": "a", "toolkit": "12.9", "count": 2},
                {"kind": "SASS", "arch": "sm_100f", "sm": 100, "variant": "f", "toolkit": "12.9", "count": 2},
                {"kind": "PTX", "arch": "compute_80", "sm": 80, "variant": "", "isa": "8.8", "count": 1},
            ],
        }
    },
    "errors": {},
    "assemblers": {
        "/opt/k3/venv/lib/python3.12/site-packages/triton/backends/nvidia/bin/ptxas": {"version": "12.8.93"}
    },
    "selected": [
        {
            "compiler": "/opt/k3/venv/lib/python3.12/site-packages/triton",
            "archs": "<100",
            "path": "/opt/k3/venv/lib/python3.12/site-packages/triton/backends/nvidia/bin/ptxas",
            "variable": "TRITON_PTXAS_PATH",
            "set": False,
        }
    ],
    "scanned": 10,
}
GPU = GpuCode(
    families={"8.0": "A100", "9.0": "H100", "10.0": "B200", "10.3": "B300"},
    required={"vllm._C_stable_libtorch": "all"},
    driver_floor="575.51.03",
)
GPU_LABELS = {contract.LABEL_DRIVER_FLOOR: "575.51.03", contract.LABEL_GPU_FAMILIES: "8.0 9.0 10.0 10.3"}

LABELS = {
    "io.k3-cu129.owner": "o@e.org",
    contract.OCI_REVISION: "c" * 40,
    contract.OCI_VERSION: "0.30.0+cu129",
    contract.OCI_CREATED: "2026-11-29T00:00:00Z",
    contract.LABEL_EXPIRES: "2027-06-30",
}


# The checks of checklist.py (the fake host answers their probes); checklist_image.py's checks
# have their own tests (tests/unit/test_checks_image.py).
# The checks the fake host can answer: checklist.py and checklist_gpu.py (the whole-image checks of
# checklist_image.py run their probes on real files: tests/unit/test_checks_image.py).
BASE_CHECKS = [n for n in contract.CHECKS if hasattr(checklist, f"test_{n}") or hasattr(checklist_gpu, f"test_{n}")]


def _correct():
    """(facts, expectations, image, host) of an image that holds every check."""
    e = _expect(
        labels=dict(LABELS),
        cuda_home="/usr/local/cuda",
        nvcc_arch="sm_75",
        python_trees=("vllm.third_party",),
        python_skip={"vllm.third_party.fmha_sm100.cute.*": "own root"},
        recipe=dict(RECIPE),
        os_packages=OS_OK,
        package="vllm",
        package_files={"vllm/__init__.py": False, "vllm/utils/numa_wrapper.sh": True, "vllm/configs/E=8.json": False},
        gpu=GPU,
    )
    image = _image(labels=LABELS | GPU_LABELS, env={"CUDA_VERSION": "12.9.1", "CUDA_HOME": "/usr/local/cuda"})
    return _facts(), e, image, FakeHost(probe=_facts())


def _run_all(f, e, image, host) -> tuple[list[str], list[str]]:
    """Call every check of the checklist with the fixtures it asks for; (names run, warnings)."""
    warnings: list[str] = []
    ran = []
    for name in BASE_CHECKS:
        _call(name, _fixtures(f, e, image, host, warnings.append))
        ran.append(name)
    return ran, warnings


ELF_SO = b"\x7fELF\x02\x01\x01" + bytes(9) + b"\x03\x00\x3e\x00" + bytes(44)  # x86-64 ET_DYN header


def _module(path: str, head: bytes = ELF_SO) -> imagefiles.Entry:
    return imagefiles.Entry(path, "file", 0o644, 0, 0, 4096, head)


def image_files(**extra: imagefiles.Entry) -> imagefiles.ImageFiles:
    """The host's reading of a correct image: its compiled module an ELF shared object, a
    non-root user in /etc/passwd; ``extra`` entries by path."""
    runtimes = {path: _module(path) for path in CUDA12}
    entries = {_EXT: _module(_EXT), **runtimes, **{path: entry for path, entry in extra.items()}}
    return imagefiles.ImageFiles(entries, {"/etc/passwd": b"root:x:0:0::/root:/bin/sh\nk3:x:2000:2000::/:/bin/sh\n"})


class _Present(imagefiles.ImageFiles):
    """The host's reading where every CUDA runtime a probe names is a loadable ELF (the tests that
    judge versions; tests/unit/test_hostile_image.py judges the reading itself)."""

    def runtime_problem(self, path, platform):
        return None


PRESENT = _Present()


def _fixtures(f, e, image, host, warn, facts: dict | None = None) -> dict:
    """The fixtures the runner's plugin hands the checks, gpu_found gathered on first use."""
    fixtures = {
        "image_files": host.files,
        "facts": f,
        "expect": e,
        "image": image,
        "image_host": host,
        "pip_dir": "/tmp/k3-check-pip",
        "report_warning": warn,
        "record_fact": ({} if facts is None else facts).__setitem__,
    }
    return fixtures


def _call(name: str, fixtures: dict) -> None:
    test = getattr(checklist, f"test_{name}", None) or getattr(checklist_gpu, f"test_{name}")
    params = inspect.signature(test).parameters
    try:
        if "gpu_found" in params:
            fixtures["gpu_found"] = checklist_gpu.gpu_found.__wrapped__(
                fixtures["image_host"], fixtures["image"], fixtures["expect"], fixtures["image_files"]
            )
        test(**{p: fixtures[p] for p in params})
    except pytest.skip.Exception as exc:  # a skip inside this test would pass it: it is a failure here
        raise AssertionError(f"check {name} skipped: {exc}") from None


def test_a_correct_cu129_image_passes():
    f, e, image, host = _correct()
    ran, warnings = _run_all(f, e, image, host)
    assert ran == BASE_CHECKS and len(ran) == 20  # every check ran, none skipped
    assert warnings == [
        "python_trees: skipped 1 module(s) matching vllm.third_party.fmha_sm100.cute.*: own root",
        "gpu_code: derived driver floor 575.51.03 (CUDA 12.9: PTX ISA 8.8 (PTX compute_80) in "
        f"{_EXT}) <= claimed 575.51.03",
    ]
    commands = " ".join(c for c, _ in host.calls)
    assert "check --disable-pip-version-check" in commands and "sh -c %s" in commands
    assert "find / " not in commands  # no_world_writable reads the exported file system on the host


@pytest.mark.parametrize("name", sorted(BASE_CHECKS))
def test_each_check_can_fail_on_an_otherwise_correct_image(name):
    """One break per check (unit-level twin of the integration variants): that check fails, and it
    says what it expected."""
    f, e, image, host = _correct()
    breaks = {
        "cuda_runtime": lambda: f.update(libs={"/x/libcudart.so.12": {"version": 12080}}),
        "no_other_cuda_major": lambda: f["libs"].update({"/usr/lib/libcublas.so.13": {"real": "x"}}),
        "compiled_modules": lambda: f.update(modules={"vllm._C_stable_libtorch": "ImportError: gone"}),
        "ops_registered": lambda: f.update(ops={"torch.ops._C.rms_norm": "AttributeError: no op"}),
        # the matrix pin moved, the image (and its lock) did not
        "pinned_versions": lambda: dataclasses.replace(e, pins={"nvidia-nccl-cu12": "2.30.8"}),
        "expiry": lambda: image.labels.update({contract.LABEL_EXPIRES: "2027-06-29"}),
        "labels": lambda: image.labels.update({contract.OCI_REVISION: "d" * 40}),
        "lock_contents": lambda: f["dists"].append(["extra", "1.0"]),
        "pip_check": lambda: setattr(
            host, "pip", (1, "vllm 0.30.0 has requirement numpy<2, but you have numpy 2.2.0.")
        ),
        "non_root": lambda: f.update(uid=0),
        "no_world_writable": lambda: host.files.entries.update(
            {"/opt/k3/venv/bin/vllm": imagefiles.Entry("/opt/k3/venv/bin/vllm", "file", 0o777, 0, 0, 9)}
        ),
        "runtime_toolchain": lambda: setattr(host, "toolchain", (0, TOOLCHAIN_OK.replace("cc_link=yes", "cc_link=no"))),
        "python_trees": lambda: host.probes["trees"]["imported"].update(
            {"vllm.vllm_flash_attn.cute.interface": "ModuleNotFoundError: No module named 'flash_attn'"}
        ),
        "shared_libraries": lambda: host.probes.update(
            elf={
                **ELF_OK,
                "unresolved": [
                    {
                        "path": "/opt/k3/venv/lib/python3.12/site-packages/torchcodec/libtorchcodec_core8.so",
                        "needed": "libavcodec.so.61",
                        "dist": "torchcodec 0.17.0",
                    }
                ],
            }
        ),
        "image_hygiene": lambda: host.probes.update(
            hygiene={
                **HYGIENE_OK,
                "dangling": [
                    [
                        "/opt/k3/venv/lib/python3.12/site-packages/vllm/vllm_flash_attn/cute",
                        "/third_party/fa/flash_attn/cute",
                    ]
                ],
                "counts": {"dangling": 1, "outside": 0, "named": 0},
            }
        ),
        "package_files": lambda: host.probes["files"]["files"].pop("vllm/configs/E=8.json"),
        "recipe_cli": lambda: host.probes.update(
            recipe={
                **RECIPE_OK,
                "options": {
                    "tool_call_parser": "'kimi_k9': KeyError: \"Tool parser 'kimi_k9' not found.\"",
                    "load_format": None,
                },
            }
        ),
        "os_packages": lambda: host.os_probe["problems"].append("numactl: /usr/bin/numactl missing (No such file)"),
        "gpu_code": lambda: host.probes["gpucode"]["files"][_EXT]["objects"].append(
            {"kind": "PTX", "arch": "compute_90", "sm": 90, "variant": "", "isa": "9.0", "count": 1}
        ),
        # the Blackwell cubins arch-specific (10.0a) instead of family, and no PTX: B300 (10.3) gets nothing
        "gpu_coverage": lambda: host.probes["gpucode"]["files"][_EXT].update(
            objects=[
                GPU_OK["files"][_EXT]["objects"][0],
                {**GPU_OK["files"][_EXT]["objects"][1], "arch": "sm_100a", "variant": "a"},
            ]
        ),
    }
    assert set(breaks) == set(BASE_CHECKS)
    e = breaks[name]() or e
    with pytest.raises(AssertionError, match="expected"):
        _run_all(f, e, image, host)
    failed = []
    for check in BASE_CHECKS:
        try:
            _run_one(check, f, e, image, host)
        except AssertionError:
            failed.append(check)
    assert failed == [name]


def _run_one(check, f, e, image, host):
    _call(check, _fixtures(f, e, image, host, lambda m: None))


def test_the_probe_runs_with_the_compat_driver_and_asks_for_what_the_matrix_names():
    e = _expect(absent={"torch.ops._C.fused": "CUDA 13 only"}, compat_dir="/opt/compat")
    host = FakeHost(probe=_facts())
    assert checklist.facts.__wrapped__(host, e) == _facts()  # what vLLM printed on stdout is ignored
    ((command, args),) = host.calls
    assert command == "LD_LIBRARY_PATH=/opt/compat${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} python -I -S -c %s %s"
    assert args[0] == probes.script("facts")
    assert json.loads(args[1]) == {
        "modules": ["vllm._C_stable_libtorch"],
        "ops": ["torch.ops._C.rms_norm"],
        "absent": ["torch.ops._C.fused"],
    }
    # A probe that died shows its own error, not only its exit status.
    with pytest.raises(
        pytest.fail.Exception,
        match=r"expected the facts probe to run in the image, found exit 1 "
        r"and no facts: Traceback \(most recent call last\): \| no python",
    ):
        checklist.facts.__wrapped__(FakeHost(probe=None), e)


def test_a_fact_the_probe_could_not_gather_fails_only_its_own_checks():
    """A libcudart without cudaRuntimeGetVersion (a stub) once crashed the whole probe and failed
    seven checks with '^^'; now the probe records it under its fact and only the checks that read
    that fact fail, saying what was found."""
    f, e, image, host = _correct()
    f["libs"]["/opt/stub/libcudart.so.12"] = {
        "real": "x",
        "version": None,
        "error": "AttributeError: undefined symbol: cudaRuntimeGetVersion",
    }
    _run_all(f, e, image, host)  # the real 12.9 runtime is still found: nothing fails
    f, e, image, host = _correct()
    f["errors"]["dists"], f["dists"] = "PermissionError: /opt/k3/venv/lib", None
    failed = []
    for check in BASE_CHECKS:
        try:
            _run_one(check, f, e, image, host)
        except AssertionError as exc:
            failed.append(check)
            assert "expected the probe to gather dists, found PermissionError" in str(exc)
    assert failed == ["no_other_cuda_major", "pinned_versions", "lock_contents"]


def test_the_real_facts_probe_survives_a_stub_libcudart(tmp_path, monkeypatch):
    """The probe itself, on this machine: a libcudart.so.12 that lacks cudaRuntimeGetVersion is
    recorded with its error instead of raising."""
    import shutil
    import subprocess
    import sys

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on this machine")
    src = tmp_path / "stub.c"
    src.write_text("int k3_nothing(void) { return 0; }\n")
    lib = tmp_path / "libcudart.so.12"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    sys.path.insert(0, str(probes.HERE))
    try:
        import facts as probe  # the probe file as a module
    finally:
        sys.path.pop(0)
    from builder.checks.probes import _cuda  # prepended to facts.py at run time (probes.PRELUDES)

    monkeypatch.setattr(probe, "runtime_version", _cuda.runtime_version, raising=False)
    version, error = probe.cudart_version(str(lib))
    assert version is None and "cudaRuntimeGetVersion" in error


def test_pypi_cuda13_torch_is_caught():
    # What `pip install torch==2.14.1` from PyPI brings: a CUDA 13 build and its unsuffixed wheels.
    f = _facts(
        dists=[["torch", "2.14.1"], ["cuda-toolkit", "13.0.3"], ["nvidia-nccl-cu13", "2.28.9"]],
        torch={"version": "2.14.1", "cuda": "13.0"},
    )
    with pytest.raises(AssertionError, match=r"expected torch.version.cuda == 12.9, found 13.0"):
        checklist.test_cuda_runtime(f, _expect(), _image(), PRESENT)
    with pytest.raises(AssertionError) as info:
        checklist.test_no_other_cuda_major(f, _expect(), lambda m: None)
    assert "cuda-toolkit 13.0.3" in str(info.value) and "nvidia-nccl-cu13" in str(info.value)
    f = _facts(torch={"version": "2.13.0+cu130", "cuda": "13.0"})
    with pytest.raises(AssertionError, match=r"torch 2.13.0\+cu130"):
        checklist.test_no_other_cuda_major(f, _expect(), lambda m: None)


def test_other_major_exceptions_are_shown_not_skipped():
    f = _facts(
        dists=[
            ["torch", "2.13.0+cu129"],
            ["nvidia-cutlass-dsl-libs-cu13", "4.7.1"],
            ["nvidia-cuda-nvdisasm", "13.5.37"],
            ["nvidia-curand", "10.4.0.35"],
        ]
    )
    reasons = {"nvidia-cutlass-dsl-libs-cu13": "needed by cudnn-frontend", "nvidia-cuda-nvdisasm": "a tool"}
    warnings = []
    with pytest.raises(AssertionError) as info:
        checklist.test_no_other_cuda_major(f, _expect(other_major=reasons), warnings.append)
    # curand 10.x unsuffixed exists only for CUDA 13: no reason given, so it fails
    assert "nvidia-curand 10.4.0.35" in str(info.value) and "cutlass" not in str(info.value)
    assert len(warnings) == 2 and all("allowed by the matrix" in w for w in warnings)
    assert any("needed by cudnn-frontend" in w for w in warnings)


def test_absent_ops_must_stay_absent_and_required_ones_present():
    e = _expect(absent={"torch.ops._C.fused_kda_decode": "CUDA >= 13 only"})
    warnings = []
    checklist.test_ops_registered(
        _facts(absent={"torch.ops._C.fused_kda_decode": "AttributeError: no op"}), e, warnings.append
    )
    assert any("absent as the matrix expects: CUDA >= 13 only" in w for w in warnings)
    with pytest.raises(AssertionError, match="found them registered: torch.ops._C.fused_kda_decode"):
        checklist.test_ops_registered(_facts(absent={"torch.ops._C.fused_kda_decode": None}), e, lambda m: None)
    with pytest.raises(AssertionError, match="found missing: torch.ops._C.rms_norm"):
        checklist.test_ops_registered(
            _facts(ops={"torch.ops._C.rms_norm": "AttributeError"}, absent={}), _expect(), lambda m: None
        )


def test_a_module_that_needs_the_driver_says_where_libcuda_was_looked_for():
    f = _facts(
        modules={"vllm._C_stable_libtorch": "ImportError: libcuda.so.1: cannot open shared object file"},
        libcuda="libcuda.so.1: cannot open shared object file",
    )
    with pytest.raises(AssertionError, match="could not be loaded from /usr/local/cuda/compat"):
        checklist.test_compiled_modules(f, _expect(), image_files())


def test_cuda_version_mismatches_say_expected_and_found():
    f = _facts(libs={"/usr/local/cuda/lib64/libcudart.so.12": {"version": 12080}})
    with pytest.raises(AssertionError, match=r"expected cudaRuntimeGetVersion\(\) == 12090 .*found 12080"):
        checklist.test_cuda_runtime(f, _expect(), _image(), PRESENT)
    with pytest.raises(AssertionError, match="expected CUDA_VERSION 12.9.x, found 13.0.1"):
        checklist.test_cuda_runtime(_facts(), _expect(), _image(env={"CUDA_VERSION": "13.0.1"}), PRESENT)
    with pytest.raises(AssertionError, match="found none"):
        checklist.test_cuda_runtime(_facts(libs={}), _expect(), _image(), PRESENT)


def test_pins_and_lock_contents_name_the_difference():
    f = _facts(dists=[["torch", "2.13.0+cu129"], ["nvidia-nccl-cu12", "2.27.5"], ["vllm", "0.30.0"], ["extra", "1"]])
    with pytest.raises(AssertionError, match="nvidia-nccl-cu12: expected 2.30.7, found 2.27.5"):
        checklist.test_pinned_versions(f, _expect())
    with pytest.raises(AssertionError) as info:
        checklist.test_lock_contents(f, _expect())
    assert "extra 1: not in the lock" in str(info.value)
    assert "nvidia-nccl-cu12: expected 2.30.7 (lock), found 2.27.5" in str(info.value)


def test_expiry_rules():
    e = _expect()
    checklist.test_expiry(_image({"io.k3-cu129.expires": "2027-06-30"}), e, lambda m: None)
    with pytest.raises(AssertionError, match="found it missing"):
        checklist.test_expiry(_image({}), e, lambda m: None)
    with pytest.raises(pytest.fail.Exception, match="ISO date"):
        checklist.test_expiry(_image({"io.k3-cu129.expires": "next year"}), e, lambda m: None)
    with pytest.raises(AssertionError, match="has expired"):
        checklist.test_expiry(_image({"io.k3-cu129.expires": "2026-11-28"}), e, lambda m: None)
    with pytest.raises(AssertionError, match="at most 270 days after the build"):
        checklist.test_expiry(
            _image({"io.k3-cu129.expires": "2027-09-30"}), _expect(expires=dt.date(2027, 9, 30)), lambda m: None
        )
    warnings = []
    checklist.test_expiry(
        _image({"io.k3-cu129.expires": "2027-06-30"}), _expect(today=dt.date(2027, 6, 1)), warnings.append
    )
    assert warnings and "expires in 29 days" in warnings[0]


def test_root_user_fails():
    with pytest.raises(AssertionError, match="non-root"):
        checklist.test_non_root(_image(user=""), _facts(), image_files())


def test_module_plan_from_vllm_style_setup():
    setup = b"""
if _is_cuda():
    ext_modules.append(CMakeExtension(name="vllm.cumem_allocator"))
    ext_modules.append(CMakeExtension(name="vllm._flashmla_C", optional=True))
if _is_hip():
    ext_modules.append(CMakeExtension(name="vllm._rocm_C"))
"""
    rust = b"""
def rust_extensions(*, optional=False):
    return [RustExtension(target="vllm.vllm-rs", path="x", optional=optional),
            RustExtension(target="vllm._rust_tool_parser", path="y", optional=optional)]
"""
    policy = Extensions(
        add=("vllm._C_stable_libtorch",), waive={"vllm._rocm_C": "ROCm only", "vllm.vllm-rs": "not built"}
    )
    plan = extensions.plan({"setup.py": setup, "tools/build_rust.py": rust}, policy)
    assert plan.required == ("vllm._C_stable_libtorch", "vllm.cumem_allocator")
    assert plan.optional == ("vllm._flashmla_C", "vllm._rust_tool_parser")  # a computed optional= is optional
    assert plan.waived == (("vllm._rocm_C", "ROCm only"), ("vllm.vllm-rs", "not built"))
    with pytest.raises(SourceError, match="does not exist at the pinned commit"):
        extensions.plan({"setup.py": setup, "tools/build_rust.py": None}, policy)
    with pytest.raises(SourceError, match="cannot parse"):
        extensions.declared(b"def (:")


def test_junit_report_must_hold_every_check(tmp_path):
    report = tmp_path / "checks.xml"
    report.write_text('<testsuites><testsuite><testcase name="test_expiry"/></testsuite></testsuites>')
    with pytest.raises(BuildError, match="checks missing from the report"):
        checks._parse_junit(report)


def test_every_contract_check_has_a_test():
    names = [
        n.removeprefix("test_")
        for m in (checklist, checklist_gpu, checklist_image, checklist_runtime)
        for n in dir(m)
        if n.startswith("test_")
    ]
    assert sorted(names) == sorted(checks.contract.CHECKS)  # each once, in one of the four modules
    assert all(Path(p).exists() for p in checks.CHECKLISTS) and checks.CHECKLISTS[0] == checks.CHECKLIST
    assert checks.CHECKLIST_GPU in checks.CHECKLISTS


# --- expiry ---------------------------------------------------------------------------------------


def _expiry(label, warnings=None, **kw):
    labels = {} if label is None else {contract.LABEL_EXPIRES: label}
    checklist.test_expiry(_image(labels), _expect(**kw), (warnings if warnings is not None else []).append)


def test_expiring_exactly_today_still_passes_and_warns():
    warnings = []
    _expiry("2027-06-30", warnings, today=dt.date(2027, 6, 30))
    assert warnings == ["io.k3-cu129.expires 2027-06-30: expires in 0 days (warning window 45 days)"]
    with pytest.raises(AssertionError, match=r"found 2027-06-30 \(today 2027-07-01\): the image has expired"):
        _expiry("2027-06-30", today=dt.date(2027, 7, 1))


def test_no_warning_outside_the_window_and_one_on_its_first_day():
    warnings = []
    _expiry("2027-06-30", warnings, today=dt.date(2027, 5, 15))  # 46 days left, window 45
    assert warnings == []
    _expiry("2027-06-30", warnings, today=dt.date(2027, 5, 16))  # 45 days left: inside
    assert warnings == ["io.k3-cu129.expires 2027-06-30: expires in 45 days (warning window 45 days)"]


def test_a_label_that_differs_from_the_matrix_date_fails():
    for label in ("2027-06-29", "2027-05-01"):
        with pytest.raises(
            AssertionError,
            match=rf"expected label io.k3-cu129.expires = 2027-06-30 \(matrix\), "
            rf"found {label}",
        ):
            _expiry(label)


def test_the_horizon_counts_from_the_build_date():
    build = dt.date(2026, 11, 29)
    edge = build + dt.timedelta(days=270)
    _expiry(edge.isoformat(), expires=edge, build_date=build)  # exactly at the horizon
    late = edge + dt.timedelta(days=1)
    with pytest.raises(
        AssertionError,
        match=rf"at most 270 days after the build \({edge.isoformat()}\), "
        rf"found {late.isoformat()}",
    ):
        _expiry(late.isoformat(), expires=late, build_date=build)


def test_missing_and_malformed_expiry_labels():
    with pytest.raises(AssertionError, match="expected label io.k3-cu129.expires = 2027-06-30, found it missing"):
        _expiry(None)
    with pytest.raises(AssertionError, match="found it missing"):
        _expiry("")
    for bad in ("2027-02-30", "30.06.2027", "2027-06-30T00:00:00"):
        with pytest.raises(pytest.fail.Exception, match=r"ISO date \(YYYY-MM-DD\), found"):
            _expiry(bad)


# --- labels ---------------------------------------------------------------------------------------


def test_labels_equal_to_the_matrix_pass_and_extra_ones_are_fine():
    e = _expect(labels=dict(LABELS))
    checklist.test_labels(_image({**LABELS, "com.example.extra": "x"}), e)


def test_a_wrong_or_missing_label_fails_naming_each():
    e = _expect(labels=dict(LABELS))
    wrong = {**LABELS, "io.k3-cu129.owner": "someone@else.org"}
    del wrong[contract.OCI_REVISION]
    with pytest.raises(AssertionError) as info:
        checklist.test_labels(_image(wrong), e)
    assert str(info.value).splitlines()[0] == (
        "io.k3-cu129.owner: expected 'o@e.org', found 'someone@else.org'; "
        f"org.opencontainers.image.revision: expected {'c' * 40!r}, found '(missing)'"
    )
    with pytest.raises(AssertionError, match="org.opencontainers.image.version: expected '0.30.0\\+cu129', found ''"):
        checklist.test_labels(_image({**LABELS, contract.OCI_VERSION: ""}), e)


def test_the_expiry_label_belongs_to_the_expiry_check_only():
    checklist.test_labels(_image({**LABELS, contract.LABEL_EXPIRES: "2020-01-01"}), _expect(labels=dict(LABELS)))


# --- non-root -------------------------------------------------------------------------------------


@pytest.mark.parametrize("user", ["", "0", "0:0", "root", "root:root", "0:2000"])
def test_a_root_user_label_fails(user):
    with pytest.raises(AssertionError, match="expected a non-root default user, found"):
        checklist.test_non_root(_image(user=user), _facts(), image_files())


def test_the_uid_the_container_really_runs_as_must_not_be_0():
    checklist.test_non_root(_image(user="vllm"), _facts(uid=2000), image_files())
    with pytest.raises(AssertionError, match="expected the container to run as non-root, found uid 0"):
        checklist.test_non_root(_image(user="vllm"), _facts(uid=0), image_files())  # a name that resolves to uid 0


# --- pinned versions and skips ---------------------------------------------------------------------


def test_pinned_versions_is_skipped_without_pins_and_checks_every_pin():
    with pytest.raises(pytest.skip.Exception, match="the target pins no FlashInfer or NCCL"):
        checklist.test_pinned_versions(_facts(), _expect(pins={}))
    e = _expect(pins={"nvidia-nccl-cu12": "2.30.7", "flashinfer-python": "0.6.18"})
    with pytest.raises(AssertionError) as info:
        checklist.test_pinned_versions(_facts(), e)
    assert str(info.value).splitlines()[0] == "flashinfer-python: expected 0.6.18, found not installed"
    f = _facts(dists=[["FlashInfer_Python", "0.6.18"], ["nvidia-nccl-cu12", "2.30.7"]])
    checklist.test_pinned_versions(f, e)  # names are normalized


def test_ops_registered_is_skipped_when_the_matrix_names_no_ops():
    warnings = []
    e = _expect(ops=(), modules=extensions.ModulePlan(("m",), ("opt",), ()))
    with pytest.raises(pytest.skip.Exception, match="names no ops"):
        checklist.test_ops_registered(_facts(modules={"m": None, "opt": "ImportError: x"}, ops={}), e, warnings.append)
    assert warnings == ["optional module opt does not import: ImportError: x"]


# --- pip check ------------------------------------------------------------------------------------


def test_pip_check_runs_pip_from_the_copy_and_passes_on_exit_0():
    host = FakeHost()
    checklist.test_pip_check(host, "/tmp/k3-check-pip", _expect(), lambda m: None)
    ((command, args),) = host.calls
    # isolated like the probes: PYTHONPATH is ignored under -I, so pip's copy is an argument
    assert command == "python -I -S -c %s %s check --disable-pip-version-check --no-color"
    assert args == (probes.pip_script(), "/tmp/k3-check-pip")


def test_pip_check_reports_override_conflicts_and_fails_on_others():
    nccl = "torch 2.13.0+cu129 has requirement nvidia-nccl-cu12==2.27.5, but you have nvidia-nccl-cu12 2.30.7."
    other = "vllm 0.30.0 has requirement numpy<2, but you have numpy 2.2.0."
    warnings = []
    checklist.test_pip_check(FakeHost(pip=(1, nccl + "\n")), "/p", _expect(), warnings.append)
    assert warnings == [f"pip check (expected, matrix override): {nccl}"]
    warnings = []
    with pytest.raises(AssertionError) as info:
        checklist.test_pip_check(FakeHost(pip=(1, f"{nccl}\n\n{other}\n")), "/p", _expect(), warnings.append)
    assert str(info.value).splitlines()[0] == f"expected pip check to pass, found: {other}"
    assert len(warnings) == 1
    with pytest.raises(AssertionError, match="found: k3smoke 0.1.0 requires missing-thing, which is not installed"):
        checklist.test_pip_check(
            FakeHost(pip=(1, "k3smoke 0.1.0 requires missing-thing, which is not installed.")),
            "/p",
            _expect(),
            warnings.append,
        )
    # Without the matrix override the NCCL conflict is a conflict like any other.
    with pytest.raises(AssertionError, match="nvidia-nccl-cu12"):
        checklist.test_pip_check(FakeHost(pip=(1, nccl)), "/p", _expect(overrides=frozenset()), warnings.append)


# --- world-writable -------------------------------------------------------------------------------


def _files(*members: tuple[str, str, int]) -> imagefiles.ImageFiles:
    """The host's reading of a tar stream holding ``members`` (name, kind, mode), as the engine exports one."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, kind, mode in members:
            info = tarfile.TarInfo(name)
            info.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "link": tarfile.SYMTYPE}[kind]
            info.mode, info.linkname = mode, "x" if kind == "link" else ""
            tar.addfile(info, io.BytesIO(b"") if kind == "file" else None)
    raw.seek(0)
    return imagefiles.read(raw, ("/opt",))


def test_world_writable_paths_are_listed():
    checklist.test_no_world_writable(_files(("opt/a", "file", 0o644), ("tmp", "dir", 0o1777)))
    with pytest.raises(AssertionError, match="found: /opt/a, /opt/b$"):
        checklist.test_no_world_writable(_files(("opt/a", "file", 0o666), ("opt/b", "dir", 0o777)))
    many = [(f"opt/f{i:02d}", "file", 0o646) for i in range(30)]
    with pytest.raises(AssertionError) as info:
        checklist.test_no_world_writable(_files(*many))
    assert "/opt/f19" in str(info.value) and "/opt/f20" not in str(info.value)  # the first 20


def test_world_writable_spares_pseudo_filesystems_links_tmp_and_sticky_dirs():
    found = _files(
        ("./proc/x", "file", 0o666),
        ("sys/y", "dir", 0o777),
        ("dev/shm", "dir", 0o777),
        ("usr/lib/l", "link", 0o777),
        ("tmp", "dir", 0o777),  # /tmp itself, sticky or not
        ("var/tmp", "dir", 0o1777),
        ("var/spool", "dir", 0o1777),
        ("srv", "dir", 0o777),  # no sticky bit
        ("etc/f", "file", 0o1777),  # a sticky file is still a world-writable file
    ).world_writable()
    assert found == ["/etc/f", "/srv"]


# --- run-time toolchain ---------------------------------------------------------------------------


def _toolchain(out=TOOLCHAIN_OK, rc=0, env=None, **kw):
    warnings = []
    e = _expect(**{"cuda_home": "/usr/local/cuda", "nvcc_arch": "sm_75", **kw})
    image = _image(env=env if env is not None else {"CUDA_HOME": "/usr/local/cuda"})
    host = FakeHost(toolchain=(rc, out, "sh: boom"))
    checklist.test_runtime_toolchain(host, image, e, warnings.append)
    return host, warnings


def test_a_complete_toolchain_passes_and_is_asked_for_the_first_arch():
    host, warnings = _toolchain()
    assert warnings == []
    ((command, args),) = host.calls
    assert command == "K3_CHECK_CUDA_HOME=/usr/local/cuda K3_CHECK_ARCH=sm_75 sh -c %s"
    assert args == (checklist.TOOLCHAIN,)


def test_without_a_run_time_cuda_toolkit_nvcc_is_skipped_and_said_so():
    out = TOOLCHAIN_OK.replace("nvcc_version=12.9\nnvcc_compile=yes\n", "")
    host, warnings = _toolchain(out, cuda_home=None, env={})
    assert host.calls[0][0].startswith("K3_CHECK_CUDA_HOME= K3_CHECK_ARCH=")
    assert len(warnings) == 1 and warnings[0].startswith("runtime_toolchain: skipped nvcc")


@pytest.mark.parametrize(
    "old,new,message",
    [
        (
            "cc=/usr/bin/gcc",
            "cc=",
            "no C compiler for Triton's run-time stubs (it looks for $CC, then gcc, then clang)",
        ),
        ("cc_link=yes", "cc_link=no: ld: cannot find -lc", "/usr/bin/gcc cannot compile and link a C program: no: ld"),
        (
            "cc_python=yes\n",
            "",
            "/usr/bin/gcc cannot build a Python extension against /usr/include/python3.12 as Triton does: not tried",
        ),
        ("python_h=yes", "python_h=no", "no Python.h in INCLUDEPY=/usr/include/python3.12"),
        ("nvcc_version=12.9", "nvcc_version=13.0", "nvcc: expected release 12.9, found 13.0"),
        (
            "nvcc_version=12.9",
            "nvcc_version=missing: no executable /usr/local/cuda/bin/nvcc",
            "nvcc: expected release 12.9, found missing: no executable",
        ),
        ("nvcc_version=12.9\n", "", "nvcc: expected release 12.9, found not run"),
        ("nvcc_compile=yes", "nvcc_compile=no: error", "nvcc cannot compile a trivial kernel for sm_75: no: error"),
        (
            "nvcc_headers=yes",
            "nvcc_headers=no: h.cu(2): fatal error: nvrtc.h: No such file",
            "nvcc cannot compile against the run-time JIT headers (cuda_runtime.h, nvrtc.h, curand.h, cublas_v2.h): no: "
            "h.cu(2): fatal error: nvrtc.h",
        ),
        ("TRITON_PTXAS_PATH=ok", "TRITON_PTXAS_PATH=missing: /nope/ptxas", "TRITON_PTXAS_PATH points at no executable"),
        (
            "TRITON_PTXAS_BLACKWELL_PATH=ok",
            "TRITON_PTXAS_BLACKWELL_PATH=missing: /nope/ptxas",
            "TRITON_PTXAS_BLACKWELL_PATH points at no executable: /nope/ptxas",
        ),
    ],
)
def test_each_toolchain_problem_is_named(old, new, message):
    out = TOOLCHAIN_OK.replace(old, new)
    assert out != TOOLCHAIN_OK
    with pytest.raises(AssertionError) as info:
        _toolchain(out)
    text = str(info.value).splitlines()[0]
    assert text.startswith("expected a run-time toolchain, found: ") and message in text


def test_cuda_home_must_be_the_matrixs():
    with pytest.raises(AssertionError, match="CUDA_HOME: expected /usr/local/cuda, found \\(unset\\)"):
        _toolchain(env={})
    with pytest.raises(AssertionError, match="CUDA_HOME: expected /usr/local/cuda, found /opt/cuda"):
        _toolchain(env={"CUDA_HOME": "/opt/cuda"})


def test_a_probe_that_cannot_run_fails():
    with pytest.raises(AssertionError, match="expected the toolchain probe to run, found exit 2: sh: boom"):
        _toolchain(rc=2)


# --- CUDA runtime and other majors ----------------------------------------------------------------


def test_the_loaded_runtime_is_judged_not_any_copy_that_reports_the_right_version():
    # issue 34: a 12.9 copy somewhere in the image used to pass an image whose loaded libcudart is 12.8
    libs = {"/a/libcudart.so.12": {"version": 12080}, "/b/libcudart.so.12": {"version": 12090}}
    with pytest.raises(AssertionError, match=r"from the loaded libcudart, found 12080 at /a/libcudart.so.12$"):
        checklist.test_cuda_runtime(_facts(libs=libs, mapped=["/a/libcudart.so.12"]), _expect(), _image(), PRESENT)
    checklist.test_cuda_runtime(_facts(libs=libs, mapped=["/b/libcudart.so.12"]), _expect(), _image(), PRESENT)
    # none loaded: every readable copy is judged
    with pytest.raises(AssertionError, match="none loaded: every copy"):
        checklist.test_cuda_runtime(_facts(libs=libs, mapped=[]), _expect(), _image(), PRESENT)
    checklist.test_cuda_runtime(_facts(version_json=None, torch=None), _expect(), _image(env={"PATH": "/bin"}), PRESENT)
    with pytest.raises(AssertionError, match="expected /usr/local/cuda/version.json CUDA 12.9, found 12.8.1"):
        checklist.test_cuda_runtime(_facts(version_json="12.8.1"), _expect(), _image(), PRESENT)
    with pytest.raises(AssertionError, match="expected torch to import, found ImportError: libcudnn"):
        checklist.test_cuda_runtime(_facts(torch={"error": "ImportError: libcudnn"}), _expect(), _image(), PRESENT)
    with pytest.raises(AssertionError, match="no loadable libcudart"):
        checklist.test_cuda_runtime(
            _facts(libs={"/a/libcudart.so.12": {"version": None, "error": "x"}}), _expect(), _image(), PRESENT
        )
    # libcublas is no runtime
    with pytest.raises(AssertionError, match="found none in the image"):
        checklist.test_cuda_runtime(_facts(libs={"/a/libcublas.so.12": {"real": "x"}}), _expect(), _image(), PRESENT)


def test_a_renamed_library_is_caught_by_its_name_and_by_its_version():
    renamed = {"/usr/lib/libcudart.so.13": {"version": 12090}}  # a 12.9 library named like CUDA 13
    with pytest.raises(AssertionError, match=r"found: /usr/lib/libcudart.so.13$"):
        checklist.test_no_other_cuda_major(_facts(libs={**CUDA12, **renamed}), _expect(), lambda m: None)
    disguised = {"/usr/lib/libcudart.so.12": {"version": 13000}}  # a 13.0 library named like CUDA 12
    with pytest.raises(AssertionError, match=r"found: /usr/lib/libcudart.so.12 reports 13000$"):
        checklist.test_no_other_cuda_major(_facts(libs={**CUDA12, **disguised}), _expect(), lambda m: None)
    with pytest.raises(AssertionError, match="libcublas.so.11"):
        checklist.test_no_other_cuda_major(_facts(libs={"/l/libcublas.so.11": {}}), _expect(), lambda m: None)


def test_expectations_derive_cuda_numbers():
    e = _expect()
    assert (e.cuda_major, e.cuda_major_minor, e.cudart_version) == (12, "12.9", 12090)
    e13 = _expect(cuda_version="13.0.2")
    assert (e13.cuda_major, e13.cuda_major_minor, e13.cudart_version) == (13, "13.0", 13000)
    assert _expect(cuda_version="12.10").cudart_version == 12100


def test_compiled_modules_need_a_declared_module():
    with pytest.raises(AssertionError, match="expected the source to declare compiled modules, found none"):
        checklist.test_compiled_modules(
            _facts(modules={}), _expect(modules=extensions.ModulePlan((), (), ())), image_files()
        )
    with pytest.raises(AssertionError) as info:
        checklist.test_compiled_modules(
            _facts(modules={"a": "ImportError: x", "b": None, "c": "OSError: y"}),
            _expect(modules=extensions.ModulePlan(("a", "b", "c"), (), ())),
            image_files(**{f"/opt/k3/venv/lib/{m}.abi3.so": _module(f"/opt/k3/venv/lib/{m}.abi3.so") for m in "abc"}),
        )
    assert str(info.value).splitlines()[0] == (
        "expected every compiled module to import, found: a: ImportError: x; c: OSError: y"
    )  # no driver hint


# --- the report: passed, skipped, failed ----------------------------------------------------------


def _junit(tmp_path, cases: dict[str, str]) -> Path:
    body = {
        "pass": "",
        "skip": '<skipped message="the target pins no FlashInfer or NCCL"/>',
        "fail": '<failure message="AssertionError: expected 1, found 2">long</failure>',
        "error": '<error message="fixture broke"/>',
        "skip+error": '<skipped message="s"/><error message="e"/>',
    }
    xml = "".join(f'<testcase name="test_{n}">{body[kind]}</testcase>' for n, kind in cases.items())
    path = tmp_path / "checks.xml"
    path.write_text(f"<testsuites><testsuite>{xml}</testsuite></testsuites>")
    return path


def test_a_finding_past_pytest_s_message_budget_is_read_whole_from_the_report_s_text(tmp_path):
    """pytest cuts a failure's message attribute (to 500 characters in 9.2: shorten_message); the
    element's text, the report whole, gives the finding whole: the operator sees every path."""
    import xml.etree.ElementTree as ET

    from _pytest.junitxml import shorten_message

    finding = "expected no start-up hook, found: " + "; ".join(f"/opt/k3/hook{i}.pth: import os" for i in range(40))
    suite = ET.Element("testsuite")
    for name in contract.CHECKS:
        case = ET.SubElement(suite, "testcase", name=f"test_{name}")
        if name == "startup_hooks":
            whole = f"AssertionError: {finding}"
            failure = ET.SubElement(case, "failure", message=shorten_message(f"{whole}\nassert False"))
            failure.text = f"E   {whole}\n    assert False"
    path = tmp_path / "checks.xml"
    ET.ElementTree(suite).write(path)
    assert len(ET.parse(path).find(".//failure").get("message")) < len(finding)  # this pytest does cut it
    result = next(r for r in checks._parse_junit(path) if r.name == "startup_hooks")
    assert result.message == finding and "/opt/k3/hook39.pth: import os" in result.message


def test_a_skipped_check_is_reported_as_skipped_never_as_passed(tmp_path):
    cases = {n: "pass" for n in contract.CHECKS}
    cases["pinned_versions"] = "skip"
    results = checks._parse_junit(_junit(tmp_path, cases))
    skipped = next(r for r in results if r.name == "pinned_versions")
    assert (skipped.passed, skipped.skipped, skipped.status) == (False, True, "skip")
    assert skipped.message == "the target pins no FlashInfer or NCCL"
    report = checks.Report("img", results)
    assert report.ok and report.failed() == []  # a skip fails nothing...
    assert report.counts() == {"pass": len(contract.CHECKS) - 1, "skip": 1, "FAIL": 0}  # ...and passes nothing
    doc = report.to_json()
    assert {c["name"]: c["status"] for c in doc["checks"]}["pinned_versions"] == "skip"
    assert doc["counts"] == {"pass": len(contract.CHECKS) - 1, "skip": 1, "FAIL": 0}
    with pytest.raises(ValueError):
        checks.CheckResult("x", passed=True, skipped=True)


def test_a_report_of_nothing_but_skips_is_not_ok():
    report = checks.Report("img", [checks.CheckResult(n, False, "why", True) for n in contract.CHECKS])
    assert not report.ok and report.failed() == []
    with pytest.raises(CheckFailed):
        report.raise_for_failures()
    assert not checks.Report("img", []).ok


def test_failures_and_errors_are_failures_with_their_first_line(tmp_path):
    cases = {n: "pass" for n in contract.CHECKS}
    cases.update(expiry="fail", labels="error", pinned_versions="skip+error")
    report = checks.Report("img", checks._parse_junit(_junit(tmp_path, cases)), junit=tmp_path / "checks.xml")
    by_name = {r.name: r for r in report.results}
    assert by_name["expiry"].message == "expected 1, found 2" and by_name["expiry"].status == "FAIL"
    assert by_name["labels"].message == "fixture broke" and by_name["labels"].status == "FAIL"
    assert by_name["pinned_versions"].status == "FAIL"  # an error after a skip is no skip
    assert [r.name for r in report.failed()] == ["pinned_versions", "expiry", "labels"]
    assert not report.ok and report.counts() == {"pass": len(contract.CHECKS) - 3, "skip": 0, "FAIL": 3}
    with pytest.raises(
        CheckFailed,
        match=r"^img: image checks failed: pinned_versions, expiry, labels; the image is "
        r"kept; report: .*checks.xml$",
    ):
        report.raise_for_failures()


def test_an_unreadable_junit_report_is_a_build_error(tmp_path):
    bad = tmp_path / "checks.xml"
    bad.write_text("<testsuites><testsuite>")
    with pytest.raises(BuildError, match="unreadable check report"):
        checks._parse_junit(bad)
    with pytest.raises(BuildError, match="unreadable check report"):
        checks._parse_junit(tmp_path / "missing.xml")


class _Pinned:
    source_date_epoch = 1790029969

    def __init__(self, files):
        self.files = files

    def read(self, path):
        return self.files.get(path)

    def files_under(self, directory):
        return {p: p.endswith(".sh") for p in self.files if p.startswith(directory + "/")}

    def blob_ids_under(self, directory):
        return {
            p: hashlib.sha1(b"blob %d\0" % len(d) + d).hexdigest()
            for p, d in self.files.items()
            if p.startswith(directory + "/")
        }  # noqa: S324


def test_expectations_come_from_the_matrix_the_lock_and_the_source(tmp_path):
    t = matrix.load(REPO / "matrix.yaml").target("cu129")
    body = (
        f"torch==2.13.0+cu129 \\\n    --hash=sha256:{'a' * 64}\n"
        f"nvidia-nccl-cu12==2.30.7 \\\n    --hash=sha256:{'b' * 64}\n    # via torch, --override overrides.txt\n"
    )
    lock_path = tmp_path / "requirements.txt"
    lock_path.write_text(f"{lock.BODY_HEADER}{sha256_bytes(body.encode())}\n{body}")
    setup = b'ext_modules.append(CMakeExtension(name="vllm._C"))\n'
    files = {p: (setup if p == "setup.py" else b"") for p in t.source.extensions.declared_in}
    files.update({"vllm/utils/numa_wrapper.sh": b"", "vllm/__init__.py": b"", "vllmx/other.py": b""})
    deb = oslock.DebEntry(
        "libnuma1", "2.0.14-3ubuntu2", "amd64", "https://snapshot.ubuntu.com/x/libnuma1.deb", 1, "c" * 64
    )
    (tmp_path / contract.OS_LOCK_NAME).write_text(oslock.lock_text(t, [deb]))
    locks = _lockset(lock_path, [deb])
    e = checks.expectations(t, _Pinned(files), locks, dt.date(2026, 11, 29), today=dt.date(2026, 12, 1))
    assert e.os_packages.locked == (("libnuma1", "2.0.14-3ubuntu2", "amd64"),)
    assert (
        e.os_packages.listed == tuple(p.name for p in t.os_packages.packages) and "libnuma.so.1" in e.os_packages.loads
    )
    assert e.pins == {"flashinfer-python": t.flashinfer.version, "nvidia-nccl-cu12": "2.30.7"}
    assert e.lock == {"torch": "2.13.0+cu129", "nvidia-nccl-cu12": "2.30.7"}
    assert e.overrides == frozenset({"nvidia-nccl-cu12"})
    assert e.labels[contract.OCI_CREATED] == "2026-09-21T22:32:49Z"
    assert e.labels[contract.LABEL_LOCK_SHA256] == sha256_file(lock_path)
    assert e.labels[contract.LABEL_OWNER] == t.owner and e.expires == t.expires
    assert (e.today, e.build_date, e.warning_days, e.horizon_days) == (
        dt.date(2026, 12, 1),
        dt.date(2026, 11, 29),
        45,
        270,
    )
    assert e.source_package == ("vllm", "0.30.0+cu129")
    assert e.package == "vllm"
    assert e.package_files == {"vllm/utils/numa_wrapper.sh": True, "vllm/__init__.py": False}
    assert set(e.package_blobs) == set(e.package_files) and e.package_blobs["vllm/__init__.py"] == (
        "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # git's id of the empty blob
    )
    assert e.wheel_records is None  # none given: installed_files says so
    assert e.nvcc_arch == "sm_" + t.cuda.arch_list[0].split("+")[0].replace(".", "")
    assert set(t.source.extensions.add) <= set(e.modules.required) and e.cuda_home == t.runtime.cuda_home
    bare = t.model_copy(update={"flashinfer": None, "nccl": None})
    assert checks.expectations(bare, _Pinned(files), locks, dt.date(2026, 11, 29)).pins == {}
    lock_path.write_text("edited after the build read it\n")  # the checks use the bytes the build read
    assert (
        checks.expectations(t, _Pinned(files), locks, dt.date(2026, 11, 29)).labels[contract.LABEL_LOCK_SHA256]
        == locks.runtime_sha256
    )


def _lockset(lock_path, debs):
    from builder.pipeline.plan import LockSet

    text = lock_path.read_text()
    _, entries = lock.parse_lock(text, lock_path)
    return LockSet(
        lock_path,
        lock_path,
        tuple(entries),
        tuple(entries),
        sha256_bytes(text.encode()),
        sha256_bytes(text.encode()),
        text,
        text,
        lock_path.with_name(contract.OS_LOCK_NAME),
        tuple(debs),
        None,
    )


# --- every message, exactly: what was expected and what was found ---------------------------------


def _message(call, *args) -> str:
    """The first line of the AssertionError a check raises (pytest appends its own explanation)."""
    with pytest.raises(AssertionError) as info:
        call(*args)
    return str(info.value).splitlines()[0]


def test_cuda_runtime_messages():
    libs = {"/b/libcudart.so.12": {"version": 12060}, "/a/libcudart.so.12": {"version": 12080}}
    assert _message(checklist.test_cuda_runtime, _facts(libs=libs, mapped=[]), _expect(), _image(), PRESENT) == (
        "expected cudaRuntimeGetVersion() == 12090 (CUDA 12.9) from the libcudart (none loaded: every copy), "
        "found 12080 at /a/libcudart.so.12, 12060 at /b/libcudart.so.12"
    )
    dead = {"/a/libcudart.so.12": {"version": None}}
    assert _message(
        checklist.test_cuda_runtime, _facts(libs=dead, mapped=["/a/libcudart.so.12"]), _expect(), _image(), PRESENT
    ) == (
        "expected cudaRuntimeGetVersion() == 12090 (CUDA 12.9) from the loaded libcudart, found no loadable libcudart"
    )
    assert _message(checklist.test_cuda_runtime, _facts(libs={}), _expect(), _image(), PRESENT) == (
        "expected a CUDA runtime (libcudart.so) reporting 12090, found none in the image"
    )
    assert (
        _message(
            checklist.test_cuda_runtime,
            _facts(torch={"version": "2.13.0+cu130", "cuda": "13.0"}),
            _expect(),
            _image(),
            PRESENT,
        )
        == "expected torch.version.cuda == 12.9, found 13.0 (torch 2.13.0+cu130)"
    )


def test_no_other_cuda_major_message_lists_everything():
    f = _facts(
        libs={**CUDA12, "/l/libcublas.so.13": {}},
        dists=[["nvidia-nccl-cu13", "2.28.9"]],
        torch={"version": "2.13.0+cu130", "cuda": "13.0"},
    )
    assert _message(checklist.test_no_other_cuda_major, f, _expect(), lambda m: None) == (
        "expected only CUDA 12 libraries and packages, found: /l/libcublas.so.13; distribution nvidia-nccl-cu13 "
        "2.28.9; torch 2.13.0+cu130"
    )


def test_compiled_modules_messages():
    assert _message(
        checklist.test_compiled_modules, _facts(), _expect(modules=extensions.ModulePlan((), (), ())), image_files()
    ) == ("expected the source to declare compiled modules, found none (waive or add them)")
    f = _facts(modules={"vllm._C_stable_libtorch": "ImportError: libcuda.so.1"}, libcuda="libcuda.so.1: no such file")
    assert _message(checklist.test_compiled_modules, f, _expect(compat_dir="/c"), image_files()) == (
        "expected every compiled module to import, found: vllm._C_stable_libtorch: ImportError: libcuda.so.1 "
        "(libcuda.so.1 could not be loaded from /c: libcuda.so.1: no such file)"
    )


def test_ops_registered_messages():
    f = _facts(ops={"torch.ops._C.b": "AttributeError: b", "torch.ops._C.a": "AttributeError: a"})
    e = _expect(ops=("torch.ops._C.a", "torch.ops._C.b"))
    assert _message(checklist.test_ops_registered, f, e, lambda m: None) == (
        "expected every named op to be registered, found missing: torch.ops._C.a (AttributeError: a); "
        "torch.ops._C.b (AttributeError: b)"
    )
    f = _facts(absent={"torch.ops._C.y": None, "torch.ops._C.x": None})
    e = _expect(absent={"torch.ops._C.x": "r", "torch.ops._C.y": "r"})
    assert _message(checklist.test_ops_registered, f, e, lambda m: None) == (
        "expected these ops absent (source.extensions.absent), found them registered: torch.ops._C.x, "
        "torch.ops._C.y; the build now has them: drop them from `absent`"
    )
    # Absent ops alone (no op that must resolve) still run the check.
    warnings = []
    checklist.test_ops_registered(
        _facts(ops={}, absent={"torch.ops._C.x": "AttributeError"}),
        _expect(ops=(), absent={"torch.ops._C.x": "CUDA 13 only"}),
        warnings.append,
    )
    assert warnings == ["ops_registered: torch.ops._C.x absent as the matrix expects: CUDA 13 only"]
    with pytest.raises(pytest.skip.Exception, match="^the matrix names no ops for this target$"):
        checklist.test_ops_registered(_facts(), _expect(ops=(), absent={}), lambda m: None)


def test_pinned_versions_message_and_skip_reason():
    e = _expect(pins={"nvidia-nccl-cu12": "2.30.8", "flashinfer-python": "0.6.18"})
    assert _message(checklist.test_pinned_versions, _facts(), e) == (
        "flashinfer-python: expected 0.6.18, found not installed; nvidia-nccl-cu12: expected 2.30.8, found 2.30.7"
    )
    with pytest.raises(pytest.skip.Exception, match="^the target pins no FlashInfer or NCCL$"):
        checklist.test_pinned_versions(_facts(), _expect(pins={}))


def test_expiry_message_says_what_to_do():
    with pytest.raises(AssertionError) as info:
        _expiry("2026-11-28")
    assert str(info.value).splitlines()[0] == (
        "expected io.k3-cu129.expires not in the past, found 2026-11-28 (today 2026-11-29): the image has expired; "
        "its owner must move hosts to the official image or extend the date in the matrix and rebuild"
    )


def test_lock_contents_messages_for_each_difference():
    e = _expect(lock={"torch": "2.13.0+cu129", "numpy": "2.2.0"}, source_package=("vllm", "0.30.0+cu129"))
    f = _facts(dists=[["torch", "2.13.0"], ["vllm", "0.30.0"], ["extra", "1"]])
    assert _message(checklist.test_lock_contents, f, e) == (
        "expected the environment to equal the lock, found: extra 1: not in the lock; torch: expected 2.13.0+cu129 "
        "(lock), found 2.13.0; vllm: expected 0.30.0+cu129 (the source), found 0.30.0; numpy 2.2.0: in the lock, "
        "not installed"
    )
    f = _facts(dists=[["torch", "2.13.0+cu129"], ["numpy", "2.2.0"]])
    assert _message(checklist.test_lock_contents, f, e) == (
        "expected the environment to equal the lock, found: vllm 0.30.0+cu129: the source's package is not installed"
    )
    checklist.test_lock_contents(
        _facts(dists=[["Torch", "2.13.0+cu129"], ["NumPy", "2.2.0"], ["vllm", "0.30.0+cu129"]]), e
    )


def test_pip_check_message_joins_every_conflict():
    out = "a 1 has requirement b<2, but you have b 3.\nc 1 requires d, which is not installed.\n"
    assert _message(checklist.test_pip_check, FakeHost(pip=(1, out)), "/p", _expect(), lambda m: None) == (
        "expected pip check to pass, found: a 1 has requirement b<2, but you have b 3.; "
        "c 1 requires d, which is not installed."
    )


def test_non_root_message_for_an_unset_user():
    assert _message(checklist.test_non_root, _image(user=""), _facts(), image_files()) == (
        "expected a non-root default user, found (unset: root)"
    )
    assert _message(checklist.test_non_root, _image(user="0:0"), _facts(), image_files()) == (
        "expected a non-root default user, found 0:0"
    )


def test_the_world_writable_message_names_the_paths():
    assert _message(checklist.test_no_world_writable, _files(("a", "file", 0o666), ("b", "file", 0o777))) == (
        "expected no world-writable files outside /tmp, found: /a, /b"
    )


def test_runtime_toolchain_messages_and_values_with_equals_signs():
    out = TOOLCHAIN_OK.replace("cc_link=yes", "cc_link=no: ld: -Wl,--hash-style=gnu failed").replace(
        "TRITON_PTXAS_PATH=ok", "TRITON_PTXAS_PATH=missing: /a=b/ptxas"
    )
    with pytest.raises(AssertionError) as info:
        _toolchain(out)
    assert str(info.value).splitlines()[0] == (
        "expected a run-time toolchain, found: /usr/bin/gcc cannot compile and link a C program: no: ld: "
        "-Wl,--hash-style=gnu failed; TRITON_PTXAS_PATH points at no executable: /a=b/ptxas"
    )
    out = TOOLCHAIN_OK.replace("cc=/usr/bin/gcc\n", "")
    with pytest.raises(AssertionError) as info:
        _toolchain(out)
    assert str(info.value).splitlines()[0] == (
        "expected a run-time toolchain, found: no C compiler for Triton's run-time stubs (it looks for $CC, then gcc, "
        "then clang)"
    )
    _, warnings = _toolchain(TOOLCHAIN_OK, cuda_home=None, env={})
    assert warnings == [
        "runtime_toolchain: skipped nvcc (version, a trivial kernel, JIT headers): the target declares no "
        "run-time CUDA toolkit (runtime.cuda_home unset); checked the C compiler and Python.h only"
    ]


def test_a_failed_toolchain_probe_shows_the_end_of_its_stderr():
    host = FakeHost()
    host.toolchain = (1, "", "x" * 100 + "y" * 300)
    with pytest.raises(AssertionError) as info:
        checklist.test_runtime_toolchain(host, _image(), _expect(), lambda m: None)
    assert str(info.value).splitlines()[0] == "expected the toolchain probe to run, found exit 1: " + "y" * 300


def test_a_library_a_package_dlopens_by_name_must_load():
    f, e, image, host = _correct()
    e = dataclasses.replace(
        e, dlopen={"libcudart.so": "fastsafetensors (common.py)", "libnuma.so.1": "fastsafetensors"}
    )
    host.probes["elf"]["dlopen"] = {
        "libcudart.so": None,
        "libnuma.so.1": "libnuma.so.1: cannot open shared object file",
    }
    with pytest.raises(AssertionError) as info:
        checklist.test_shared_libraries(host, image, e, lambda m: None, host.files)
    assert (
        "libnuma.so.1 (loaded by name: fastsafetensors) does not load: libnuma.so.1: cannot open shared object file"
    ) in str(info.value) and "libcudart.so (" not in str(info.value)
    ((_, args),) = [c for c in host.calls if probes.script("elf") in c[1]]
    assert json.loads(args[1])["dlopen"] == ["libcudart.so", "libnuma.so.1"]


def test_shared_libraries_allows_other_major_by_distribution_and_optional_files_with_reasons():
    f, e, image, host = _correct()
    lib = "/opt/k3/venv/lib/python3.12/site-packages/torchcodec/libtorchcodec_core8.so"
    host.probes["elf"].update(
        other_major=[{"path": lib, "needed": "libcudart.so.13", "major": 13, "dist": "torchcodec 0.17.0"}],
        unresolved=[
            {"path": lib, "needed": "libcudart.so.13", "dist": "torchcodec 0.17.0"},
            {"path": lib, "needed": "libavcodec.so.61", "dist": "torchcodec 0.17.0"},
            {"path": lib, "needed": "libcuda.so.1", "dist": "torchcodec 0.17.0"},
        ],
    )
    with pytest.raises(AssertionError) as info:
        checklist.test_shared_libraries(host, image, e, lambda m: None, host.files)
    text = str(info.value)
    assert f"{lib} (torchcodec 0.17.0) needs libcudart.so.13, a CUDA 13 library" in text
    assert "libavcodec.so.61, which nothing in the image provides" in text and "libcuda.so.1" not in text
    warnings = []
    e = dataclasses.replace(
        e,
        other_major={"torchcodec": "a stated exception"},
        optional_libraries={"/opt/k3/*/libtorchcodec_core*.so": "one core per FFmpeg major"},
    )
    checklist.test_shared_libraries(host, image, e, warnings.append, host.files)
    assert warnings == [
        f"shared_libraries: {lib} (torchcodec 0.17.0) needs libcudart.so.13 (CUDA 13), allowed by the "
        "matrix: a stated exception",
        f"shared_libraries: {lib} (torchcodec 0.17.0) needs libavcodec.so.61, which the image lacks; "
        "allowed: one core per FFmpeg major",
    ]


def test_the_recipe_probe_gets_its_own_environment_and_stale_skips_are_reported():
    """vLLM cannot build its parser with no GPU platform (rehearsed on PyPI's 0.30.0):
    runtime.recipe.env reaches the probe's process only; a skip pattern that matches nothing
    is reported, not kept silently."""
    f, e, image, host = _correct()
    e = dataclasses.replace(
        e,
        recipe={**RECIPE, "env": {"VLLM_TARGET_DEVICE": "cpu"}},
        python_skip={"vllm.third_party.fmha_sm100.cute.*": "own root", "vllm.gone.*": "old"},
    )
    warnings = []
    checklist.test_recipe_cli(host, e)
    checklist.test_python_trees(host, e, warnings.append)
    ((command, _),) = [c for c in host.calls if c[1][0] == probes.script("recipe")]
    assert command.startswith("LD_LIBRARY_PATH=") and " VLLM_TARGET_DEVICE=cpu python -I -S -c %s %s" in command
    assert "python_trees: skip pattern vllm.gone.* matches no module: drop it from python_skip" in warnings


def test_package_files_names_what_the_wheel_dropped_and_what_lost_its_execute_bit():
    f, e, image, host = _correct()
    host.probes["files"]["files"].pop("vllm/configs/E=8.json")
    host.probes["files"]["files"]["vllm/utils/numa_wrapper.sh"] = False
    with pytest.raises(AssertionError) as failed:
        _run_one("package_files", f, e, image, host)
    message = str(failed.value)
    assert "vllm/configs/E=8.json missing" in message and "vllm/utils/numa_wrapper.sh not executable" in message
    assert "found 1 missing, 1 not executable and 0 changed" in message
    # A module git records executable is not expected to stay so (setuptools drops modules' modes).
    e = dataclasses.replace(e, package_files={**e.package_files, "vllm/envs.py": True})
    host.probes["files"]["files"]["vllm/envs.py"] = False
    with pytest.raises(AssertionError) as failed:
        _run_one("package_files", f, e, image, host)
    assert "vllm/envs.py" not in str(failed.value)
    request = next(json.loads(args[1]) for _, args in host.calls if args and args[0] == probes.script("files"))
    assert request == {"distribution": "vllm", "package": "vllm", "blobs": []}  # _correct() gives no blob ids


def test_package_files_skips_a_source_without_the_package_directory():
    f, e, image, host = _correct()
    e = dataclasses.replace(e, package_files={})
    with pytest.raises(AssertionError, match="skipped: the source carries no vllm/ directory"):
        _run_one("package_files", f, e, image, host)


def test_pip_check_reports_a_requirement_the_matrix_drops_and_fails_on_other_missing_ones():
    dropped = "vllm 0.30.0+cu129 requires tokenspeed-mla, which is not installed."
    other = "vllm 0.30.0+cu129 requires fastsafetensors, which is not installed."
    warnings: list[str] = []
    expect = _expect(dropped={"tokenspeed-mla": "brings a CUDA 13.4 ptxas"})
    checklist.test_pip_check(FakeHost(pip=(1, dropped)), "/p", expect, warnings.append)
    assert warnings == [f"pip check (expected, source.drop: brings a CUDA 13.4 ptxas): {dropped}"]
    with pytest.raises(AssertionError, match="requires fastsafetensors"):
        checklist.test_pip_check(FakeHost(pip=(1, f"{dropped}\n{other}")), "/p", expect, warnings.append)
    # Without the drop the same line is a conflict.
    with pytest.raises(AssertionError, match="requires tokenspeed-mla"):
        checklist.test_pip_check(FakeHost(pip=(1, dropped)), "/p", _expect(), warnings.append)


def test_gpu_code_holds_the_binaries_to_the_driver_floor_label_and_skips_without_gpu():
    f, e, image, host = _correct()
    image.labels[contract.LABEL_DRIVER_FLOOR] = "560.28.03"  # an image claiming an older floor than its PTX needs
    with pytest.raises(AssertionError, match=r"derived driver floor 575\.51\.03 .* exceeds the claimed 560\.28\.03"):
        _run_one("gpu_code", f, e, image, host)
    facts: dict = {}
    _call("gpu_coverage", _fixtures(f, e, image, host, lambda m: None, facts))
    assert facts["gpu_coverage"] == {
        "vllm._C_stable_libtorch": {
            "8.0": "PTX JIT compute_80 (ISA 8.8)",
            "9.0": "SASS sm_90a",
            "10.0": "SASS sm_100f",
            "10.3": "SASS sm_100f",
        }
    }
    with pytest.raises(AssertionError, match="skipped: the target claims no GPU code"):
        _run_one("gpu_code", f, dataclasses.replace(e, gpu=None), image, host)


def test_a_second_copy_of_a_distribution_fails_lock_contents_and_pinned_versions():
    # issue 34: the dists were a dict keyed by name, so the copy that sorted last decided the verdict
    site2 = "/opt/k3/python/lib/python3.12/site-packages"
    dists = [
        ["torch", "2.13.0+cu129", f"{SITE}/torch-2.13.0+cu129.dist-info"],
        ["nvidia-nccl-cu12", "2.30.7", f"{SITE}/nvidia_nccl_cu12-2.30.7.dist-info"],
        ["vllm", "0.30.0", f"{SITE}/vllm-0.30.0.dist-info"],
    ]
    checklist.test_lock_contents(_facts(dists=dists), _expect())
    checklist.test_pinned_versions(_facts(dists=dists), _expect())
    for other in ("2.27.5", "2.30.7"):  # another version, or the same one again elsewhere on sys.path
        twice = [*dists, ["nvidia-nccl-cu12", other, f"{site2}/nvidia_nccl_cu12-{other}.dist-info"]]
        for check in (checklist.test_lock_contents, checklist.test_pinned_versions):
            with pytest.raises(AssertionError, match=r"nvidia-nccl-cu12: 2 copies installed \(2\.\d+\.\d at "):
                check(_facts(dists=twice), _expect())

"""The check logic on facts shaped like the probe's (the real probe runs in integration tests)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from builder import checklist, extensions, imagechecks as checks
from builder.engine import ImageConfig
from builder.errors import BuildError, SourceError
from builder.matrix import Extensions

CUDA12 = {"/opt/k3/venv/lib/python3.12/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12":
          {"real": "x", "version": 12090, "error": None}}


def _expect(**kw) -> checks.Expectations:
    base = dict(
        target="t", cuda_version="12.9.1",
        modules=extensions.ModulePlan(("vllm._C_stable_libtorch",), (), ()),
        ops=("torch.ops._C.rms_norm",), pins={"nvidia-nccl-cu12": "2.30.7"},
        labels={"io.k3-cu129.owner": "o@e.org"}, expires=dt.date(2027, 6, 30), build_date=dt.date(2026, 11, 29),
        today=dt.date(2026, 11, 29), warning_days=45, horizon_days=270,
        lock={"torch": "2.13.0+cu129", "nvidia-nccl-cu12": "2.30.7"}, overrides=frozenset({"nvidia-nccl-cu12"}),
        source_package=("vllm", "0.30.0"),
    )
    base.update(kw)
    return checks.Expectations(**base)


def _facts(**kw):
    base = {"uid": 2000, "libs": dict(CUDA12), "version_json": "12.9.1",
            "dists": [["torch", "2.13.0+cu129"], ["nvidia-nccl-cu12", "2.30.7"], ["vllm", "0.30.0"]],
            "modules": {"vllm._C_stable_libtorch": None}, "ops": {"torch.ops._C.rms_norm": None},
            "absent": {}, "libcuda": None,
            "torch": {"version": "2.13.0+cu129", "cuda": "12.9"}}
    base.update(kw)
    return base


def _image(labels=None, env=None, user="2000:2000"):
    return ImageConfig(ref="r", id="i", labels=labels or {}, env=env or {"CUDA_VERSION": "12.9.1"},
                       user=user, entrypoint=("vllm", "serve"))


def test_a_correct_cu129_image_passes():
    f, e = _facts(), _expect()
    warnings = []
    checklist.test_cuda_runtime(f, e, _image())
    checklist.test_no_other_cuda_major(f, e, warnings.append)
    checklist.test_compiled_modules(f, e)
    checklist.test_ops_registered(f, e, warnings.append)
    checklist.test_pinned_versions(f, e)
    checklist.test_lock_contents(f, e)
    checklist.test_non_root(_image(), f)
    assert warnings == []


def test_pypi_cuda13_torch_is_caught():
    # What `pip install torch==2.14.1` from PyPI brings: a CUDA 13 build and its unsuffixed wheels.
    f = _facts(dists=[["torch", "2.14.1"], ["cuda-toolkit", "13.0.3"], ["nvidia-nccl-cu13", "2.28.9"]],
               torch={"version": "2.14.1", "cuda": "13.0"})
    with pytest.raises(AssertionError, match=r"expected torch.version.cuda == 12.9, found 13.0"):
        checklist.test_cuda_runtime(f, _expect(), _image())
    with pytest.raises(AssertionError) as info:
        checklist.test_no_other_cuda_major(f, _expect(), lambda m: None)
    assert "cuda-toolkit 13.0.3" in str(info.value) and "nvidia-nccl-cu13" in str(info.value)
    f = _facts(torch={"version": "2.13.0+cu130", "cuda": "13.0"})
    with pytest.raises(AssertionError, match=r"torch 2.13.0\+cu130"):
        checklist.test_no_other_cuda_major(f, _expect(), lambda m: None)


def test_other_major_exceptions_are_shown_not_skipped():
    f = _facts(dists=[["torch", "2.13.0+cu129"], ["nvidia-cutlass-dsl-libs-cu13", "4.7.1"],
                      ["nvidia-cuda-nvdisasm", "13.5.37"], ["nvidia-curand", "10.4.0.35"]])
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
    checklist.test_ops_registered(_facts(absent={"torch.ops._C.fused_kda_decode": "AttributeError: no op"}), e,
                                  warnings.append)
    assert any("absent as the matrix expects: CUDA >= 13 only" in w for w in warnings)
    with pytest.raises(AssertionError, match="found them registered: torch.ops._C.fused_kda_decode"):
        checklist.test_ops_registered(_facts(absent={"torch.ops._C.fused_kda_decode": None}), e, lambda m: None)
    with pytest.raises(AssertionError, match="found missing: torch.ops._C.rms_norm"):
        checklist.test_ops_registered(_facts(ops={"torch.ops._C.rms_norm": "AttributeError"}, absent={}),
                                      _expect(), lambda m: None)


def test_a_module_that_needs_the_driver_says_where_libcuda_was_looked_for():
    f = _facts(modules={"vllm._C_stable_libtorch": "ImportError: libcuda.so.1: cannot open shared object file"},
               libcuda="libcuda.so.1: cannot open shared object file")
    with pytest.raises(AssertionError, match="could not be loaded from /usr/local/cuda/compat"):
        checklist.test_compiled_modules(f, _expect())


def test_cuda_version_mismatches_say_expected_and_found():
    f = _facts(libs={"/usr/local/cuda/lib64/libcudart.so.12": {"version": 12080}})
    with pytest.raises(AssertionError, match=r"expected cudaRuntimeGetVersion\(\) == 12090 .*found 12080"):
        checklist.test_cuda_runtime(f, _expect(), _image())
    with pytest.raises(AssertionError, match="expected CUDA_VERSION 12.9.x, found 13.0.1"):
        checklist.test_cuda_runtime(_facts(), _expect(), _image(env={"CUDA_VERSION": "13.0.1"}))
    with pytest.raises(AssertionError, match="found none"):
        checklist.test_cuda_runtime(_facts(libs={}), _expect(), _image())


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
        checklist.test_expiry(_image({"io.k3-cu129.expires": "2027-09-30"}),
                              _expect(expires=dt.date(2027, 9, 30)), lambda m: None)
    warnings = []
    checklist.test_expiry(_image({"io.k3-cu129.expires": "2027-06-30"}), _expect(today=dt.date(2027, 6, 1)),
                          warnings.append)
    assert warnings and "expires in 29 days" in warnings[0]


def test_root_user_fails():
    with pytest.raises(AssertionError, match="non-root"):
        checklist.test_non_root(_image(user=""), _facts())


def test_module_plan_from_vllm_style_setup():
    setup = b'''
if _is_cuda():
    ext_modules.append(CMakeExtension(name="vllm.cumem_allocator"))
    ext_modules.append(CMakeExtension(name="vllm._flashmla_C", optional=True))
if _is_hip():
    ext_modules.append(CMakeExtension(name="vllm._rocm_C"))
'''
    rust = b"""
def rust_extensions(*, optional=False):
    return [RustExtension(target="vllm.vllm-rs", path="x", optional=optional),
            RustExtension(target="vllm._rust_tool_parser", path="y", optional=optional)]
"""
    policy = Extensions(add=("vllm._C_stable_libtorch",), waive={"vllm._rocm_C": "ROCm only",
                                                                  "vllm.vllm-rs": "not built"})
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
    names = {n.removeprefix("test_") for n in dir(checklist) if n.startswith("test_")}
    assert names == set(checks.contract.CHECKS)
    assert Path(checks.CHECKLIST).exists()

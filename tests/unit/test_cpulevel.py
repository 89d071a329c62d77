"""The oldest CPU a target claims (matrix key ``cpu``, builder/config/cpulevel.py) and check cpu_level
(builder/checks/cpurun.py): the claim validated like every matrix value, and the loads probe's one
process run on this machine natively and under QEMU's model of the level, against libraries built here."""

from __future__ import annotations

import platform
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from builder.checks import cpurun
from builder.config import contract, cpulevel, matrix
from builder.engine.containers import Ran, run_capped
from builder.errors import ConfigError
from tests.unit.test_checks_image import _ext_suffix
from tests.unit.test_probes import CC, compile_so

MATRIX = Path(__file__).resolve().parents[2] / "matrix.yaml"
AVX2_INIT = (
    "__attribute__((constructor)) static void k3_simd_init(void) {\n"
    '  __asm__ volatile("vpaddd %%ymm0, %%ymm1, %%ymm2" ::: "xmm0", "xmm1", "xmm2");\n'
    "}\nint k3_simd(void) { return 1; }\n"
)


def _with_cpu(text: str, block: str) -> str:
    return text.replace("    entrypoint: [vllm, serve]\n", f"    entrypoint: [vllm, serve]\n{block}", 1)


def _load(tmp_path: Path, cpu: str) -> matrix.Matrix:
    text = re.sub(r"\n    cpu:\n(      .*\n)+", "\n", MATRIX.read_text())
    path = tmp_path / "matrix.yaml"
    path.write_text(_with_cpu(text, cpu))
    return matrix.load(path)


def test_cu129_claims_a_level_per_platform_and_each_has_its_platform():
    target = matrix.load(MATRIX).target("cu129")
    assert set(target.cpu) == set(target.platform_names())
    assert all(cpulevel.LEVELS[name].platform == p for p, name in target.cpu.items())


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ("    cpu: {linux/amd64: x86_64-v3}\n", "(did you mean 'x86-64-v3'?)"),
        ("    cpu: {linux/amd64: armv8.2}\n", "armv8.2 is a linux/arm64 level; linux/amd64's are x86-64, x86-64-v2"),
        ("    cpu: {linux/arm46: armv8.0}\n", "cpu.'linux/arm46'"),
    ],
)
def test_a_wrong_claim_is_bad_input_naming_the_key(tmp_path, block, message):
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, block)
    assert "targets.cu129.cpu" in str(err.value) and message in str(err.value), err.value
    assert err.value.exit_code == 2


def test_a_claim_for_a_platform_the_target_does_not_build_is_refused():
    one = matrix.load(MATRIX).target("cu129").model_copy(update={"platforms": {}, "cpu": {"linux/arm64": "armv8.0"}})
    assert cpulevel.check(one) == "cpu.'linux/arm64': the target builds linux/amd64, not linux/arm64"


def test_the_claim_is_no_input_of_the_image(tmp_path):
    """What the image is checked against, not what is built: the input key does not move with it."""
    a = _load(tmp_path, "    cpu: {linux/amd64: x86-64-v2}\n").target("cu129")
    b = _load(tmp_path, "    cpu: {linux/amd64: x86-64-v3}\n").target("cu129")
    assert a.cpu != b.cpu and a.as_input() == b.as_input()


def test_the_plan_says_why_a_level_is_not_checked():
    assert "claims no oldest CPU for linux/amd64" in cpurun.plan({}, "linux/amd64", "/q").not_checked
    v4 = cpurun.plan({"linux/amd64": "x86-64-v4"}, "linux/amd64", "/q")
    assert v4.not_checked.startswith("NOT CHECKED: x86-64-v4: QEMU 7.2's TCG emulates no AVX-512")
    grace = cpurun.plan({"linux/arm64": "armv9.0"}, "linux/arm64", "/q")
    assert "no Armv9 model" in grace.not_checked
    none = cpurun.plan({"linux/arm64": "armv8.0"}, "linux/arm64", None)
    assert none.not_checked == (
        "NOT CHECKED: armv8.0: no qemu-aarch64-static on this host; install it: " + cpurun.INSTALL
    )
    ok = cpurun.plan({"linux/amd64": "x86-64-v2"}, "linux/amd64", "/tmp/k3-qemu/qemu-x86_64-static")
    assert not ok.not_checked and ok.level and ok.level.model == "Nehalem-v1"


def test_every_level_has_a_model_or_says_why_not():
    for name, level in cpulevel.LEVELS.items():
        assert (level.model is None) == (name in cpulevel.NO_MODEL), name
    assert "cpu_level" in contract.CHECKS


class _Shell:
    """ContainerHost's ``run`` on this machine (the unit tests' stand-in for the checks' container)."""

    def run(self, command: str, *args: object) -> Ran:
        text = command % tuple(shlex.quote(str(a)) for a in args) if args else command
        return run_capped(["/bin/sh", "-c", text], 300)


def _qemu_x86() -> str:
    qemu = shutil.which("qemu-x86_64-static")
    if platform.machine() != "x86_64" or qemu is None or CC is None:
        pytest.skip("needs an x86_64 host with qemu-x86_64-static and a C compiler")
    if " avx2" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("this host's CPU has no AVX2: the library below would not load natively either")
    return qemu


def _tree(tmp_path: Path, simd: bool) -> Path:
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg/__init__.py").write_text("")
    compile_so(site / "pkg/liba.so")
    if simd:  # an AVX2 instruction in a constructor, not dispatched: runs at every load
        src = tmp_path / "simd.c"
        src.write_text(AVX2_INIT)
        subprocess.run([CC, "-shared", "-fPIC", "-o", str(site / "pkg/libb_simd.so"), str(src)], check=True)
    compile_so(site / "pkg/libc.so")
    return site


def _run(site: Path, qemu: str | None, model: str | None) -> cpurun.Run:
    request = {"roots": [str(site)], "driver_libraries": sorted(contract.DRIVER_LIBRARIES)}
    cmd = cpurun.command(sys.executable, f"PYTHONPATH={shlex.quote(str(site))} ", qemu, model)
    return cpurun.load_all(_Shell(), cmd, request)


def test_a_constructor_above_the_level_is_killed_on_its_model_and_named(tmp_path):
    qemu = _qemu_x86()
    site = _tree(tmp_path, simd=True)
    level = cpulevel.LEVELS["x86-64-v2"]
    native = _run(site, None, None)
    assert native.complete and not native.killed and set(native.results.values()) == {None}, native
    model = _run(site, qemu, level.model)
    simd = str(site / "pkg/libb_simd.so")
    assert model.complete and set(model.killed) == {simd}, model
    assert model.results[str(site / "pkg/libc.so")] is None  # started again past it
    found = cpurun.findings(native, model, level)
    assert found == [
        (
            simd,
            "killed by SIGILL (Illegal instruction) on x86-64-v2 (QEMU -cpu Nehalem-v1); "
            "loads as the container runs it",
        )
    ]
    # On the level that has the instruction, it loads.
    v3 = cpulevel.LEVELS["x86-64-v3"]
    assert cpurun.findings(native, _run(site, qemu, v3.model), v3) == []


def test_a_tree_within_the_level_passes(tmp_path):
    qemu = _qemu_x86()
    site = _tree(tmp_path, simd=False)
    level = cpulevel.LEVELS["x86-64-v2"]
    model = _run(site, qemu, level.model)
    assert model.complete and not model.killed and len(model.results) == 2
    assert cpurun.findings(_run(site, None, None), model, level) == []


def test_a_failure_both_runs_share_is_not_this_row_s():
    level = cpulevel.LEVELS["x86-64-v2"]
    native = cpurun.Run({"/a": "OSError: x", "/b": None}, {"/c": "killed by SIGSEGV"}, True)
    model = cpurun.Run({"/a": "OSError: x", "/b": "ImportError: needs AVX"}, {"/c": "killed by SIGSEGV"}, True)
    assert cpurun.findings(native, model, level) == [
        ("/b", "fails on x86-64-v2 (QEMU -cpu Nehalem-v1): ImportError: needs AVX")
    ]


def test_a_run_that_dies_names_the_signal_or_the_exit():
    assert cpurun.death(132, "qemu: uncaught target signal 4 (Illegal instruction) - core dumped\n") == (
        "killed by SIGILL (Illegal instruction)"
    )
    assert cpurun.death(139, "") == "killed by SIGSEGV"
    assert cpurun.death(1, "qemu-x86_64-static: unable to find CPU model 'X'\n") == (
        "exit 1: qemu-x86_64-static: unable to find CPU model 'X'"
    )


def test_a_package_whose_import_dies_is_named_once_and_its_files_not_tried_again(tmp_path):
    """numpy 2.4.6's x86_64 wheel on x86-64 (v1): every one of its extensions imports the package first."""
    qemu = _qemu_x86()
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    src = tmp_path / "simd.c"
    src.write_text(AVX2_INIT)
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(tmp_path / "libsimd.so"), str(src)], check=True)
    (site / "pkg/__init__.py").write_text(f"import ctypes\nctypes.CDLL({str(tmp_path / 'libsimd.so')!r})\n")
    ext = tmp_path / "m.c"
    for name in ("_m", "_n"):
        ext.write_text(
            f'#include <Python.h>\nstatic struct PyModuleDef d = {{PyModuleDef_HEAD_INIT, "{name}", 0, -1, 0}};\n'
            f"PyMODINIT_FUNC PyInit_{name}(void) {{ return PyModule_Create(&d); }}\n"
        )
        out = site / "pkg" / f"{name}{_ext_suffix()}"
        include = sysconfig.get_paths()["include"]
        subprocess.run([CC, "-shared", "-fPIC", f"-I{include}", "-o", str(out), str(ext)], check=True)
    level = cpulevel.LEVELS["x86-64-v2"]
    native, model = _run(site, None, None), _run(site, qemu, level.model)
    assert native.complete and set(native.results) == {"import pkg", *map(str, site.glob("pkg/*.so"))}, native
    assert model.complete and set(model.killed) == {"import pkg"} and not model.results, model
    assert cpurun.findings(native, model, level) == [
        (
            "import pkg",
            "killed by SIGILL (Illegal instruction) on x86-64-v2 (QEMU -cpu Nehalem-v1); loads as "
            "the container runs it; its files not tried",
        )
    ]


def test_an_interpreter_qemu_cannot_start_is_said_unstarted_not_passed(tmp_path):
    """A wrapper script as python: QEMU runs ELF programs only, so the row cannot check (a skip, never a pass)."""
    qemu = _qemu_x86()
    site = _tree(tmp_path, simd=False)
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    request = {"roots": [str(site)], "driver_libraries": sorted(contract.DRIVER_LIBRARIES)}
    env = f"PYTHONPATH={shlex.quote(str(site))} "
    assert cpurun.load_all(_Shell(), cpurun.command(str(wrapper), env), request).complete
    model = cpurun.load_all(_Shell(), cpurun.command(str(wrapper), env, qemu, "Nehalem-v1"), request)
    assert model.unstarted and not model.complete and set(model.killed) == {"(the interpreter)"}, model
    # an interpreter that starts and dies on the model is a finding, not "unstarted"
    simd = _run(_tree(tmp_path / "b", simd=True), qemu, "Nehalem-v1")
    assert not simd.unstarted


def test_a_prefix_with_nothing_to_load_fails_rather_than_passing_the_level(tmp_path):
    """No file loaded as the container runs it: nothing was tried on the model, so the claim is not shown."""
    from types import SimpleNamespace

    from builder.checks.checklist_image import test_cpu_level

    qemu = _qemu_x86()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin/python").symlink_to(Path(sys.executable).resolve())
    (tmp_path / "prefix").mkdir()

    class _PathShell(_Shell):  # the image's `python` is this machine's interpreter
        def run(self, command: str, *args: object) -> Ran:
            return super().run(f"PATH={tmp_path / 'bin'}:$PATH; " + command, *args)

    expect = SimpleNamespace(
        platform="linux/amd64",
        cpu={"linux/amd64": "x86-64-v2"},
        qemu=qemu,
        app_prefix=str(tmp_path / "prefix"),
        compat_dir=str(tmp_path),
        waivers={},
        emulated=False,
    )
    with pytest.raises(AssertionError, match="found none"):
        test_cpu_level(_PathShell(), expect, lambda message: None)


def test_the_host_s_qemu_is_mounted_only_where_the_row_runs_it(monkeypatch):
    """No claim for the platform, or a level QEMU has no model of: nothing of the host's is mounted."""
    monkeypatch.setattr(cpurun.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(cpurun.Path, "resolve", lambda self: self)
    assert cpurun.mounts({}, "linux/amd64") == ()
    assert cpurun.mounts({"linux/arm64": "armv8.0"}, "linux/amd64") == ()
    assert cpurun.mounts({"linux/amd64": "x86-64-v4"}, "linux/amd64") == ()
    assert cpurun.mounts({"linux/amd64": "x86-64-v2"}, "linux/amd64") == (
        (Path("/usr/bin/qemu-x86_64-static"), f"{cpurun.MOUNT_DIR}/qemu-x86_64-static"),
    )

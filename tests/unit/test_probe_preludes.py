"""The code the probes share (builder/checks/probes/_*.py, prepended by ``probes.script``), and the
cache directories least_privilege holds: run as the checks run them, as text in another interpreter."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from builder.checks import probes
from builder.config import contract
from tests.unit.test_probes import probe_script


def _prelude_names(part: str) -> set[str]:
    tree = ast.parse((probes.HERE / f"{part}.py").read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}


@pytest.mark.parametrize("name", probes.NAMES + probes.IMAGE_NAMES)
def test_every_prelude_a_probe_imports_for_the_type_checker_is_prepended_to_it(name):
    """A probe names what a prelude defines in its ``if TYPE_CHECKING:`` imports; at run time only
    probes.PRELUDES puts the prelude in front of it, so a name missing there is a NameError in the image."""
    tree = ast.parse((probes.HERE / f"{name}.py").read_text())
    wanted = {
        node.module.rsplit(".", 1)[1]: {a.name for a in node.names}
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("builder.checks.probes._")
    }
    prepended = ("_report", *probes.PRELUDES.get(name, ()))
    assert set(wanted) <= set(prepended), f"{name}: imports {sorted(wanted)}, prepended {prepended}"
    for part, names in wanted.items():
        assert names <= _prelude_names(part), f"{name}: {sorted(names - _prelude_names(part))} not in {part}.py"
    text = probes.script(name)
    for part in prepended:
        assert (probes.HERE / f"{part}.py").read_text() in text


def test_no_probe_defines_again_what_a_prelude_it_gets_defines():
    for name, parts in probes.PRELUDES.items():
        tree = ast.parse((probes.HERE / f"{name}.py").read_text())
        own = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        for part in parts:
            assert not own & _prelude_names(part), f"{name}.py defines {sorted(own & _prelude_names(part))} again"


def _fork(code: str) -> subprocess.CompletedProcess:
    """``code`` run after _fork.py, as a probe runs after its preludes."""
    text = (probes.HERE / "_fork.py").read_text() + "\n\n" + code
    return subprocess.run([sys.executable, "-c", text], capture_output=True, text=True, timeout=60)


def test_in_child_returns_the_child_s_result_its_exception_or_that_it_died():
    proc = _fork(
        "import os\n"
        "PARENT = os.getpid()\n"
        "def boom(): raise ValueError('x' * 1000)\n"
        "print(repr(in_child(lambda a, b: [a, b, os.getpid() != PARENT], 1, 'two')))\n"
        "print(repr(in_child(lambda: None)))\n"  # null is a result, not a death
        "print(repr(in_child(boom)))\n"
        "print(repr(in_child(os._exit, 3)))\n"
        "print(repr(in_child(lambda: os.kill(os.getpid(), 9))))\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "[1, 'two', True]",
        "None",
        repr("ValueError: " + "x" * 288),  # cut to 300 characters
        "'the process died'",
        "'the process died'",
    ]


def test_a_child_whose_result_is_no_json_never_runs_the_probe_s_own_code():
    """json.dumps raising in the child must not return it into the caller: the probe would then run
    twice and print two reports."""
    proc = _fork("print(repr(in_child(object)))\nprint('after')\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["'the process died'", "after"]


def test_a_quiet_child_prints_nothing_and_a_timed_one_is_ended_by_sigalrm():
    proc = _fork(
        "import os, signal, time\n"
        "print(repr(in_child(print, 'from the child', quiet=True)))\n"
        "print(repr(in_child(print, 'loud')))\n"
        "pid, fd = fork_call(time.sleep, 30, timeout=1)\n"
        "result = child_result(fd, 'none')\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(result, os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM)\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "from the child" not in proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == ["None", "loud", "None", "none True"]


def _privilege(tmp_path: Path, env: dict[str, str]) -> dict:
    """The privilege probe with only ``env`` besides PATH and PYTHONPATH (the machine's own
    XDG_CACHE_HOME, say, must not count), sys.path held to that PYTHONPATH (probe_script: why)."""
    base = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path / "site")}
    script = probe_script("privilege", sys_path_under=tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps({"roots": [], "caches": contract.CACHE_ENV})],
        capture_output=True,
        text=True,
        env={**base, **env},
        timeout=120,
    )
    found = probes.parse(proc.stdout)
    assert found is not None and "error" not in found, proc.stderr + proc.stdout
    return found


def test_least_privilege_holds_each_cache_variable_to_a_writable_directory_off_sys_path(tmp_path):
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (tmp_path / "afile").write_text("")
    env = {
        "CUDA_CACHE_PATH": str(tmp_path / "k3-cache/cuda"),  # not there yet: its parent is writable
        "TRITON_CACHE_DIR": str(site / "triton"),  # under sys.path: a cached file would be importable
        "XDG_CACHE_HOME": str(tmp_path),  # holds the sys.path directory
        "VLLM_CACHE_ROOT": "relative/cache",
        "K3_CACHE_DIR": str(tmp_path / "afile" / "sub"),  # can never be a directory
        "CUDA_CACHE_MAXSIZE": "4294967296",  # a size, no directory
    }
    found = _privilege(tmp_path, env)
    site_real = os.path.realpath(site)
    assert found["caches"] == {
        "CUDA_CACHE_PATH": [env["CUDA_CACHE_PATH"], None],
        "K3_CACHE_DIR": [
            env["K3_CACHE_DIR"],
            f"cannot be a directory: {os.path.realpath(tmp_path / 'afile')} is not one",
        ],
        "TRITON_CACHE_DIR": [env["TRITON_CACHE_DIR"], f"is on sys.path or PATH ({site_real})"],
        "VLLM_CACHE_ROOT": ["relative/cache", "is not an absolute path"],
        "XDG_CACHE_HOME": [str(tmp_path), f"holds the sys.path or PATH directory {site_real}"],
    }
    assert found["count"] - _privilege(tmp_path, {})["count"] == 4  # each unfit cache counted once


@pytest.mark.skipif(os.getuid() == 0, reason="root writes every directory: no unwritable cache to make")
def test_a_cache_the_runtime_user_cannot_write_is_a_finding(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    found = _privilege(tmp_path, {"XDG_CACHE_HOME": str(locked / "cache")})
    why = found["caches"]["XDG_CACHE_HOME"][1]
    assert why.startswith(f"is not writable by uid {os.getuid()}") and str(locked) in why


def test_cache_env_names_the_cache_variables_and_no_size():
    names = ["CUDA_CACHE_PATH", "TRITON_CACHE_DIR", "XDG_CACHE_HOME", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR"]
    assert all(re.fullmatch(contract.CACHE_ENV, n) for n in names)
    assert not any(re.fullmatch(contract.CACHE_ENV, n) for n in ["CUDA_CACHE_MAXSIZE", "CACHE", "XDG_CACHE_HOMES"])


def test_the_smoke_sets_cu129_s_cache_variables_as_cu129_does(tmp_path):
    """The smoke is cu129's miniature: the checks see the same cache directories in both images."""
    import datetime as dt

    import yaml

    from builder.config import matrix
    from builder.smoke import smoke

    bases = {"devel": "127.0.0.1:5000/k3/b@sha256:" + "a" * 64, "runtime": "127.0.0.1:5000/k3/r@sha256:" + "b" * 64}
    repos = {"url": "file:///s", "commit": "1" * 40, "kernels_url": "file:///k", "kernels_commit": "2" * 40}
    (tmp_path / "matrix.yaml").write_text(smoke.matrix_text("127.0.0.1:5000", bases, repos, dt.date(2027, 1, 1)))
    smoke_env = dict(matrix.load(tmp_path / "matrix.yaml").target("smoke").runtime.env)
    cu129 = yaml.safe_load((Path(__file__).resolve().parents[2] / "matrix.yaml").read_text())
    want = {k: v for k, v in cu129["targets"]["cu129"]["runtime"]["env"].items() if re.fullmatch(contract.CACHE_ENV, k)}
    assert set(want) == {"CUDA_CACHE_PATH", "TRITON_CACHE_DIR", "XDG_CACHE_HOME"}
    assert {k: v for k, v in smoke_env.items() if re.fullmatch(contract.CACHE_ENV, k)} == want

"""ci/demo.sh's own plumbing, without an engine: a copy of the script in a tmp tree whose
ci/setup.sh and .venv/bin/build are stand-ins (the real run is tests/integration/test_demo.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

# Each stand-in command records a step as builder.log.step does (K3_STEP_TIMES), prints one line of
# stdout where the tool prints one, and fails where FAIL says.
BUILD = r"""#!/bin/bash
printf '2.5\tdone\tbuild %s\n' "$*" >> "$K3_STEP_TIMES"
printf '0.2\tdone\tquick\n' >> "$K3_STEP_TIMES"
case "$*" in
  *"$FAIL"*) printf '1.0\tFAILED\t%s\n' "$FAIL" >> "$K3_STEP_TIMES"; echo "error: $FAIL failed" >&2; exit 1 ;;
  smoke-init*) echo "$PWD/smoke/matrix.yaml" ;;
  *"--target smoke") echo "127.0.0.1:5000/k3/smoke@sha256:$(printf 'a%.0s' $(seq 64))" ;;
esac
"""


def _demo(tmp_path: Path, fail: str) -> subprocess.CompletedProcess:
    (tmp_path / "ci").mkdir()
    shutil.copy(REPO / "ci" / "demo.sh", tmp_path / "ci" / "demo.sh")
    (tmp_path / "ci" / "setup.sh").write_text("echo setup >&2\n")
    build = tmp_path / ".venv" / "bin" / "build"
    build.parent.mkdir(parents=True)
    build.write_text(BUILD)
    build.chmod(0o755)
    env = {**os.environ, "FAIL": fail, "K3_DEMO_ARM64": "0", "TMPDIR": str(tmp_path)}
    return subprocess.run(["bash", "ci/demo.sh"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


def test_the_demo_sums_up_its_time_on_stderr_and_ends_stdout_with_the_reference(tmp_path):
    run = _demo(tmp_path, fail="no such step")
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1].startswith("127.0.0.1:5000/k3/smoke@sha256:")
    err = run.stderr.splitlines()
    assert err[-1].startswith("ci/demo.sh: setup ") and " total 0 min " in err[-1] and "FAILED" not in err[-1]
    assert "      2.5s  done        build --matrix" in "\n".join(err) and "quick" not in run.stderr  # under 1 s
    assert not list(tmp_path.glob("k3-demo-times.*"))  # its times file removed


@pytest.mark.parametrize("fail", ["lock", "smoke-init"])
def test_a_failed_demo_still_sums_up_and_keeps_its_exit_code(tmp_path, fail):
    run = _demo(tmp_path, fail=fail)
    assert run.returncode == 1
    assert "127.0.0.1:5000/k3/smoke@sha256:" not in run.stdout  # no reference for a failed demo
    last = run.stderr.splitlines()[-1]
    assert last.startswith("ci/demo.sh: setup ") and last.endswith(", FAILED with exit 1")
    assert f"FAILED      {fail}" in run.stderr
    assert not list(tmp_path.glob("k3-demo-times.*"))

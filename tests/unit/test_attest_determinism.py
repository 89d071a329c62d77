"""The SBOM and the provenance are the same bytes from another process: two calls in one process
share every set and dict order that string hashing decides, so only a new interpreter with
another PYTHONHASHSEED can show an order that leaks into the output."""

from __future__ import annotations

import os
import subprocess
import sys

from builder.records import attest, slsa
from tests.conftest import REPO
from tests.unit.test_attest import inputs

# The same fixed inputs as test_attest.py, made and serialized in a fresh interpreter.
SCRIPT = """
import sys
from builder.records import attest, slsa
from tests.unit.test_attest import inputs
args = inputs.__wrapped__()
sys.stdout.write(attest.sbom(*args))
sys.stdout.write("\\n--provenance--\\n")
sys.stdout.write(slsa.provenance(args[0], args[1], {"MAX_JOBS": "2", "NVCC_THREADS": "1"}, "2026-11-29T00:00:00Z"))
"""


def _in_new_processes(*seeds: str) -> list[str]:
    """The script's output from one new interpreter per seed, run side by side."""
    procs = []
    for seed in seeds:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("K3_", "PYTHONHASHSEED"))}
        env["PYTHONHASHSEED"] = seed
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", SCRIPT],
                cwd=REPO,
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        outs.append(out)
    return outs


def test_sbom_and_provenance_are_the_same_bytes_under_another_hash_seed():
    first, second = _in_new_processes("0", "31337")
    assert "--provenance--" in first and len(first) > 1000
    assert second == first
    args = inputs.__wrapped__()
    here = (
        attest.sbom(*args)
        + "\n--provenance--\n"
        + slsa.provenance(args[0], args[1], {"MAX_JOBS": "2", "NVCC_THREADS": "1"}, "2026-11-29T00:00:00Z")
    )
    assert here == first

"""The build's kernel-plan preflight on the real engine (issue 52): the smoke with 10.3 dropped
from its arch list fails `build --target smoke` before any compile, in the real sandbox container
(builder/engine/sandbox.py), naming the kernel, the family and the file and line; nothing is pushed
under the variant's tag and the record is left as it was. The unit test (tests/unit/test_kernel_preflight.py)
runs the same build on the fake engine; this one shows the real engine's sandbox is what runs it.
"""

from __future__ import annotations

import time

from tests.integration.conftest import cli, registry_digest


def test_smoke_without_10_3_fails_the_build_before_any_compile(smoke, tmp_path):
    variant = smoke.variant(tmp_path / "no103", "no103", lambda t: t.replace("      - 10.3f\n", "", 1))
    assert "10.3f" not in variant.matrix.read_text()
    record = variant.root / "locks" / "smoke" / "image.json"  # copied from the smoke when it was built
    before = record.read_bytes() if record.exists() else None
    started = time.monotonic()
    run = cli("--matrix", str(variant.matrix), "--target", "smoke", "--no-checks")
    seconds = time.monotonic() - started
    assert run.code == 1, run.err
    assert "kernels.required.FUSED_ADD_RMS_NORM_ARCHS: nothing loads on 10.3 (B300, GB300)" in run.err
    assert "(CMakeLists.txt:FUSED_ADD_RMS_NORM_ARCHS:146)" in run.err
    assert registry_digest(smoke.repository, "no103") is None
    assert (record.read_bytes() if record.exists() else None) == before  # no record written
    print(f"refused in {seconds:.1f} s")  # the brief's "in seconds": shown with -s, not asserted (benchmarks/)

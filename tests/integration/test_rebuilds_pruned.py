"""The cache after a prune: a fresh runner's empty engine builds nothing the registry's inline
cache holds. It empties the whole engine's build cache, so it runs alone (engine_exclusive) and,
in CI's order (conftest.SLOWEST_FIRST), last: the builds after it start cold."""

from __future__ import annotations

import re
import subprocess

import pytest

from builder.engine import buildlog
from tests.integration.conftest import cli
from tests.integration.test_rebuilds import _latest_log

pytestmark = pytest.mark.engine_exclusive  # the whole file: the engine is held per file (conftest._engine)


def test_cache_from_the_registry_after_pruning_the_engine(built, tmp_path):
    smoke, _ = built
    work = smoke.variant(tmp_path / "cache", "cached")
    image = re.search(r"registry: (\S+)", work.matrix.read_text()).group(1) + "/" + smoke.repository + ":cached"
    first = cli(
        "--matrix", str(work.matrix), "--target", "smoke", "--no-checks", "--force", "--cache-to", "type=inline"
    )
    assert first.code == 0, first.err[-2000:]
    # An empty engine, as on a fresh runner: no build cache, no local copy of the image.
    subprocess.run(["docker", "buildx", "prune", "-af"], capture_output=True, check=True)
    subprocess.run(["docker", "image", "rm", "-f", image], capture_output=True)
    again = cli("--matrix", str(work.matrix), "--target", "smoke", "--no-checks", "--force", "--cache-from", image)
    assert again.code == 0, again.err[-2000:]
    log = _latest_log(work.root)
    assert not buildlog.ran(log), [s.stage for s in buildlog.ran(log)]
    assert len([s for s in buildlog.steps(log) if s.instruction == "RUN" and s.cached]) >= 3
    # and without the cache the same build does run them, so the count above means something
    subprocess.run(["docker", "buildx", "prune", "-af"], capture_output=True, check=True)
    cold = cli("--matrix", str(work.matrix), "--target", "smoke", "--no-checks", "--force")
    assert cold.code == 0 and len(buildlog.ran(_latest_log(work.root))) >= 3

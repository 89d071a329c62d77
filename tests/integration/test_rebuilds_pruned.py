"""The cache after a prune: a fresh runner's empty engine builds nothing the registry's inline
cache holds.

It empties the engine of its own build's cache only, never the rest of the engine's (the user's demo,
the other tests', other work on the machine): its variant carries a compile variable of its own
(`compile.env`, in the build stage's first `ENV`), so every step of the build stage and what the
final stage copies from it has cache keys no other build has, and the records its builds made are
the ones the engine did not hold before them. Those are pruned by id. It still runs alone
(engine_exclusive): in a run of the suite only, the records made while it builds are its own, and
in CI's order (conftest.SLOWEST_FIRST) it is handed out last."""

from __future__ import annotations

import re
import secrets
import subprocess

import pytest

from builder.engine import buildlog
from tests.integration.conftest import cli
from tests.integration.test_rebuilds import _latest_log

pytestmark = pytest.mark.engine_exclusive  # the whole file: the engine is held per file (conftest._engine)


def _records() -> set[str]:
    """The ids of the engine's build cache records."""
    out = subprocess.run(["docker", "buildx", "du", "--verbose"], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"^ID:\s+(\S+)", out, re.M))


def _prune(ids: set[str]) -> None:
    """Remove these records and nothing else (one id per call: buildx takes one value per filter key).
    A record goes once the records made on top of it are gone, hence the passes."""
    for _ in range(6):
        left = ids & _records()
        if not left:
            return
        for record in sorted(left):
            subprocess.run(["docker", "buildx", "prune", "-af", "--filter", f"id={record}"], capture_output=True)
    assert not ids & _records(), f"build cache records of this test left after pruning: {sorted(ids & _records())}"


def _own_variable(text: str) -> str:
    marker = "        CMAKE_BUILD_TYPE: Release\n"
    assert text.count(marker) == 1, "the smoke matrix's compile.env changed: put the test's variable elsewhere"
    return text.replace(marker, marker + f"        K3_PRUNE_TEST_RUN: '{secrets.token_hex(8)}'\n")


def test_cache_from_the_registry_after_pruning_the_engine(built, tmp_path):
    smoke, _ = built
    work = smoke.variant(tmp_path / "cache", "cached", _own_variable)
    image = re.search(r"registry: (\S+)", work.matrix.read_text()).group(1) + "/" + smoke.repository + ":cached"
    before = _records()
    first = cli(
        "--matrix", str(work.matrix), "--target", "smoke", "--no-checks", "--force", "--cache-to", "type=inline"
    )
    assert first.code == 0, first.err[-2000:]
    ran_first = buildlog.ran(_latest_log(work.root))
    assert len(ran_first) >= 3, "the variable of its own did not make the steps new: the prune below proves nothing"
    # An engine without this build's cache, as on a fresh runner, and no local copy of the image.
    _prune(_records() - before)
    subprocess.run(["docker", "image", "rm", "-f", image], capture_output=True)
    again = cli("--matrix", str(work.matrix), "--target", "smoke", "--no-checks", "--force", "--cache-from", image)
    assert again.code == 0, again.err[-2000:]
    log = _latest_log(work.root)
    assert not buildlog.ran(log), [s.stage for s in buildlog.ran(log)]
    assert len([s for s in buildlog.steps(log) if s.instruction == "RUN" and s.cached]) >= 3
    # and without the cache the same build does run them, so the count above means something
    _prune(_records() - before)
    cold = cli("--matrix", str(work.matrix), "--target", "smoke", "--no-checks", "--force")
    assert cold.code == 0 and len(buildlog.ran(_latest_log(work.root))) >= 3
    _prune(_records() - before)  # what it made: no one else can use a cache keyed on its own variable
    subprocess.run(["docker", "image", "rm", "-f", image], capture_output=True)

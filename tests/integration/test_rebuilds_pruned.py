"""The cache after a prune: on a fresh runner's empty engine, `--cache-from` the last image (pushed
with `--cache-to type=inline`) gives every step of the image's own layers from the registry, and
the image has the same layers; without it the same build runs them.

It empties the engine of its own builds' cache only, never the rest of the engine's (the user's
demo, the other tests', other work on the machine). Its variant builds on bases of its own: the
smoke's two bases with one small file of this run added (a label would not do: BuildKit keys a
base by its layers), pushed to a repository of its own, so every step of every stage has cache
keys no other build has (a step's key starts from its base's). The records its builds make are
then the ones the engine did not hold before them, and those are pruned by id. It still runs
alone (engine_exclusive): in a run of the suite only (CI) nothing else builds meanwhile. On a
machine where other builds run beside the suite, a record they make during its builds cannot be
told from its own (a record shows its parent snapshot and command, not its cache key) and is
pruned too: cache only, which that build makes again. In CI's
order (conftest.SLOWEST_FIRST) it is handed out last."""

from __future__ import annotations

import json
import re
import secrets
import subprocess

import pytest

from builder.engine import buildlog
from tests.integration.conftest import REGISTRY, cli, delete_repository, registry_digest
from tests.integration.test_rebuilds import _latest_log

pytestmark = pytest.mark.engine_exclusive  # the whole file: the engine is held per file (conftest._engine)


def _records() -> set[str]:
    """The ids of the engine's build cache records."""
    out = subprocess.run(["docker", "buildx", "du", "--verbose"], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"^ID:\s+(\S+)", out, re.M))


def _prune(ids: set[str]) -> None:
    """Remove these records and nothing else (one id per call: buildx takes one value per filter key).
    A record goes once the records made on top of it are gone, hence the passes; one another build
    is using stays (only where other builds run beside the suite: see above). Whether this test's
    own cache went is what its cold build shows."""
    left = ids & _records()
    for _ in range(6):
        for record in sorted(left):
            subprocess.run(["docker", "buildx", "prune", "-af", "--filter", f"id={record}"], capture_output=True)
        now = ids & _records()
        if now == left:
            return
        left = now


def _own_bases(smoke, repository: str) -> dict[str, str]:
    """The smoke's bases with a file of this run added, pushed to ``repository``: old ref -> new ref."""
    run = secrets.token_hex(8)
    bases = re.search(r"\n    bases:\n      build: (\S+)\n      runtime: (\S+)\n", smoke.matrix.read_text()).groups()
    refs = {}
    for kind, ref in zip(("build", "runtime"), bases, strict=True):
        tag = f"{REGISTRY}/{repository}:{kind}"
        subprocess.run(
            ["docker", "buildx", "build", "--push", "-q", "-t", tag, "-"],
            input=f"FROM {ref}\nRUN echo {run} > /etc/k3-prune-test\n",
            text=True,
            capture_output=True,
            check=True,
        )
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)  # the local copy --push left
        refs[ref] = f"{tag}@{registry_digest(repository, kind)}"
    return refs


# The stages whose steps make the image's layers (the template's os-packages and runtime): what an
# inline cache holds. The build stage is not in the image, so on an empty engine it runs again
# (a registry cache of mode=max, on a docker-container builder, holds it too; docs/fast-rebuilds.md).
FINAL_STAGES = ("os-packages", "runtime")


def _final_steps(log: str) -> list[buildlog.Step]:
    return [s for s in buildlog.steps(log) if s.stage.split()[0] in FINAL_STAGES and s.instruction in ("RUN", "COPY")]


def _layers(out: str) -> list[str]:
    ref = out.strip().splitlines()[-1]
    raw = subprocess.run(
        ["docker", "buildx", "imagetools", "inspect", "--raw", ref], capture_output=True, text=True, check=True
    ).stdout
    return [layer["digest"] for layer in json.loads(raw)["layers"]]


@pytest.fixture()
def own_bases(built):
    """(old ref -> own base's ref, the engine's records before they were made)."""
    repository = f"{built[0].repository}-prune-bases"
    before = _records()
    try:
        yield _own_bases(built[0], repository), before
    finally:
        delete_repository(repository)
        listed = subprocess.run(
            ["docker", "image", "ls", "--digests", "--format", "{{.Repository}}@{{.Digest}}"],
            capture_output=True,
            text=True,
        ).stdout.split()
        for ref in listed:  # what the builds pulled of its bases, by digest
            if ref.split("@")[0] == f"{REGISTRY}/{repository}" and "@sha256:" in ref:
                subprocess.run(["docker", "image", "rm", "-f", ref], capture_output=True)


def test_cache_from_the_registry_after_pruning_the_engine(built, own_bases, tmp_path):
    smoke, _ = built
    bases, before = own_bases

    def rebased(text: str) -> str:
        for old, new in bases.items():
            text = text.replace(old, new)
        return text

    work = smoke.variant(tmp_path / "cache", "cached", rebased)
    locked = cli("--matrix", str(work.matrix), "lock", "--target", "smoke")  # the OS lock names its base
    assert locked.code == 0, locked.err[-2000:]
    image = f"{REGISTRY}/{smoke.repository}:cached"
    first = cli(
        "--matrix", str(work.matrix), "--target", "smoke", "--no-checks", "--force", "--cache-to", "type=inline"
    )
    assert first.code == 0, first.err[-2000:]
    new = [s for s in buildlog.steps(_latest_log(work.root)) if s.instruction in ("RUN", "COPY")]
    assert new and not [s.stage for s in new if s.cached], "the bases of its own made no step new"
    # An engine without this test's cache, as on a fresh runner, and no local copy of the image.
    subprocess.run(["docker", "image", "rm", "-f", image], capture_output=True)
    _prune(_records() - before)
    again = cli("--matrix", str(work.matrix), "--target", "smoke", "--no-checks", "--force", "--cache-from", image)
    assert again.code == 0, again.err[-2000:]
    final = _final_steps(_latest_log(work.root))
    assert len(final) >= 3 and not [s.stage for s in final if not s.cached], [(s.stage, s.cached) for s in final]
    assert _layers(first.out) == _layers(again.out)  # the image's layers are the last build's, from the registry
    # and without the cache the same build does run them, so the hits above came from the registry
    subprocess.run(["docker", "image", "rm", "-f", image], capture_output=True)
    _prune(_records() - before)
    cold = cli("--matrix", str(work.matrix), "--target", "smoke", "--no-checks", "--force")
    assert cold.code == 0, cold.err[-2000:]
    assert len([s for s in _final_steps(_latest_log(work.root)) if s.ran]) >= 3
    subprocess.run(["docker", "image", "rm", "-f", image], capture_output=True)
    _prune(_records() - before)  # what it made (its bases too): no other build has them

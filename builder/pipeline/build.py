"""The build, step by step: matrix -> Dockerfile -> lock -> context -> buildx -> registry -> record.

Order matters for the guarantees: everything that can refuse (drift, stale lock, corrupt or
inconsistent record, unreachable engine, wrong torch build) is checked before the engine is asked
for anything; the image is built into the local image store and searched for the build's secrets
before anything is pushed; and the record set is written only after the registry confirms it
serves the pushed digest and the image passed its checks; a build whose inputs and registry match the record is up
to date, and the engine builds nothing.

This module orchestrates, and holds the entry points the commands call (``__all__``). Each step
lives in the module named for what it owns: plan (the offline checks, the input key), context (the
per-build context), prepush (the local build, the secret scan, then the push), publish (after the
push: the checks, the SBOM and provenance, the record set), targetlock (one build of a target at a time, an interrupted
record write finished first, prune) and reproduce; below them deps, source, engine, checks and
records. tests/unit/test_pipeline_ordering.py holds the order to these guarantees, with a fake engine.
"""

from __future__ import annotations

import datetime as dt
import shutil
import time
from pathlib import Path
from secrets import token_hex

from builder import log
from builder.config import contract
from builder.config.matrix import Matrix
from builder.config.options import BuildOptions
from builder.deps import lock, oslock
from builder.dockerfile import compilecache, render
from builder.engine.seam import Engine
from builder.errors import CheckFailed, RecordError
from builder.fsutil import atomic_write, sha256_bytes
from builder.pipeline import publish, publishindex
from builder.pipeline.context import BuildContext, Prepared, prepare, run_engine
from builder.pipeline.outcome import BuildOutcome
from builder.pipeline.plan import LockSet, Offline, Plan
from builder.pipeline.reproduce import Reproduction, reproduce, reproduce_all
from builder.pipeline.targetlock import prune, target_lock
from builder.records import index
from builder.records import store as records
from builder.source import pinned as source

__all__ = [
    "BuildOutcome",
    "Reproduction",
    "build",
    "lock_target",
    "prune",
    "recorded_image",
    "rehearse_lock",
    "render_all",
    "reproduce",
    "reproduce_all",
    "test",
]


# --- render -------------------------------------------------------------------------------------


def render_all(matrix: Matrix, names: list[str], *, check: bool) -> dict[str, str]:
    """`build render`: every named target's Dockerfile (one per platform it names: the first at
    dockerfiles/<target>/Dockerfile, each further one under dockerfiles/<target>/<os>-<arch>/), all
    rendered before any is written. Returns "<target>[/<os>-<arch>]" -> "up to date", "written", or
    (with ``check``, nothing written) the drift."""
    plans = {}
    for n in names:
        whole = Plan.of(matrix, n)
        for pp in whole.platform_plans()[1:]:
            plans[f"{n}/{contract.platform_slug(str(pp.platform))}"] = pp
        plans[n] = whole
    rendered = {key: render.render(pp.target) for key, pp in plans.items()}
    status = {}
    for key, text in sorted(rendered.items()):
        path = plans[key].dockerfile
        problem = render.drift(plans[key].target, path, text)
        if problem is None:
            status[key] = "up to date"
        elif check:
            status[key] = problem
        else:
            atomic_write(path, text)
            status[key] = "written"
    return status


def recorded_image(plan: Plan) -> str:
    """The image ``plan``'s record names (for test, doctor, compare without --image): of a target
    built into an image index, the index (doctor picks the host's platform from it)."""
    path = plan.record_dir / contract.RECORD_NAME
    if plan.indexed and index.kind_of(path) == contract.INDEX_KIND:
        found = index.read(path)
        assert found is not None  # kind_of found the file
        return found.image
    record = records.read(path)
    if record is None:
        raise RecordError(f"{plan.target.name} has no recorded image (no {contract.RECORD_NAME}); pass --image REF")
    return record.image


# --- lock ---------------------------------------------------------------------------------------


def lock_target(plan: Plan, engine_factory=None) -> dict[str, Path]:
    """`build lock`: resolve both locks from the matrix and the source at the pin (and the OS lock,
    in a container of the runtime base, when the target has os_packages); write them only once
    every one of them resolved, under the target's lock (a build reading them meanwhile makes
    this one exit 75)."""
    plan.lock_paths.runtime.parent.mkdir(parents=True, exist_ok=True)
    with target_lock(plan):
        return _lock_target(plan, engine_factory)


def _lock_target(plan: Plan, engine_factory=None) -> dict[str, Path]:
    """Every platform's locks (one platform: the target's own), all resolved before any is written."""
    target = plan.target
    plans = plan.platform_plans() or [plan]
    os_texts: dict[Path, str] = {}
    for pp in plans:
        osp, where = pp.target.os_packages, f" ({pp.platform})" if pp.platform else ""
        if osp and pp.lock_paths.os:
            with log.step(
                f"{target.name}{where}: resolve the OS packages against the runtime base's dpkg database "
                f"({osp.archive} {' '.join(osp.suites)})",
                long=True,
            ):
                os_texts[pp.lock_paths.os] = oslock.resolve(
                    engine_factory(), pp.target, f"{plan.matrix_path or 'matrix.yaml'}: "
                )
    with log.step(f"{target.name}: fetch source {target.source.branch} @ {target.source.commit[:12]}", long=True):
        pinned = source.fetch(target.source)
    texts: dict[Path, str] = {}
    for pp in plans:
        with log.step(
            f"{target.name}: resolve the runtime and build locks (uv, for Python {pp.target.python.version} on "
            f"{pp.target.python.uv_platform()})",
            long=True,
        ):
            for name, text in lock.compute(pp.target, pinned).items():
                texts[pp.lock_paths.runtime.parent / name] = text
    written = {}
    for path, text in {**texts, **os_texts}.items():
        atomic_write(path, text)
        written[str(path.relative_to(plan.root / contract.LOCKS_DIR / target.name))] = path
    return written


def rehearse_lock(plan: Plan):
    """`build lock --rehearse`: the same resolution against PyPI only; nothing under locks/."""
    from builder.deps import rehearse

    with log.step(
        f"{plan.target.name}: REHEARSAL of the lock against PyPI only (the real lock needs the real indexes)", long=True
    ):
        return rehearse.rehearse(plan.target, plan.root)


# --- build --------------------------------------------------------------------------------------


def build(plan: Plan, engine: Engine, options: BuildOptions) -> BuildOutcome:
    # --platform (a value BuildOptions already took as a platform) that the target does not name,
    # or on a one-image target: refused before the target's lock is taken, not ignored.
    plan.chosen(options.platforms)
    with target_lock(plan):
        try:
            if plan.indexed:  # each platform built on its own, then one image index names them
                return _index_outcome(plan, publishindex.build_index(plan, engine, options, _build))
            return _build(plan, engine, options)
        finally:
            if not options.keep_context:
                _drop_inputs(plan)


def _index_outcome(plan: Plan, result: publishindex.IndexResult) -> BuildOutcome:
    r = result.record
    return BuildOutcome(
        plan.target.name,
        r.image,
        r.digest,
        None,
        result.seconds,
        plan.record_dir / contract.RECORD_NAME,
        None,
        result.changed,
        up_to_date=result.up_to_date,
        platforms=result.platforms,
    )


def _drop_inputs(plan: Plan) -> None:
    """The engine's inputs are copies (a cu129 source export is about a GB): once the build is
    over they go, so artifacts/ keeps what explains a build (logs, reports), not what repeats it."""
    for build_dir in (plan.root / contract.ARTIFACTS_DIR / plan.target.name).glob("*"):
        for name in contract.BULKY_INPUTS:
            shutil.rmtree(build_dir / name, ignore_errors=True)


def _build(plan: Plan, engine: Engine, options: BuildOptions, *, offline: Offline | None = None) -> BuildOutcome:
    """One image's build (``offline``: its offline checks, when the index assembly ran them already)."""
    target, started = plan.target, time.monotonic()
    record_path = plan.record_dir / contract.RECORD_NAME
    previous = records.read(record_path)  # a damaged record stops the build before anything runs
    _record_holds(plan, previous)
    ctx = BuildContext.checked(plan, engine, options, offline=offline)
    if not options.force and not options.no_cache:
        with log.step(f"{target.name}: compare inputs with the record"):
            current = previous is not None and up_to_date(ctx, previous)
        if previous is not None and current:
            of = f" ({plan.platform})" if plan.platform else ""
            log.info(f"    up to date{of}: {previous.image} (same inputs, served by the registry; --force rebuilds)")
            return BuildOutcome(
                target.name,
                previous.image,
                previous.digest,
                None,
                time.monotonic() - started,
                record_path,
                None,
                changed=False,
                up_to_date=True,
                gpu=previous.gpu,
                platform=plan.platform,
            )
    signer = publish.provenance_signer(plan)  # a key that cannot sign fails now (exit 2), not after the compile
    with compilecache.secret_dir() as secret_dir:  # the backend's secret lives only as long as the build
        prep = prepare(ctx, Path(secret_dir))
        result = run_engine(prep)
    cache = _cache_stats(prep)
    pushed = f"{target.image.name}@{result.digest}"  # scanned before the push (run_engine)
    size = engine.registry.image_size(pushed)
    gpu = publish.check_image(prep, pushed) if options.run_checks else None
    seconds = time.monotonic() - started
    record = publish.record_of(prep, result.digest, options.run_checks, seconds, gpu)
    record = publish.attach_and_write(prep, record, signer)
    changed = previous is None or previous.digest != record.digest
    return BuildOutcome(
        target.name,
        record.image,
        result.digest,
        size,
        seconds,
        record_path,
        prep.log_path,
        changed,
        cache=cache,
        gpu=gpu,
        platform=plan.platform,
    )


def _cache_stats(prep: Prepared) -> compilecache.Stats | None:
    """What the compile cache did, from the build log: shown, and kept at the end of the log."""
    cache = compilecache.stats(prep.log_path.read_text(errors="replace"))
    if cache:
        (log.warn if cache.backend_unreachable else log.info)(f"    {cache.line()}")
        with prep.log_path.open("a") as fh:
            fh.write(f"[k3-builder] {cache.line()}\n")
    return cache


def _record_holds(plan: Plan, previous: records.Record | None) -> None:
    """A record set that does not hold together (an edited digest, a missing or swapped SBOM) is
    evidence: refused (exit 2), never called up to date, never rebuilt over."""
    if previous is None:
        return
    problems = records.set_problems(plan.root, plan.target.name, previous, plan.record_dir)
    if problems:
        raise RecordError(
            f"{plan.record_dir / contract.RECORD_NAME}: the record set does not hold: "
            f"{'; '.join(problems)}; `build verify --target {plan.target.name}` explains; restore "
            "the files from git"
        )


def up_to_date(ctx: BuildContext, previous: records.Record) -> bool:
    """The recorded build had these exact inputs and the registry still serves it under the tag."""
    if previous.input_key != ctx.input_key:
        return False
    target, engine = ctx.target, ctx.engine
    if not engine.registry.serves(target.image.name, previous.digest):
        return False
    if engine.registry.resolve_digest(f"{target.image.name}:{ctx.tag}") != previous.digest:
        return False
    _attached_as_recorded(ctx.plan, engine, previous, ctx.plan.record_dir)
    return True


def _attached_as_recorded(plan: Plan, engine: Engine, previous: records.Record, directory: Path | None = None) -> None:
    """The registry's SBOM and provenance for the recorded digest are the record's. A record write
    that failed after the attach (a full or read-only disk) left the failed build's there: the
    record's own are attached again (a roll back of the registry), no --force needed. ``directory``:
    the record set's (default locks/<target>/)."""
    name = plan.target.image.name
    attached = {sha256_bytes(content) for content in engine.registry.referrers(name, previous.digest).values()}
    if {previous.build.get("sbom_sha256"), previous.build.get("provenance_sha256")} <= attached:
        return
    from builder.records import attest

    annotations = {contract.OCI_CREATED: contract.created_iso(previous.source_date_epoch)}
    for kind, path in (
        (
            attest.SBOM_TYPE,
            (directory or contract.record_path(plan.root, plan.target.name).parent) / contract.SBOM_NAME,
        ),
        (
            attest.PROVENANCE_TYPE,
            (directory or contract.record_path(plan.root, plan.target.name).parent) / contract.PROVENANCE_NAME,
        ),
    ):
        engine.registry.attach(name, previous.digest, kind, path.read_bytes(), annotations)
    log.info(
        f"    the registry's SBOM/provenance for {previous.digest[:19]} were not the record's (a record write "
        "that failed after the attach): the record's attached again"
    )


# --- test ---------------------------------------------------------------------------------------


def test(plan: Plan, engine: Engine, image: str | None, platform: str | None = None) -> list:
    """`build test`: the image checks on ``image`` (default: the recorded image), JUnit beside; one
    report per platform of a target built into an image index (each platform's manifest, checked
    on its platform: emulated where it is not this machine's). Every platform runs before a
    failure is raised. ``platform`` (`--platform`): that platform of the target alone, and
    ``image`` may be one image of it (a plain manifest, not an index)."""
    chosen = plan.chosen((platform,) if platform else ())  # refused (exit 2) before anything is read
    if not plan.indexed:
        return [_test_one(plan, engine, image)]
    refs = publishindex.platform_refs(plan, engine, image, platform)
    reports, failures = [], []
    for pp in chosen:
        try:
            reports.append(_test_one(pp, engine, refs[str(pp.platform)]))
        except CheckFailed as exc:
            failures.append(exc)
    if failures:
        raise failures[0] if len(failures) == 1 else CheckFailed("; ".join(f.message for f in failures))
    return reports


def _test_one(plan: Plan, engine: Engine, image: str | None):
    from builder.checks import runner

    target = plan.target
    record = records.read(plan.record_dir / contract.RECORD_NAME)
    ref = image or recorded_image(plan)
    locks = LockSet.read(plan)
    with log.step(f"{target.name}: engine preflight"):
        engine.preflight()
    with log.step(f"{target.name}: fetch source {target.source.branch} @ {target.source.commit[:12]}"):
        pinned = source.fetch(target.source)
    recorded = record is not None and ref == record.image
    build_date = dt.date.fromisoformat(record.build["finished"][:10]) if record and recorded else dt.date.today()
    out_dir = contract.artifacts_path(
        plan.root,
        target.name,
        "test-" + dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + token_hex(3),
    )
    with log.step(f"{target.name}: image checks on {ref}"):
        # The record's wheel RECORD digests hold for an image of the recorded lock (installed_files).
        wheels = record.wheel_records if record and record.lock_sha256 == locks.runtime_sha256 else None
        report = runner.check_target(
            engine,
            ref,
            target=target,
            locks=locks,
            pinned=pinned,
            build_date=build_date,
            out_dir=out_dir,
            wheel_records=wheels,
            platform=plan.platform,
        )
        report.raise_for_failures()
    return report

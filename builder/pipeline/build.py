"""The build, step by step: matrix -> Dockerfile -> lock -> context -> buildx -> registry -> record.

Order matters for the guarantees: everything that can refuse (drift, stale lock, corrupt or
inconsistent record, unreachable engine, wrong torch build) is checked before the engine is asked
for anything, and the record set is written only after the registry confirms it serves the pushed
digest and the image passed its checks. This module orchestrates; each step lives in the module
named for what it owns (plan, lock, source, buildcontext, engine, imagechecks, attest, records).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from secrets import token_hex

from builder import __version__, log
from builder.config import contract
from builder.config.matrix import Matrix, Target
from builder.config.options import BuildOptions
from builder.deps import lock, oslock
from builder.deps.buildcontext import assemble
from builder.dockerfile import compilecache, render
from builder.engine.buildx import BuildRequest, BuildResult, Engine, EngineInfo
from builder.errors import BuilderError, BuildError, Busy, ConfigError, NotReproduced, RecordError
from builder.fsutil import atomic_write, sha256_bytes, sha256_file
from builder.pipeline.plan import LockSet, Plan, input_key, offline_checks, parallelism
from builder.records import store as records
from builder.source import pinned as source
from builder.source.pinned import PinnedSource

_ATTEST_DRIVERS = ("docker-container", "remote", "kubernetes")


@dataclass
class Outcome:
    target: str
    image: str
    digest: str
    size: int | None
    seconds: float
    record: Path
    log: Path | None
    changed: bool = True
    up_to_date: bool = False
    cache: compilecache.Stats | None = None


@dataclass(frozen=True)
class BuildContext:
    """One engine build of one target, made once when the offline checks have passed: what it reads
    (the plan; the Dockerfile text and the locks as read and hashed, and their input key), how (the
    options, the tag it pushes, whether BuildKit's cache is skipped) and with what (the engine).
    Each step of the build takes this, not its pieces one by one."""

    plan: Plan
    engine: Engine
    options: BuildOptions
    dockerfile_text: str
    locks: LockSet
    input_key: str
    tag: str
    no_cache: bool

    @classmethod
    def checked(
        cls, plan: Plan, engine: Engine, options: BuildOptions, *, tag: str | None = None, no_cache: bool | None = None
    ) -> BuildContext:
        """The offline checks (`plan.offline_checks`), then the context of a build of the bytes they
        read. ``tag``: the target's unless given; ``no_cache``: --no-cache unless given."""
        dockerfile_text, locks = offline_checks(plan)
        return cls(
            plan=plan,
            engine=engine,
            options=options,
            dockerfile_text=dockerfile_text,
            locks=locks,
            input_key=input_key(plan, dockerfile_text, locks),
            tag=plan.target.image.tag if tag is None else tag,
            no_cache=options.no_cache if no_cache is None else no_cache,
        )

    @property
    def target(self) -> Target:
        return self.plan.target


@dataclass(frozen=True)
class Prepared:
    """A build context checked against the engine and the source, its inputs assembled into what
    the engine is asked to build (``request``); nothing pushed or recorded yet."""

    ctx: BuildContext
    info: EngineInfo
    pinned: PinnedSource
    third_party: dict  # name -> source.PinnedThirdParty
    build_id: str
    workdir: Path
    request: BuildRequest
    started_iso: str

    @property
    def target(self) -> Target:
        return self.ctx.plan.target

    @property
    def log_path(self) -> Path:
        return self.workdir / contract.BUILD_LOG_NAME


# --- render -------------------------------------------------------------------------------------


def render_all(matrix: Matrix, names: list[str], *, check: bool) -> dict[str, str]:
    """`build render`: every named target's Dockerfile, all rendered before any is written.
    Returns name -> "up to date", "written", or (with ``check``, nothing written) the drift."""
    rendered = {n: render.render(matrix.target(n)) for n in names}
    status = {}
    for name, text in rendered.items():
        path = render.output_path(matrix.path, name)
        problem = render.drift(matrix.target(name), path, text)
        if problem is None:
            status[name] = "up to date"
        elif check:
            status[name] = problem
        else:
            atomic_write(path, text)
            status[name] = "written"
    return status


def recorded_image(plan: Plan) -> str:
    """The image ``plan``'s record names (for test, doctor, compare without --image)."""
    record = records.read(contract.record_path(plan.root, plan.target.name))
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
    target = plan.target
    os_text = None
    if target.os_packages:
        with log.step(
            f"{target.name}: resolve the OS packages against the runtime base's dpkg database "
            f"({target.os_packages.archive} {' '.join(target.os_packages.suites)})",
            long=True,
        ):
            os_text = oslock.resolve(engine_factory(), target, f"{plan.matrix_path or 'matrix.yaml'}: ")
    with log.step(f"{target.name}: fetch source {target.source.branch} @ {target.source.commit[:12]}", long=True):
        pinned = source.fetch(target.source)
    with log.step(
        f"{target.name}: resolve the runtime and build locks (uv, for Python {target.python.version} on "
        f"{target.python.uv_platform()})",
        long=True,
    ):
        written = lock.write(plan.root, target, pinned)
    if os_text is not None:
        path = contract.os_lock_path(plan.root, target.name)
        atomic_write(path, os_text)
        written[contract.OS_LOCK_NAME] = path
    return written


def rehearse_lock(plan: Plan):
    """`build lock --rehearse`: the same resolution against PyPI only; nothing under locks/."""
    from builder.deps import rehearse

    with log.step(
        f"{plan.target.name}: REHEARSAL of the lock against PyPI only (the real lock needs the real indexes)", long=True
    ):
        return rehearse.rehearse(plan.target, plan.root)


# --- build --------------------------------------------------------------------------------------


def _fetch_inputs(ctx: BuildContext) -> tuple[PinnedSource, dict]:
    target, locks = ctx.target, ctx.locks
    with log.step(f"{target.name}: fetch source {target.source.branch} @ {target.source.commit[:12]}", long=True):
        pinned = source.fetch(target.source)
        if pinned.branch_head != target.source.commit:
            log.warn(
                f"{target.source.branch} has moved to {pinned.branch_head[:12]}; building the pin "
                f"{target.source.commit[:12]} (run `build track` to move it)"
            )
    third = {}
    if target.source.third_party:
        with log.step(f"{target.name}: fetch {len(target.source.third_party)} pinned third-party source(s)", long=True):
            third = source.fetch_all_third_party(target.source, pinned)
            for tp in third.values():
                log.info(
                    f"    {tp.name}: {tp.url} @ {tp.commit[:12]}"
                    + (f" + {len(tp.submodules)} submodule(s)" if tp.submodules else "")
                )
    with log.step(f"{target.name}: check the locks were made from these inputs"):
        lock.check_current(locks.runtime, lock.inputs(target, pinned, "runtime"), locks.runtime_text)
        lock.check_current(locks.build, lock.inputs(target, pinned, "build"), locks.build_text)
    return pinned, third


def _preflight(ctx: BuildContext) -> EngineInfo:
    target = ctx.target
    with log.step(f"{target.name}: engine preflight"):
        info = ctx.engine.preflight(ctx.options.builder)
        log.info(
            f"    engine {info.server_version}, buildx {info.buildx_version}, builder {info.builder} ({info.driver})"
        )
    if info.driver not in _ATTEST_DRIVERS:
        log.info(
            f"    note: the {info.driver} driver cannot make BuildKit attestations; the tool's own SBOM "
            f"and provenance (locks/{target.name}/) are the record, attached to the image in the registry"
        )
    return info


def _request(
    ctx: BuildContext, info: EngineInfo, contexts: dict[str, Path], *, epoch: int, secrets: tuple[str, ...]
) -> BuildRequest:
    """``secrets``: the compile cache's, if any (it selects the compile stage that reaches it)."""
    target, options = ctx.target, ctx.options
    par = parallelism(target, info.cpus, info.memory_bytes, options.max_jobs)
    log.info(f"    {par.describe()}")
    return BuildRequest(
        context=contexts.pop("default"),
        dockerfile=contexts.pop("dockerfile"),
        tags=(f"{target.image.name}:{ctx.tag}",),
        build_args={
            "SOURCE_DATE_EPOCH": str(epoch),
            "MAX_JOBS": str(par.max_jobs),
            "NVCC_THREADS": str(target.compile.nvcc_threads),
            "K3_CREATED": contract.created_iso(epoch),
            "K3_LOCK_SHA256": ctx.locks.runtime_sha256,
            # The compile stage with the shared cache, only when there is a backend to reach.
            **({contract.COMPILE_MODE_ARG: contract.COMPILE_MODE_REMOTE} if secrets else {}),
        },
        build_contexts=contexts,
        source_date_epoch=epoch,
        push=True,
        no_cache=ctx.no_cache,
        builder=options.builder,
        attest=info.driver in _ATTEST_DRIVERS,
        cache_from=options.cache_from,
        cache_to=options.cache_to,
        secrets=options.secrets + secrets,
    )


def _cache_secret(target: Target, options: BuildOptions, secret_dir: Path | None) -> tuple[str, ...]:
    """The remote compile cache's BuildKit secret: the command line's backend, else the matrix's."""
    url = options.compile_cache or target.compile.cache_url
    if not url:
        return ()
    if not target.compile.remote and options.compile_cache_from_env:
        # A CI-wide variable meets a target that compiles with the network off: that target wins.
        log.info(
            f"    compile cache: $K3_COMPILE_CACHE not used: targets.{target.name}.compile.remote_cache is "
            "false (the compile keeps --network=none)"
        )
        return ()
    if not target.compile.remote or secret_dir is None:
        raise ConfigError(
            f"--compile-cache: target {target.name} compiles with the network off; set "
            f"targets.{target.name}.compile.remote_cache: true (and re-render) to use a remote cache"
        )
    log.info(f"    compile cache: {compilecache.describe(url)} (as a BuildKit secret)")
    return (compilecache.secret(url, secret_dir),)


def prepare(ctx: BuildContext, secret_dir: Path | None = None) -> Prepared:
    """Engine and source checks, then the context: nothing here pushes or records anything."""
    target, plan = ctx.target, ctx.plan
    extra_secrets = _cache_secret(target, ctx.options, secret_dir)
    # Room for what the build writes after the push (the record set) and along the way (the log):
    # refused now, not after the image is pushed and attached.
    records.check_writable(contract.record_path(plan.root, target.name).parent, "the record set")
    records.check_writable(contract.artifacts_path(plan.root, target.name, "x").parent, "the build's artifacts")
    info = _preflight(ctx)
    build_id = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + token_hex(3)
    workdir = contract.artifacts_path(plan.root, target.name, build_id)
    workdir.mkdir(parents=True)
    log_path = workdir / contract.BUILD_LOG_NAME
    log_path.write_text(f"[k3-builder] build {build_id} of target {target.name}, tool {__version__}\n")
    started = contract.now_iso()
    pinned, third = _fetch_inputs(ctx)
    epoch = pinned.source_date_epoch
    contexts = _assemble(ctx, workdir, pinned, third)
    request = _request(ctx, info, contexts, epoch=epoch, secrets=extra_secrets)
    with log_path.open("a") as fh:
        fh.write(f"[k3-builder] source {target.source.url} @ {target.source.commit}, SOURCE_DATE_EPOCH={epoch}\n")
        fh.writelines(f"[k3-builder] third party {tp.name}: {tp.url} @ {tp.commit}\n" for tp in third.values())
        fh.write(f"[k3-builder] {parallelism(target, info.cpus, info.memory_bytes, ctx.options.max_jobs).describe()}\n")
    return Prepared(ctx, info, pinned, third, build_id, workdir, request, started)


def _assemble(ctx: BuildContext, workdir: Path, pinned: PinnedSource, third: dict) -> dict[str, Path]:
    """The engine's inputs under ``workdir``: the default context, the Dockerfile, the source and
    each third-party tree (build context name -> directory)."""
    epoch = pinned.source_date_epoch
    with log.step(f"{ctx.target.name}: assemble the build context (download and hash-check the wheels)", long=True):
        # The Dockerfile as checked and hashed, not the file again (which could change meanwhile).
        (workdir / "Dockerfile").write_text(ctx.dockerfile_text, encoding="utf-8")
        contexts = {
            "default": assemble(ctx.target, ctx.locks, workdir / "context", epoch, ctx.dockerfile_text),
            "dockerfile": workdir / "Dockerfile",
            "source": pinned.export(workdir / "source"),
        }
        for name, tp in third.items():
            contexts[contract.third_party_context(name)] = tp.export(workdir / "third_party" / name)
    return contexts


def record_source(target: Target, third: dict) -> dict:
    """The record's ``source``: the pinned commit plus every third-party tree the compile used."""
    doc = {"url": target.source.url, "branch": target.source.branch, "commit": target.source.commit}
    if third:
        doc["third_party"] = {name: tp.to_json() for name, tp in sorted(third.items())}
    return doc


def run_engine(prep: Prepared) -> BuildResult:
    """Build and push, then make sure the registry serves the digest buildx reported."""
    target, engine = prep.target, prep.ctx.engine
    with log.step(f"{target.name}: buildx build and push {prep.request.tags[0]} (log: {prep.log_path})"):
        result = engine.build(prep.request, prep.log_path, log.raw)
    with log.step(f"{target.name}: confirm the registry serves {result.digest[:19]}"):
        try:
            served = engine.registry.serves(target.image.name, result.digest)
        except BuildError as exc:  # unreachable registry included: name the kept log
            raise type(exc)(f"{exc.message}; the build log is kept: {prep.log_path}") from None
        if not served:
            raise BuildError(
                f"the registry does not serve {target.image.name}@{result.digest} after the push; "
                f"the build log is kept: {prep.log_path}"
            )
    return result


def _record(prep: Prepared, digest: str, checked: bool, seconds: float) -> records.Record:
    """The record of a pushed image, its audit hashes still empty (the SBOM describes the record)."""
    target, locks = prep.target, prep.ctx.locks
    return records.Record(
        target=target.name,
        image=f"{target.image.name}@{digest}",
        digest=digest,
        bases={
            role: {"name": getattr(target.bases, role).display_name, "digest": getattr(target.bases, role).digest}
            for role in ("build", "runtime")
        },
        source=record_source(target, prep.third_party),
        lock_sha256=locks.runtime_sha256,
        build_lock_sha256=locks.build_sha256,
        os_lock_sha256=locks.os_sha256,
        dockerfile_sha256=sha256_bytes(prep.ctx.dockerfile_text.encode()),
        source_date_epoch=prep.pinned.source_date_epoch,
        input_key=prep.ctx.input_key,
        tool_version=__version__,
        checks="passed" if checked else "skipped",
        build={
            "id": prep.build_id,
            "finished": contract.now_iso(),
            "duration_seconds": round(seconds, 1),
            "engine": prep.info.server_version,
            "buildx": prep.info.buildx_version,
            "driver": prep.info.driver,
        },
    )


def _scan_for_secrets(prep: Prepared, digest: str) -> None:
    """Before the checks and the record: no registered secret (in any written form) in a layer the
    build added. A hit fails the build; the pushed manifest is withdrawn where the registry lets us."""
    from builder.checks import secretscan

    if not secretscan.needles():
        return  # no secret given to this build: nothing to look for
    target, engine = prep.target, prep.ctx.engine
    with log.step(f"{target.name}: scan the image's own layers for the build's secrets"):
        try:
            secretscan.scan(engine.registry, target.image.name, digest, _base_layers(engine, target))
        except BuildError as exc:
            withdrawn = engine.registry.delete_manifest(target.image.name, digest)
            then = "the pushed manifest was deleted" if withdrawn else f"delete {target.image.tagged} by hand"
            raise BuildError(f"{exc.message}; {then}", str(prep.log_path)) from None


def _base_layers(engine: Engine, target: Target) -> frozenset[str]:
    """The runtime base's layer digests (pinned, not built by us), when its registry answers."""
    base = target.bases.runtime
    first = base.name.split("/", 1)[0]
    if "/" not in base.name or not ("." in first or ":" in first or first == "localhost"):
        return frozenset()
    try:
        manifest = engine.registry.raw_manifest(base.name, engine.registry.platform_digest(base.name, base.digest))
    except BuilderError:
        return frozenset()
    return frozenset(layer.get("digest") for layer in manifest.doc.get("layers") or []) if manifest else frozenset()


def _check(prep: Prepared, pushed: str) -> None:
    """Before the record: image.json only names an image that passed its checks. A failing check
    fails the command; the image stays in the registry and the JUnit report beside the log."""
    from builder.checks import runner as imagechecks

    target, today = prep.target, dt.datetime.now(dt.timezone.utc).date()
    with log.step(f"{target.name}: image checks on {pushed}"):
        report = imagechecks.check_target(
            prep.ctx.engine, target, prep.ctx.locks, prep.pinned, pushed, today, prep.workdir
        )
        report.raise_for_failures()


def _publish(prep: Prepared, record: records.Record, signer) -> records.Record:
    """Attach the SBOM and provenance in the registry, then write the record set as one unit."""
    from builder.records import attest

    target, root, locks = prep.target, prep.ctx.plan.root, prep.ctx.locks
    with log.step(f"{target.name}: SBOM and provenance, attached to {record.image[-19:]}"):
        wheels = attest.wheel_files(prep.request.context / "wheelhouse" / "layers")  # what was installed
        build_wheels = attest.wheel_files(prep.request.context / "wheelhouse" / "build")  # what compiled it
        debs = attest.deb_files(prep.request.context / "debs") if locks.os_entries else None
        sbom_text, prov_text = attest.publish(
            prep.ctx.engine,
            target,
            record,
            list(locks.runtime_entries),
            prep.request.build_args,
            prep.started_iso,
            wheels=wheels,
            build_wheels=build_wheels,
            root=root,
            signer=signer,
            os_lock=list(locks.os_entries),
            debs=debs,
        )
    final = dataclasses.replace(record, build={**record.build, **records.audit_hashes(sbom_text, prov_text)})
    records.write_set(
        contract.record_path(root, target.name).parent,
        {contract.SBOM_NAME: sbom_text, contract.PROVENANCE_NAME: prov_text, contract.RECORD_NAME: final.to_json()},
    )
    return final


def _provenance_signer(plan: Plan):
    """The matrix's provenance signer (builder/records/provsign.py), or None with a warning: unsigned."""
    from builder.records import provsign

    signer = provsign.signer(plan.target.signing, plan.root)
    if signer is None:
        log.warn(
            f"    {plan.target.name}: the provenance will be UNSIGNED (no signing.key in the matrix); "
            "`build verify` reports it"
        )
    return signer


def _record_holds(plan: Plan, previous: records.Record | None) -> None:
    """A record set that does not hold together (an edited digest, a missing or swapped SBOM) is
    evidence: refused (exit 2), never called up to date, never rebuilt over."""
    if previous is None:
        return
    problems = records.set_problems(plan.root, plan.target.name, previous)
    if problems:
        raise RecordError(
            f"{contract.record_path(plan.root, plan.target.name)}: the record set does not hold: "
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
    if engine.registry.resolve_digest(target.image.tagged) != previous.digest:
        return False
    _attached_as_recorded(ctx.plan, engine, previous)
    return True


def _attached_as_recorded(plan: Plan, engine: Engine, previous: records.Record) -> None:
    """The registry's SBOM and provenance for the recorded digest are the record's. A record write
    that failed after the attach (a full or read-only disk) left the failed build's there: the
    record's own are attached again (a roll back of the registry), no --force needed."""
    name = plan.target.image.name
    attached = {sha256_bytes(content) for content in engine.registry.referrers(name, previous.digest).values()}
    if {previous.build.get("sbom_sha256"), previous.build.get("provenance_sha256")} <= attached:
        return
    from builder.records import attest

    annotations = {contract.OCI_CREATED: contract.created_iso(previous.source_date_epoch)}
    for kind, path in (
        (attest.SBOM_TYPE, contract.sbom_path(plan.root, plan.target.name)),
        (attest.PROVENANCE_TYPE, contract.provenance_path(plan.root, plan.target.name)),
    ):
        engine.registry.attach(name, previous.digest, kind, path.read_bytes(), annotations)
    log.info(
        f"    the registry's SBOM/provenance for {previous.digest[:19]} were not the record's (a record write "
        "that failed after the attach): the record's attached again"
    )


@contextlib.contextmanager
def target_lock(plan: Plan) -> Iterator[None]:
    """One build of a target at a time on this checkout: a second one is refused, not interleaved.

    The lock is flock(2) on the target's locks/ directory itself, so taking it writes nothing, and
    the kernel drops it when the process dies however it dies. Under it, an interrupted record
    write is finished or discarded first.
    """
    with _directory_lock(plan.lock_paths.runtime.parent, plan.target.name):
        yield


@contextlib.contextmanager
def _directory_lock(directory: Path, name: str) -> Iterator[None]:
    """flock(2) on locks/<target>/ (build, lock and prune share it); Busy (75) when held."""
    if not directory.is_dir():
        yield  # no locks directory: the offline checks refuse this build before it writes anything
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(
                f"{name}: another build of this target is running in this checkout (or its `build lock` "
                "or `prune`); wait for it to finish, then run again"
            ) from None
        for done in records.recover(directory):
            log.info(f"    {directory}: {done}")
        yield
    finally:
        os.close(fd)


def build(plan: Plan, engine: Engine, options: BuildOptions) -> Outcome:
    with target_lock(plan):
        try:
            return _build(plan, engine, options)
        finally:
            if not options.keep_context:
                _drop_inputs(plan)


def _drop_inputs(plan: Plan) -> None:
    """The engine's inputs are copies (a cu129 source export is about a GB): once the build is
    over they go, so artifacts/ keeps what explains a build (logs, reports), not what repeats it."""
    for build_dir in (plan.root / contract.ARTIFACTS_DIR / plan.target.name).glob("*"):
        for name in contract.BULKY_INPUTS:
            shutil.rmtree(build_dir / name, ignore_errors=True)


def prune(root: Path, names: list[str], keep: int) -> list[Path]:
    """`build prune`: per target, under its lock (never beside a live build), all but the newest
    ``keep`` build directories and ``keep`` test directories under artifacts/ are removed. The
    build image.json names is never removed; the rest are ordered by when they last wrote (not by
    their wall-clock names, which a skewed clock makes lie). Returns what was removed."""
    removed = []
    for name in names:
        with _directory_lock(contract.record_path(root, name).parent, name):
            removed += _prune_target(root, name, keep)
    return removed


def _prune_target(root: Path, name: str, keep: int) -> list[Path]:
    record = records.read(contract.record_path(root, name))  # a damaged record: refused, nothing removed
    recorded = (record.build or {}).get("id") if record else None

    def last_written(p: Path) -> tuple[float, str]:
        return max((f.stat().st_mtime for f in p.iterdir() if f.is_file()), default=p.stat().st_mtime), p.name

    dirs = sorted((p for p in (root / contract.ARTIFACTS_DIR / name).glob("*") if p.is_dir()), key=last_written)
    removed = []
    for kind in (lambda p: p.name.startswith("test-"), lambda p: not p.name.startswith("test-")):
        chosen = [p for p in dirs if kind(p) and p.name not in ("rehearsal", recorded)]
        room = keep - (1 if recorded and any(p.name == recorded for p in dirs if kind(p)) else 0)
        for old in chosen[: max(0, len(chosen) - max(room, 0))]:
            shutil.rmtree(old)
            removed.append(old)
    return removed


def _build(plan: Plan, engine: Engine, options: BuildOptions) -> Outcome:
    target, started = plan.target, time.monotonic()
    record_path = contract.record_path(plan.root, target.name)
    previous = records.read(record_path)  # a damaged record stops the build before anything runs
    _record_holds(plan, previous)
    ctx = BuildContext.checked(plan, engine, options)
    if not options.force and not options.no_cache:
        with log.step(f"{target.name}: compare inputs with the record"):
            current = previous is not None and up_to_date(ctx, previous)
        if previous is not None and current:
            log.info(f"    up to date: {previous.image} (same inputs, served by the registry; --force rebuilds)")
            return Outcome(
                target.name,
                previous.image,
                previous.digest,
                None,
                time.monotonic() - started,
                record_path,
                None,
                changed=False,
                up_to_date=True,
            )
    signer = _provenance_signer(plan)  # a key that cannot sign fails now (exit 2), not after the compile
    with compilecache.secret_dir() as secret_dir:  # the backend's secret lives only as long as the build
        prep = prepare(ctx, Path(secret_dir))
        result = run_engine(prep)
    cache = _cache_stats(prep)
    pushed = f"{target.image.name}@{result.digest}"
    _scan_for_secrets(prep, result.digest)
    size = engine.registry.image_size(pushed)
    if options.run_checks:
        _check(prep, pushed)
    seconds = time.monotonic() - started
    record = _publish(prep, _record(prep, result.digest, options.run_checks, seconds), signer)
    changed = previous is None or previous.digest != record.digest
    return Outcome(
        target.name, record.image, result.digest, size, seconds, record_path, prep.log_path, changed, cache=cache
    )


def _cache_stats(prep: Prepared) -> compilecache.Stats | None:
    """What the compile cache did, from the build log: shown, and kept at the end of the log."""
    cache = compilecache.stats(prep.log_path.read_text(errors="replace"))
    if cache:
        (log.warn if cache.backend_unreachable else log.info)(f"    {cache.line()}")
        with prep.log_path.open("a") as fh:
            fh.write(f"[k3-builder] {cache.line()}\n")
    return cache


# --- test ---------------------------------------------------------------------------------------


def test(plan: Plan, engine: Engine, image: str | None):
    """`build test`: the image checks on ``image`` (default: the recorded image), JUnit beside."""
    from builder.checks import runner as imagechecks

    target = plan.target
    record = records.read(contract.record_path(plan.root, target.name))
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
        report = imagechecks.check_target(engine, target, locks, pinned, ref, build_date, out_dir)
        report.raise_for_failures()
    return report


# --- reproduce ----------------------------------------------------------------------------------


@dataclass
class Reproduction:
    target: str
    recorded: str
    rebuilt: str
    differences: list[str]
    report: Path | None

    @property
    def reproduced(self) -> bool:
        return self.recorded == self.rebuilt

    def to_json(self) -> dict:
        return {
            "target": self.target,
            "recorded": self.recorded,
            "rebuilt": self.rebuilt,
            "reproduced": self.reproduced,
            "differences": self.differences,
            "report": str(self.report) if self.report else None,
        }

    def raise_for_difference(self) -> None:
        if not self.reproduced:
            raise NotReproduced(
                f"{self.target}: rebuild gave {self.rebuilt}, image.json records {self.recorded}; "
                f"differences in {self.report}"
            )


def _recorded_inputs(plan: Plan) -> records.Record:
    """The record to reproduce; refuses when the files say something else now."""
    target = plan.target
    record = records.read(contract.record_path(plan.root, target.name))
    if record is None:
        raise RecordError(f"{contract.record_path(plan.root, target.name)}: no record to reproduce; build first")
    for path, want in (
        (plan.dockerfile, record.dockerfile_sha256),
        (plan.lock_paths.runtime, record.lock_sha256),
        (plan.lock_paths.build, record.build_lock_sha256),
        *([(plan.lock_paths.os, record.os_lock_sha256)] if plan.lock_paths.os else []),
    ):
        if not path.exists() or sha256_file(path) != want:
            raise RecordError(
                f"{path}: differs from what image.json recorded; check out the commit that "
                "recorded the build (or run `build verify`)"
            )
    if record.source.get("commit") != target.source.commit:
        raise RecordError(
            f"{target.name}: the matrix pins another commit than image.json; check out the recorded commit"
        )
    return record


def reproduce(plan: Plan, engine: Engine, options: BuildOptions) -> Reproduction:
    """Rebuild the recorded image with no cache and compare: same digest, or what differs."""
    target = plan.target
    record = _recorded_inputs(plan)
    ctx = BuildContext.checked(plan, engine, options, tag=f"{target.image.tag}-reproduce", no_cache=True)
    prep = prepare(ctx)
    result = run_engine(prep)
    recorded = engine.registry.platform_digest(target.image.name, record.digest)
    rebuilt = engine.registry.platform_digest(target.image.name, result.digest)
    if rebuilt == recorded:
        log.info(f"    reproduced: {recorded} (recorded {record.build.get('finished')}, rebuilt now)")
        return Reproduction(target.name, recorded, rebuilt, [], None)
    from builder.pipeline import imagediff

    with log.step(f"{target.name}: compare {recorded[:19]} with the rebuild {rebuilt[:19]}"):
        lines = imagediff.diff_images(engine, target.image.name, recorded, rebuilt)
    report = prep.workdir / "reproduce-diff.txt"
    report.write_text("\n".join(lines) + "\n")
    for line in lines:
        log.info(f"    {line}")
    return Reproduction(target.name, recorded, rebuilt, lines, report)

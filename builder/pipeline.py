"""The build, step by step: matrix -> Dockerfile -> lock -> context -> buildx -> registry -> record.

Order matters for the guarantees: everything that can refuse (drift, stale lock, corrupt record,
unreachable engine, wrong torch build) is checked before the engine is asked for anything, and
image.json is written only after the registry confirms it serves the pushed digest.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
from secrets import token_hex
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from builder import __version__, contract, lock, log, records, render, source
from builder.context import assemble
from builder.engine import BuildRequest, BuildResult, Engine, EngineInfo
from builder.errors import BuildError, Busy, DriftError, NotReproduced, RecordError
from builder.fsutil import atomic_write, sha256_bytes, sha256_file
from builder.source import PinnedSource
from builder.matrix import Matrix, Target

GIB = 1024**3


@dataclass(frozen=True)
class Parallelism:
    """How parallel the compile runs. ``max_jobs`` is what MAX_JOBS is set to, in the source's own
    meaning: vLLM's setup.py divides it by NVCC_THREADS to get its ninja job count, so the tool
    passes nvcc jobs x NVCC_THREADS (passing the job count itself would divide it twice)."""

    max_jobs: int
    nvcc_threads: int
    why: str

    @property
    def jobs(self) -> int:  # the compile jobs the source's build runs at once
        return max(1, self.max_jobs // self.nvcc_threads)

    def describe(self) -> str:
        return (f"MAX_JOBS={self.max_jobs} NVCC_THREADS={self.nvcc_threads}: {self.jobs} compile job(s) x "
                f"{self.nvcc_threads} nvcc thread(s) ({self.why})")


def parallelism(target: Target, cpus: int, memory_bytes: int, override: int | None = None) -> Parallelism:
    """MAX_JOBS for the compile: --max-jobs, else compile.max_jobs, else derived from the builder.

    Derived: jobs = min(cpus / NVCC_THREADS, memory / (memory_per_job_gib x NVCC_THREADS)), at least
    one; each nvcc thread needs ``memory_per_job_gib`` and OOM-killed compiles are vLLM's most
    reported build failure, so memory bounds the jobs before cores do. MAX_JOBS = jobs x threads.
    """
    threads = target.compile.nvcc_threads
    if override:
        return Parallelism(override, threads, "--max-jobs")
    if target.compile.max_jobs:
        return Parallelism(target.compile.max_jobs, threads, "compile.max_jobs")
    per_job = target.compile.memory_per_job_gib * threads * GIB
    jobs = max(1, min(cpus // threads, memory_bytes // per_job if memory_bytes else 1))
    why = (f"derived from the builder: {cpus} cpus, {memory_bytes // GIB} GiB, "
           f"{target.compile.memory_per_job_gib} GiB per nvcc thread")
    return Parallelism(jobs * threads, threads, why)


def created_iso(epoch: int) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Plan:
    """What a build of one target will read and produce; computed without network."""

    target: Target
    root: Path
    dockerfile: Path
    locks: dict[str, Path]
    output: str

    @classmethod
    def of(cls, matrix: Matrix, name: str) -> "Plan":
        target = matrix.target(name)
        root = matrix.path.resolve().parent
        return cls(
            target=target,
            root=root,
            dockerfile=contract.dockerfile_path(root, name),
            locks={"runtime": contract.lock_path(root, name), "build": contract.build_lock_path(root, name)},
            output=target.image.tagged,
        )

    def rows(self) -> list[tuple[str, str]]:
        t = self.target
        rows = [
            ("target", f"{t.name}: {t.description}"),
            ("owner / expires", f"{t.owner} / {t.expires.isoformat()} (warn {t.expiry_warning_days} days before)"),
            ("build base", t.bases.build.ref),
            ("runtime base", t.bases.runtime.ref),
            ("source", f"{t.source.url} {t.source.branch} @ {t.source.commit}"),
            ("source package", f"{t.source.package} {t.source.wheel_version}"
                               + (f" (told through {t.source.version_env})" if t.source.version_env else "")),
            ("python", f"{t.python.version} ({t.python.provider}"
                       + (f": {t.python.standalone.url} sha256:{t.python.standalone.sha256}" if t.python.standalone else "")
                       + ")"),
            ("cuda", f"{t.cuda.version} arch {' '.join(t.cuda.arch_list)}"),
        ]
        for label, pin in (("torch", t.torch), ("flashinfer", t.flashinfer), ("nccl (override)", t.nccl)):
            if pin:
                rows.append((label, pin.version + (f" from {pin.index}" if pin.index else "")))
        for name, tp in sorted(t.source.third_party.items()):
            named = f"{tp.ref} = {tp.commit}" if tp.ref != tp.commit else tp.commit
            rows.append((f"third party {name}", f"{tp.url} @ {named} -> {tp.env}"
                                                + (f" (its {tp.subdir})" if tp.subdir else "")))
        rows += [
            ("lock indexes", ", ".join(t.lock_indexes())),
            ("lock inputs", ", ".join(t.pinned_requirements() + t.source.requirements) or "-"),
            ("build lock inputs", ", ".join(t.build_requirements + t.source.build_requirements) or "-"),
            ("build args", f"SOURCE_DATE_EPOCH=<commit time> TORCH_CUDA_ARCH_LIST=\"{' '.join(t.cuda.arch_list)}\" "
                           f"NVCC_THREADS={t.compile.nvcc_threads} MAX_JOBS=<parallelism>"),
            ("parallelism", (parallelism(t, 0, 0).describe() if t.compile.max_jobs else
                             f"MAX_JOBS = jobs x NVCC_THREADS {t.compile.nvcc_threads}, jobs = min(cpus / "
                             f"{t.compile.nvcc_threads}, memory / ({t.compile.memory_per_job_gib} GiB x "
                             f"{t.compile.nvcc_threads})), from the builder; e.g. 64 cpus, 256 GiB: "
                             + parallelism(t, 64, 256 * GIB).describe())),
            ("dockerfile", f"{self.dockerfile} ({'present' if self.dockerfile.exists() else 'not rendered'})"),
        ]
        for kind, path in self.locks.items():
            rows.append((f"{kind} lock", f"{path} ({'present' if path.exists() else 'missing: run build lock'})"))
        rows += [("output", f"{self.output} -> recorded in {contract.record_path(self.root, t.name)}")]
        return rows


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


def check_rendered(plan: Plan) -> str:
    """The committed Dockerfile must be exactly what the matrix renders; return its text."""
    want = render.render(plan.target)
    if not plan.dockerfile.exists():
        raise DriftError(f"{plan.dockerfile}: not rendered; run `build render --target {plan.target.name}`")
    if plan.dockerfile.read_text() != want:
        raise DriftError(
            f"{plan.dockerfile}: differs from what the matrix renders; run `build render --target {plan.target.name}`"
        )
    return want


@dataclass
class Prepared:
    """Everything checked and assembled for one engine build of a plan."""

    plan: Plan
    info: EngineInfo
    pinned: PinnedSource
    dockerfile_text: str
    build_id: str
    workdir: Path
    request: BuildRequest
    started_iso: str
    third_party: dict  # name -> source.PinnedThirdParty

    @property
    def log_path(self) -> Path:
        return self.workdir / contract.BUILD_LOG_NAME


_ATTEST_DRIVERS = ("docker-container", "remote", "kubernetes")
_said_no_attestations = False


def offline_checks(plan: Plan) -> str:
    """Refusals that need nothing but the repo: drifted Dockerfile, missing/unhashed/wrong-CUDA lock."""
    with log.step(f"{plan.target.name}: check the committed Dockerfile and locks"):
        dockerfile_text = check_rendered(plan)
        for path in plan.locks.values():  # the build stage compiles against torch: same CUDA build
            lock.check_torch_build(plan.target, lock.read_entries(path), path)
    return dockerfile_text


def input_key(plan: Plan, dockerfile_text: str) -> str:
    """sha256 over everything a build reads, so an unchanged key means an unchanged image.

    The rendered Dockerfile (bases, labels, expiry), both locks, the whole matrix entry (source
    commit, pins, compile settings, the CPython tarball's sha256) and the tool version. MAX_JOBS is
    left out on purpose: it changes how fast the compile runs, not what it produces.
    """
    doc = {
        "dockerfile": sha256_bytes(dockerfile_text.encode()),
        "lock": sha256_file(plan.locks["runtime"]),
        "build_lock": sha256_file(plan.locks["build"]),
        "target": plan.target.model_dump(mode="json"),
        "tool": __version__,
    }
    return sha256_bytes(json.dumps(doc, sort_keys=True).encode())


def prepare(plan: Plan, engine: Engine, *, tag: str, dockerfile_text: str, no_cache: bool = False,
            builder: str | None = None, max_jobs_override: int | None = None,
            cache_from: tuple[str, ...] = (), cache_to: str | None = None,
            secrets: tuple[str, ...] = ()) -> Prepared:
    """Engine and source checks, then the context: nothing here pushes or records anything."""
    global _said_no_attestations
    target = plan.target
    with log.step(f"{target.name}: engine preflight"):
        info: EngineInfo = engine.preflight(builder)
        log.info(f"    engine {info.server_version}, buildx {info.buildx_version}, builder {info.builder} ({info.driver})")
    attest_here = info.driver in _ATTEST_DRIVERS
    if not attest_here and not _said_no_attestations:
        _said_no_attestations = True
        log.info(f"    note: the {info.driver} driver cannot make BuildKit attestations; the tool's own SBOM "
                 f"and provenance (locks/{target.name}/) are the record, attached to the image in the registry")
    with log.step(f"{target.name}: fetch source {target.source.branch} @ {target.source.commit[:12]}"):
        pinned = source.fetch(target.source)
        if pinned.branch_head != target.source.commit:
            log.warn(f"{target.source.branch} has moved to {pinned.branch_head[:12]}; building the pin "
                     f"{target.source.commit[:12]} (run `build track` to move it)")
    third = {}
    if target.source.third_party:
        with log.step(f"{target.name}: fetch {len(target.source.third_party)} pinned third-party source(s)"):
            third = source.fetch_all_third_party(target.source, pinned)
            for tp in third.values():
                log.info(f"    {tp.name}: {tp.url} @ {tp.commit[:12]}"
                         + (f" + {len(tp.submodules)} submodule(s)" if tp.submodules else ""))
    with log.step(f"{target.name}: check the locks were made from these inputs"):
        lock.check_current(plan.locks["runtime"], lock.inputs(target, pinned, "runtime"))
        lock.check_current(plan.locks["build"], lock.inputs(target, pinned, "build"))
    epoch = pinned.source_date_epoch
    now = dt.datetime.now(dt.timezone.utc)
    build_id = now.strftime("%Y%m%dT%H%M%SZ") + "-" + token_hex(3)
    workdir = contract.artifacts_path(plan.root, target.name, build_id)
    workdir.mkdir(parents=True)
    with log.step(f"{target.name}: assemble the build context"):
        ctx = assemble(target, plan.locks["runtime"].parent, workdir / "context", epoch)
        src = pinned.export(workdir / "source")
        contexts = {"source": src}
        for name, tp in third.items():
            contexts[contract.third_party_context(name)] = tp.export(workdir / "third_party" / name)
    par = parallelism(target, info.cpus, info.memory_bytes, max_jobs_override)
    request = BuildRequest(
        context=ctx,
        dockerfile=plan.dockerfile,
        tags=(f"{target.image.name}:{tag}",),
        build_args={
            "SOURCE_DATE_EPOCH": str(epoch),
            "MAX_JOBS": str(par.max_jobs),
            "NVCC_THREADS": str(target.compile.nvcc_threads),
            "K3_CREATED": created_iso(epoch),
            "K3_LOCK_SHA256": sha256_file(plan.locks["runtime"]),
        },
        build_contexts=contexts,
        source_date_epoch=epoch,
        push=True,
        no_cache=no_cache,
        builder=builder,
        attest=attest_here,
        cache_from=cache_from,
        cache_to=cache_to,
        secrets=secrets,
    )
    (workdir / contract.BUILD_LOG_NAME).write_text(
        f"[k3-builder] build {build_id} of target {target.name}, tool {__version__}\n"
        f"[k3-builder] source {target.source.url} @ {target.source.commit}, SOURCE_DATE_EPOCH={epoch}\n"
        + "".join(f"[k3-builder] third party {tp.name}: {tp.url} @ {tp.commit}\n" for tp in third.values())
        + f"[k3-builder] {par.describe()}\n"
    )
    log.info(f"    {par.describe()}")
    return Prepared(plan, info, pinned, dockerfile_text, build_id, workdir, request,
                    now.strftime("%Y-%m-%dT%H:%M:%SZ"), third)


def lock_target(plan: Plan) -> dict[str, Path]:
    """`build lock`: resolve both locks from the matrix and the source at the pin; write them."""
    target = plan.target
    with log.step(f"{target.name}: fetch source {target.source.branch} @ {target.source.commit[:12]}"):
        pinned = source.fetch(target.source)
    with log.step(f"{target.name}: resolve the runtime and build locks (uv, for Python {target.python.version} on "
                  f"{target.python.uv_platform()})"):
        return lock.write(plan.root, target, pinned)


def rehearse_lock(plan: Plan):
    """`build lock --rehearse`: the same resolution against PyPI only; nothing under locks/."""
    from builder import rehearse

    target = plan.target
    with log.step(f"{target.name}: REHEARSAL of the lock against PyPI only (the real lock needs the real indexes)"):
        result = rehearse.rehearse(target, plan.root)
    return result


def record_source(target: Target, third: dict) -> dict:
    """The record's ``source``: the pinned commit plus every third-party tree the compile used."""
    doc = {"url": target.source.url, "branch": target.source.branch, "commit": target.source.commit}
    if third:
        doc["third_party"] = {name: tp.to_json() for name, tp in sorted(third.items())}
    return doc


def run_engine(prep: Prepared, engine: Engine) -> BuildResult:
    """Build and push, then make sure the registry serves the digest buildx reported."""
    target = prep.plan.target
    with log.step(f"{target.name}: buildx build and push {prep.request.tags[0]} (log: {prep.log_path})"):
        result = engine.build(prep.request, prep.log_path, log.raw)
    with log.step(f"{target.name}: confirm the registry serves {result.digest[:19]}"):
        if not engine.serves(target.image.name, result.digest):
            raise BuildError(f"the registry does not serve {target.image.name}@{result.digest} after the push",
                             str(prep.log_path))
    return result


def _warm_imports() -> None:
    import builder.attest  # noqa: F401
    import builder.checks  # noqa: F401
    from cyclonedx.validation import json as _cdx_json  # noqa: F401
    import jsonschema  # noqa: F401


def up_to_date(plan: Plan, engine: Engine, previous: records.Record | None, key: str) -> bool:
    """The recorded build had these exact inputs and the registry still serves it under the tag."""
    if previous is None or previous.input_key != key:
        return False
    target = plan.target
    return (engine.serves(target.image.name, previous.digest)
            and engine.resolve_digest(target.image.tagged) == previous.digest)


@contextlib.contextmanager
def target_lock(plan: Plan) -> Iterator[None]:
    """One build of a target at a time on this checkout: a second one is refused, not interleaved.

    The lock is flock(2) on the target's locks/ directory itself, so taking it writes nothing, and
    the kernel drops it when the process dies however it dies.
    """
    directory = plan.locks["runtime"].parent
    if not directory.is_dir():
        yield  # no locks directory: the offline checks refuse this build before it writes anything
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(f"{plan.target.name}: another build of this target is running in this checkout; "
                       "wait for it to finish, then run again") from None
        yield
    finally:
        os.close(fd)


def build(plan: Plan, engine: Engine, **options) -> Outcome:
    with target_lock(plan):
        return _build(plan, engine, **options)


def _build(plan: Plan, engine: Engine, *, no_cache: bool = False, builder: str | None = None,
           max_jobs_override: int | None = None, run_checks: bool = True, force: bool = False,
           cache_from: tuple[str, ...] = (), cache_to: str | None = None, secrets: tuple[str, ...] = ()) -> Outcome:
    target = plan.target
    record_path = contract.record_path(plan.root, target.name)
    started = time.monotonic()
    previous = records.read(record_path)  # a damaged record stops the build before anything runs
    dockerfile_text = offline_checks(plan)
    key = input_key(plan, dockerfile_text)
    if not force and not no_cache:
        with log.step(f"{target.name}: compare inputs with the record"):
            current = up_to_date(plan, engine, previous, key)
        if current:
            assert previous is not None
            log.info(f"    up to date: {previous.image} (same inputs, served by the registry; --force rebuilds)")
            return Outcome(target=target.name, image=previous.image, digest=previous.digest, size=None,
                           seconds=time.monotonic() - started, record=record_path, log=None, changed=False,
                           up_to_date=True)
    prep = prepare(plan, engine, tag=target.image.tag, dockerfile_text=dockerfile_text, no_cache=no_cache,
                   builder=builder, max_jobs_override=max_jobs_override, cache_from=cache_from, cache_to=cache_to,
                   secrets=secrets)
    # The checks and the SBOM need pytest, testinfra and jsonschema (about a second of imports):
    # load them while the engine builds, not after it.
    threading.Thread(target=_warm_imports, daemon=True).start()
    result = run_engine(prep, engine)
    from builder import attest, checks  # pytest, testinfra, cyclonedx: only once there is an image

    pushed = f"{target.image.name}@{result.digest}"
    size = engine.image_size(pushed)
    if run_checks:
        # Before the record: image.json only ever names an image that passed its checks. A failing
        # check fails the command; the image stays in the registry for inspection and the JUnit
        # report sits beside the build log.
        with log.step(f"{target.name}: image checks on {pushed}"):
            report = checks.check_target(engine, target, plan.locks["runtime"], prep.pinned, pushed,
                                         dt.datetime.now(dt.timezone.utc).date(), prep.workdir)
            report.raise_for_failures()
    seconds = time.monotonic() - started
    record = records.Record(
        target=target.name,
        image=pushed,
        digest=result.digest,
        bases={role: {"name": getattr(target.bases, role).display_name, "digest": getattr(target.bases, role).digest}
               for role in ("build", "runtime")},
        source=record_source(target, prep.third_party),
        lock_sha256=sha256_file(plan.locks["runtime"]),
        build_lock_sha256=sha256_file(plan.locks["build"]),
        dockerfile_sha256=sha256_bytes(prep.dockerfile_text.encode()),
        source_date_epoch=prep.pinned.source_date_epoch,
        input_key=key,
        tool_version=__version__,
        build={
            "id": prep.build_id,
            "finished": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "duration_seconds": round(seconds, 1),
            "engine": prep.info.server_version,
            "buildx": prep.info.buildx_version,
            "driver": prep.info.driver,
        },
    )
    with log.step(f"{target.name}: SBOM and provenance, attached to {pushed[-19:]}"):
        sbom_text = attest.sbom(target, record, attest.inventory(engine, pushed), lock.read_entries(plan.locks["runtime"]))
        prov_text = attest.provenance(target, record, prep.request.build_args, prep.started_iso)
        annotations = {contract.OCI_CREATED: created_iso(record.source_date_epoch)}
        engine.attach(target.image.name, result.digest, attest.SBOM_TYPE, sbom_text.encode(), annotations)
        engine.attach(target.image.name, result.digest, attest.PROVENANCE_TYPE, prov_text.encode(), annotations)
    # The record last: sbom and provenance first, so image.json never names an image whose
    # audit files are missing. Each is written atomically.
    atomic_write(contract.sbom_path(plan.root, target.name), sbom_text)
    atomic_write(contract.provenance_path(plan.root, target.name), prov_text)
    records.write(record_path, record)
    changed = previous is None or previous.digest != record.digest
    return Outcome(target=target.name, image=record.image, digest=result.digest, size=size,
                   seconds=seconds, record=record_path, log=prep.log_path, changed=changed)


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
        return {"target": self.target, "recorded": self.recorded, "rebuilt": self.rebuilt,
                "reproduced": self.reproduced, "differences": self.differences,
                "report": str(self.report) if self.report else None}

    def raise_for_difference(self) -> None:
        if not self.reproduced:
            raise NotReproduced(f"{self.target}: rebuild gave {self.rebuilt}, image.json records {self.recorded}; "
                                f"differences in {self.report}")


def reproduce(plan: Plan, engine: Engine, *, builder: str | None = None, secrets: tuple[str, ...] = ()) -> Reproduction:
    """Rebuild the recorded image with no cache and compare: same digest, or what differs."""
    target = plan.target
    record = records.read(contract.record_path(plan.root, target.name))
    if record is None:
        raise RecordError(f"{contract.record_path(plan.root, target.name)}: no record to reproduce; build first")
    # Reproduce the record, not whatever the files say now.
    for path, want in ((plan.dockerfile, record.dockerfile_sha256), (plan.locks["runtime"], record.lock_sha256),
                       (plan.locks["build"], record.build_lock_sha256)):
        if not path.exists() or sha256_file(path) != want:
            raise RecordError(f"{path}: differs from what image.json recorded; check out the commit that "
                              "recorded the build (or run `build verify`)")
    if record.source.get("commit") != target.source.commit:
        raise RecordError(f"{target.name}: the matrix pins another commit than image.json; check out the recorded commit")
    prep = prepare(plan, engine, tag=f"{target.image.tag}-reproduce", dockerfile_text=offline_checks(plan),
                   no_cache=True, builder=builder, secrets=secrets)
    result = run_engine(prep, engine)
    recorded = engine.platform_digest(target.image.name, record.digest)
    rebuilt = engine.platform_digest(target.image.name, result.digest)
    if rebuilt == recorded:
        log.info(f"    reproduced: {recorded} (recorded {record.build.get('finished')}, rebuilt now)")
        return Reproduction(target.name, recorded, rebuilt, [], None)
    from builder import imagediff

    with log.step(f"{target.name}: compare {recorded[:19]} with the rebuild {rebuilt[:19]}"):
        lines = imagediff.compare(engine, target.image.name, recorded, rebuilt)
    report = prep.workdir / "reproduce-diff.txt"
    atomic_write(report, "\n".join(lines) + "\n")
    for line in lines:
        log.info(f"    {line}")
    return Reproduction(target.name, recorded, rebuilt, lines, report)

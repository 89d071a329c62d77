"""The build, step by step: matrix -> Dockerfile -> lock -> context -> buildx -> registry -> record.

Order matters for the guarantees: everything that can refuse (drift, stale lock, corrupt record,
unreachable engine, wrong torch build) is checked before the engine is asked for anything, and
image.json is written only after the registry confirms it serves the pushed digest.
"""

from __future__ import annotations

import datetime as dt
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from builder import __version__, checks, contract, lock, log, records, render, source
from builder.context import assemble
from builder.engine import BuildRequest, Engine, EngineInfo
from builder.errors import BuildError, DriftError, LockError
from builder.fsutil import sha256_bytes, sha256_file
from builder.matrix import Matrix, Target

GIB = 1024**3


def max_jobs(target: Target, cpus: int, memory_bytes: int, override: int | None = None) -> int:
    """MAX_JOBS for the compile: min(cpus, memory / (GiB per job x NVCC_THREADS)), at least 1.

    Each nvcc job runs NVCC_THREADS threads that each need ``memory_per_job_gib``; OOM-killed
    compiles are vLLM's most reported build failure, so memory bounds the jobs before cores do.
    """
    if override:
        return override
    if target.compile.max_jobs:
        return target.compile.max_jobs
    per_job = target.compile.memory_per_job_gib * target.compile.nvcc_threads * GIB
    return max(1, min(cpus, memory_bytes // per_job if memory_bytes else 1))


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
            ("source package", f"{t.source.package} {t.source.version}"),
            ("python", f"{t.python.version} ({t.python.provider}"
                       + (f": {t.python.standalone.url} sha256:{t.python.standalone.sha256}" if t.python.standalone else "")
                       + ")"),
            ("cuda", f"{t.cuda.version} arch {' '.join(t.cuda.arch_list)}"),
        ]
        for label, pin in (("torch", t.torch), ("flashinfer", t.flashinfer), ("nccl (override)", t.nccl)):
            if pin:
                rows.append((label, pin.version + (f" from {pin.index}" if pin.index else "")))
        rows += [
            ("lock indexes", ", ".join(t.lock_indexes())),
            ("lock inputs", ", ".join(t.pinned_requirements() + t.source.requirements) or "-"),
            ("build lock inputs", ", ".join(t.build_requirements + t.source.build_requirements) or "-"),
            ("build args", f"SOURCE_DATE_EPOCH=<commit time> TORCH_CUDA_ARCH_LIST=\"{' '.join(t.cuda.arch_list)}\" "
                           f"NVCC_THREADS={t.compile.nvcc_threads} MAX_JOBS="
                           + (str(t.compile.max_jobs) if t.compile.max_jobs else
                              f"min(cpus, mem/({t.compile.memory_per_job_gib} GiB x {t.compile.nvcc_threads}))")),
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
    log: Path
    changed: bool = True
    notes: list[str] = field(default_factory=list)


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


def _check_torch_build(target: Target, entries: list[lock.LockEntry], path: Path) -> None:
    if not target.torch:
        return
    torch = next((e for e in entries if e.name.lower() == "torch"), None)
    want = target.cuda.short
    if torch is None or not torch.version.endswith(f"+{want}"):
        found = torch.version if torch else "no torch"
        raise LockError(
            f"{path}: torch must be a +{want} build for this target, the lock has {found}; "
            f"a bare PyPI torch is a CUDA 13 build that fails on r575 drivers. Re-lock with the {want} index."
        )


def build(plan: Plan, engine: Engine, *, no_cache: bool = False, builder: str | None = None,
          max_jobs_override: int | None = None, run_checks: bool = True) -> Outcome:
    target = plan.target
    record_path = contract.record_path(plan.root, target.name)
    started = time.monotonic()
    previous = records.read(record_path)  # a damaged record stops the build before anything runs
    # Offline refusals first: nothing below runs for a drifted Dockerfile or a missing/wrong lock.
    with log.step(f"{target.name}: check the committed Dockerfile and locks"):
        dockerfile_text = check_rendered(plan)
        runtime_entries = lock.read_entries(plan.locks["runtime"])
        lock.read_entries(plan.locks["build"])
        _check_torch_build(target, runtime_entries, plan.locks["runtime"])
    with log.step(f"{target.name}: engine preflight"):
        info: EngineInfo = engine.preflight(builder)
        log.info(f"    engine {info.server_version}, buildx {info.buildx_version}, builder {info.builder} ({info.driver})")
    with log.step(f"{target.name}: fetch source {target.source.branch} @ {target.source.commit[:12]}"):
        pinned = source.fetch(target.source)
        if pinned.branch_head != target.source.commit:
            log.warn(f"{target.source.branch} has moved to {pinned.branch_head[:12]}; building the pin "
                     f"{target.source.commit[:12]} (run `build track` to move it)")
    with log.step(f"{target.name}: check the locks were made from these inputs"):
        lock.check_current(plan.locks["runtime"], lock.inputs(target, pinned, "runtime"))
        lock.check_current(plan.locks["build"], lock.inputs(target, pinned, "build"))
    epoch = pinned.source_date_epoch
    build_id = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)
    workdir = contract.artifacts_path(plan.root, target.name, build_id)
    log_path = workdir / contract.BUILD_LOG_NAME
    workdir.mkdir(parents=True)
    with log.step(f"{target.name}: assemble the build context"):
        ctx = assemble(target, plan.locks["runtime"].parent, workdir / "context", epoch)
        src = pinned.export(workdir / "source")
    jobs = max_jobs(target, info.cpus, info.memory_bytes, max_jobs_override)
    lock_sha = sha256_file(plan.locks["runtime"])
    request = BuildRequest(
        context=ctx,
        dockerfile=plan.dockerfile,
        tags=(target.image.tagged,),
        build_args={
            "SOURCE_DATE_EPOCH": str(epoch),
            "MAX_JOBS": str(jobs),
            "NVCC_THREADS": str(target.compile.nvcc_threads),
            "K3_CREATED": created_iso(epoch),
            "K3_LOCK_SHA256": lock_sha,
        },
        build_contexts={"source": src},
        source_date_epoch=epoch,
        push=True,
        no_cache=no_cache,
        builder=builder,
    )
    log_path.write_text(
        f"[k3-builder] build {build_id} of target {target.name}, tool {__version__}\n"
        f"[k3-builder] source {target.source.url} @ {target.source.commit}, SOURCE_DATE_EPOCH={epoch}\n"
        f"[k3-builder] MAX_JOBS={jobs} NVCC_THREADS={target.compile.nvcc_threads}\n"
    )
    with log.step(f"{target.name}: buildx build and push {target.image.tagged} (log: {log_path})"):
        result = engine.build(request, log_path, log.raw)
    with log.step(f"{target.name}: confirm the registry serves {result.digest[:19]}"):
        if not engine.serves(target.image.name, result.digest):
            raise BuildError(f"the registry does not serve {target.image.name}@{result.digest} after the push",
                             str(log_path))
        size = engine.image_size(f"{target.image.name}@{result.digest}")
    pushed = f"{target.image.name}@{result.digest}"
    if run_checks:
        # Before the record: image.json only ever names an image that passed its checks. A failing
        # check fails the command; the image stays in the registry for inspection and the JUnit
        # report sits beside the build log.
        with log.step(f"{target.name}: image checks on {pushed}"):
            checks.check_target(engine, target, plan.locks["runtime"], pinned, pushed,
                                dt.datetime.now(dt.timezone.utc).date(), workdir)
    seconds = time.monotonic() - started
    record = records.Record(
        target=target.name,
        image=pushed,
        digest=result.digest,
        bases={role: {"name": getattr(target.bases, role).display_name, "digest": getattr(target.bases, role).digest}
               for role in ("build", "runtime")},
        source={"url": target.source.url, "branch": target.source.branch, "commit": target.source.commit},
        lock_sha256=lock_sha,
        build_lock_sha256=sha256_file(plan.locks["build"]),
        dockerfile_sha256=sha256_bytes(dockerfile_text.encode()),
        source_date_epoch=epoch,
        tool_version=__version__,
        build={
            "id": build_id,
            "finished": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "duration_seconds": round(seconds, 1),
            "engine": info.server_version,
            "buildx": info.buildx_version,
            "driver": info.driver,
        },
    )
    records.write(record_path, record)
    changed = previous is None or previous.digest != record.digest
    return Outcome(target=target.name, image=record.image, digest=result.digest, size=size,
                   seconds=seconds, record=record_path, log=log_path, changed=changed)

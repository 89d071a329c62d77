"""What a build of one target reads and produces, and the refusals that need nothing but the
repository: the committed Dockerfile, the locks (read once, into a ``LockSet``), the input key.
No network, no engine: `build plan` is this module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias

from builder import __version__, log
from builder.config import cascade, contract
from builder.config.matrix import Matrix, Target
from builder.config.platforms import pinned_through_index
from builder.config.targetplatform import LockPaths, TargetPlatform
from builder.deps import lock, oslock
from builder.deps.lock import LockEntry
from builder.deps.oslock import DebEntry
from builder.dockerfile import render
from builder.errors import ConfigError
from builder.fsutil import sha256_bytes

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
        return (
            f"MAX_JOBS={self.max_jobs} NVCC_THREADS={self.nvcc_threads}: {self.jobs} compile job(s) x "
            f"{self.nvcc_threads} nvcc thread(s) ({self.why})"
        )


def parallelism(target: Target, cpus: int, memory_bytes: int, override: int | None = None) -> Parallelism:
    """MAX_JOBS for the compile: --max-jobs, else compile.max_jobs (the order: config/cascade.py),
    else derived from the builder.

    Derived: jobs = min(cpus / NVCC_THREADS, memory / (memory_per_job_gib x NVCC_THREADS)), at least
    one; each nvcc thread needs ``memory_per_job_gib`` and OOM-killed compiles are vLLM's most
    reported build failure, so memory bounds the jobs before cores do. MAX_JOBS = jobs x threads.
    """
    threads = target.compile.nvcc_threads
    given = cascade.max_jobs(override, target)
    if given.value:
        return Parallelism(given.value, threads, given.name)
    per_job = target.compile.memory_per_job_gib * threads * GIB
    jobs = max(1, min(cpus // threads, memory_bytes // per_job if memory_bytes else 1))
    why = (
        f"derived from the builder: {cpus} cpus, {memory_bytes // GIB} GiB, "
        f"{target.compile.memory_per_job_gib} GiB per nvcc thread"
    )
    return Parallelism(jobs * threads, threads, why)


@dataclass(frozen=True)
class Plan:
    """What a build of one target will read and produce; computed without network."""

    target: Target
    root: Path
    dockerfile: Path
    lock_paths: LockPaths
    output: str
    matrix_path: Path | None = None  # the file the target came from, for messages that name a key
    platform: str | None = None  # one platform of a target that names several; None: the target as a whole
    # The target as the matrix names it (every platform), for the checks that hold all platforms
    # before any one compiles (the kernel plan); None: ``target`` itself.
    whole: Target | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, matrix: Matrix, name: str, platform: str | None = None) -> Plan:
        whole = matrix.target(name)
        if platform is not None and platform not in whole.platform_names():
            raise ConfigError(
                f"{matrix.path}: targets.{name}.platforms: {platform} is not one of its platforms "
                f"({', '.join(whole.platform_names())})"
            )
        return cls.at(whole, matrix.path.resolve().parent, platform, matrix.path)

    @classmethod
    def at(cls, whole: Target, root: Path, platform: str | None, matrix_path: Path | None = None) -> Plan:
        target = whole.for_platform(platform) if platform else whole
        where = TargetPlatform.of(whole, platform)  # where its files are: config/targetplatform.py
        return cls(
            target=target,
            root=root,
            dockerfile=where.dockerfile(root),
            lock_paths=where.lock_paths(root),
            output=target.image.tagged,
            matrix_path=matrix_path,
            platform=platform,
            whole=whole,
        )

    @property
    def where(self) -> TargetPlatform:
        """This plan's platform (the target as a whole when ``platform`` is None)."""
        return TargetPlatform.of(self.whole or self.target, self.platform)

    @property
    def record_dir(self) -> Path:
        """Where this plan's record set is: locks/<target>/, or, for one platform of a target built
        into an image index, locks/<target>/<os>-<arch>/ (the index's record is locks/<target>/)."""
        return self.where.record_dir(self.root)

    @property
    def indexed(self) -> bool:
        """A whole target that names platforms: one build per platform, joined into one image index."""
        return self.platform is None and bool(self.target.platforms)

    @property
    def tag(self) -> str:
        """The tag this plan's build pushes: the target's, or <tag>-<os>-<arch> for one platform."""
        return self.where.image_tag

    def compiled_targets(self) -> list[tuple[str | None, Target]]:
        """Each platform the target compiles for, as its compile sees it (its own ``cuda.arch_list``):
        every one of the target's platforms, whichever this plan builds, so that a platform whose
        kernels would miss a family stops the build before any platform compiles. One platform: the
        target itself, with None."""
        whole = self.whole or self.target
        if not whole.platforms:
            return [(None, whole)]
        return [(p, whole.for_platform(p)) for p in whole.platform_names()]

    def platform_plans(self) -> list[Plan]:
        """One plan per platform a target names (the first platform's files are this plan's own)."""
        if not self.target.platforms:
            return []
        return [Plan.at(self.target, self.root, p, self.matrix_path) for p in self.target.platform_names()]

    def chosen(self, platforms: tuple[str, ...]) -> list[Plan]:
        """The platform plans --platform names (``platforms``), else all. A platform the target does
        not name, or --platform on a target built as one image (no index), is refused (exit 2): a
        flag that would do nothing, or build something else, is no flag to ignore. Whether each
        value is a platform at all was read once, up front (``platforms.flag``: BuildOptions, and
        `build test`'s own reading)."""
        from builder.config.patterns import did_you_mean

        names = self.target.platform_names()
        if platforms and not self.target.platforms:
            raise ConfigError(
                f"--platform {', '.join(platforms)}: target {self.target.name} names no platforms (it is "
                f"built as one {names[0]} image, not an image index); drop --platform"
            )
        for p in platforms:
            if p not in names:
                raise ConfigError(
                    f"--platform {p}: target {self.target.name} is built for {', '.join(names)}{did_you_mean(p, names)}"
                )
        return [pp for pp in self.platform_plans() if not platforms or str(pp.platform) in platforms]

    def platform_rows(self) -> list[tuple[str, str]]:
        """`build plan`'s rows for each platform of a target that names several (none for one platform)."""
        if self.platform is not None or not self.target.platforms:
            return []
        rows = [
            ("platforms", ", ".join(self.target.platform_names()) + " (one image index; each platform's rows below)")
        ]
        for pp in self.platform_plans():
            t, p = pp.target, str(pp.platform)
            for role in ("build", "runtime"):
                base = getattr(t.bases, role)
                how = (
                    " (the index: manifest resolved per build, unconfirmed)" if pinned_through_index(t, p, role) else ""
                )
                index = t.platforms[p].index.get(role)
                rows.append((f"{p} {role} base", base.ref + how + (f" index {index}" if index and not how else "")))
            py = t.python.standalone
            rows.append((f"{p} python", f"{t.python.uv_platform()}" + (f" {py.url} sha256:{py.sha256}" if py else "")))
            rows.append((f"{p} arch", " ".join(t.cuda.arch_list)))
            rows.append((f"{p} files", f"{pp.dockerfile.parent} {pp.lock_paths.runtime.parent}"))
        return rows

    def platform_json(self) -> dict:
        doc = {}
        for pp in self.platform_plans():
            t, p = pp.target, str(pp.platform)
            doc[p] = {
                "bases": {r: getattr(t.bases, r).ref for r in ("build", "runtime")},
                "index": {str(r): d for r, d in t.platforms[p].index.items()},
                "python": {
                    "platform": t.python.uv_platform(),
                    "standalone": t.python.standalone.url if t.python.standalone else None,
                },
                "arch_list": list(t.cuda.arch_list),
                "dockerfile": str(pp.dockerfile),
                "locks": {k: str(path) for k, path in pp.lock_paths.named()},
            }
        return doc

    def to_json(self) -> dict:
        """The plan as structured data (`build plan --json`): values, not display strings."""
        t = self.target
        doc = {
            "target": t.name,
            "description": t.description,
            "owner": t.owner,
            "expires": t.expires.isoformat(),
            "expiry_warning_days": t.expiry_warning_days,
            "bases": {
                role: {"name": b.display_name, "digest": b.digest, "ref": b.ref}
                for role, b in (("build", t.bases.build), ("runtime", t.bases.runtime))
            },
            "source": {
                "url": t.source.url,
                "branch": t.source.branch,
                "commit": t.source.commit,
                "package": t.source.package,
                "wheel_version": t.source.wheel_version,
                "third_party": {
                    n: {"url": tp.url, "ref": tp.ref, "commit": tp.commit, "handoff": tp.handoff}
                    for n, tp in sorted(t.source.third_party.items())
                },
            },
            "python": {"version": t.python.version, "provider": t.python.provider},
            "cuda": {"version": t.cuda.version, "arch_list": list(t.cuda.arch_list)},
            "pins": {
                k: p.version for k, p in (("torch", t.torch), ("flashinfer", t.flashinfer), ("nccl", t.nccl)) if p
            },
            "lock_indexes": list(t.lock_indexes()),
            "compile": {
                "nvcc_threads": t.compile.nvcc_threads,
                "max_jobs": t.compile.max_jobs,
                "memory_per_job_gib": t.compile.memory_per_job_gib,
            },
            "dockerfile": {"path": str(self.dockerfile), "present": self.dockerfile.exists()},
            "locks": {k: {"path": str(p), "present": p.exists()} for k, p in self.lock_paths.named()},
            "output": self.output,
            "record": str(contract.record_path(self.root, t.name)),
            **({"platforms": self.platform_json()} if t.platforms and self.platform is None else {}),
        }
        return doc

    def rows(self) -> list[tuple[str, str]]:
        t = self.target
        rows = [
            ("target", f"{t.name}: {t.description}"),
            ("owner / expires", f"{t.owner} / {t.expires.isoformat()} (warn {t.expiry_warning_days} days before)"),
            ("build base", t.bases.build.ref),
            ("runtime base", t.bases.runtime.ref),
            ("source", f"{t.source.url} {t.source.branch} @ {t.source.commit}"),
            (
                "source package",
                f"{t.source.package} {t.source.wheel_version}"
                + (f" (told through {t.source.version_env})" if t.source.version_env else ""),
            ),
            (
                "python",
                f"{t.python.version} ({t.python.provider}"
                + (f": {t.python.standalone.url} sha256:{t.python.standalone.sha256}" if t.python.standalone else "")
                + ")",
            ),
            ("cuda", f"{t.cuda.version} arch {' '.join(t.cuda.arch_list)}"),
        ]
        rows += self.platform_rows()
        for label, pin in (("torch", t.torch), ("flashinfer", t.flashinfer), ("nccl (override)", t.nccl)):
            if pin:
                rows.append((label, pin.version + (f" from {pin.index}" if pin.index else "")))
        for name, tp in sorted(t.source.third_party.items()):
            named = f"{tp.ref} = {tp.commit}" if tp.ref != tp.commit else tp.commit
            rows.append(
                (
                    f"third party {name}",
                    f"{tp.url} @ {named} -> {tp.handoff}" + (f" (its {tp.subdir})" if tp.subdir else ""),
                )
            )
        rows += [
            ("lock indexes", ", ".join(t.lock_indexes())),
            ("lock inputs", ", ".join(t.pinned_requirements() + t.source.requirements) or "-"),
            ("build lock inputs", ", ".join(t.build_requirements + t.source.build_requirements) or "-"),
            (
                "build args",
                f'SOURCE_DATE_EPOCH=<commit time> TORCH_CUDA_ARCH_LIST="{" ".join(t.cuda.arch_list)}" '
                f"NVCC_THREADS={t.compile.nvcc_threads} MAX_JOBS=<parallelism>",
            ),
            (
                "parallelism",
                (
                    parallelism(t, 0, 0).describe()
                    if t.compile.max_jobs
                    else f"MAX_JOBS = jobs x NVCC_THREADS {t.compile.nvcc_threads}, jobs = min(cpus / "
                    f"{t.compile.nvcc_threads}, memory / ({t.compile.memory_per_job_gib} GiB x "
                    f"{t.compile.nvcc_threads})), from the builder; e.g. 64 cpus, 256 GiB: "
                    + parallelism(t, 64, 256 * GIB).describe()
                ),
            ),
            ("dockerfile", f"{self.dockerfile} ({'present' if self.dockerfile.exists() else 'not rendered'})"),
        ]
        for kind, path in self.lock_paths.named():
            rows.append((f"{kind} lock", f"{path} ({'present' if path.exists() else 'missing: run build lock'})"))
        rows += [("output", f"{self.output} -> recorded in {contract.record_path(self.root, t.name)}")]
        return rows


@dataclass(frozen=True)
class LockSet:
    """Both committed locks of a target, read and checked once per build: the texts hashed here
    are the bytes the build uses (a `build lock` landing mid-build cannot swap them)."""

    runtime: Path
    build: Path
    runtime_entries: tuple[LockEntry, ...]
    build_entries: tuple[LockEntry, ...]
    runtime_sha256: str
    build_sha256: str
    runtime_text: str = ""
    build_text: str = ""
    # The OS package lock (targets with os_packages only): path, entries, sha256 of the bytes read.
    os: Path | None = None
    os_entries: tuple[DebEntry, ...] = ()
    os_sha256: str | None = None

    @classmethod
    def read(cls, plan: Plan) -> LockSet:
        paths = plan.lock_paths
        r_text, b_text = lock.read_text(paths.runtime), lock.read_text(paths.build)
        r_entries, b_entries = lock.entries_of(r_text, paths.runtime), lock.entries_of(b_text, paths.build)
        for path, entries in ((paths.runtime, r_entries), (paths.build, b_entries)):
            # The build stage compiles against torch: it must be the same CUDA build as the runtime's.
            lock.check_torch_build(plan.target, entries, path)
        os_entries: tuple[DebEntry, ...] = ()
        os_sha256 = None
        if paths.os:  # read once, like the Python locks: these bytes are hashed and used
            os_text = oslock.read_text(paths.os)
            inputs, debs = oslock.parse(os_text, paths.os)
            oslock.check_inputs(inputs, paths.os, plan.target)  # all in the matrix: checked offline
            os_entries, os_sha256 = tuple(debs), sha256_bytes(os_text.encode())
        return cls(
            runtime=paths.runtime,
            build=paths.build,
            runtime_entries=tuple(r_entries),
            build_entries=tuple(b_entries),
            runtime_sha256=sha256_bytes(r_text.encode()),
            build_sha256=sha256_bytes(b_text.encode()),
            runtime_text=r_text,
            build_text=b_text,
            os=paths.os,
            os_entries=os_entries,
            os_sha256=os_sha256,
        )


# What the offline checks read and checked: the committed Dockerfile's text and the locks.
Offline: TypeAlias = tuple[str, LockSet]


def offline_checks(plan: Plan) -> Offline:
    """Refusals that need nothing but the repo: drifted Dockerfile, missing/unhashed/wrong-CUDA lock.
    Run once per platform per build: their result is handed on (``BuildContext.checked``)."""
    with log.step(f"{plan.target.name}: check the committed Dockerfile and locks"):
        dockerfile_text = render.check_committed(plan.target, plan.dockerfile)
        locks = LockSet.read(plan)
    return dockerfile_text, locks


def input_key(plan: Plan, dockerfile_text: str, locks: LockSet) -> str:
    """sha256 over everything a build reads, so an unchanged key means an unchanged image.

    The rendered Dockerfile (bases, labels, expiry), both locks, the whole matrix entry (source
    commit, pins, compile settings, the CPython tarball's sha256) and the tool version. MAX_JOBS is
    left out on purpose: it changes how fast the compile runs, not what it produces. docs/auditor.md
    ("The record: image.json") defines it exactly: sha256 of the compact, key-sorted JSON of
    {build_lock, dockerfile, lock, target, tool}, plus os_lock (the OS lock's sha256) for a target
    with os_packages.
    """
    doc = {
        "dockerfile": sha256_bytes(dockerfile_text.encode()),
        "lock": locks.runtime_sha256,
        "build_lock": locks.build_sha256,
        **({"os_lock": locks.os_sha256} if locks.os_sha256 else {}),
        "target": plan.target.as_input(),  # one platform's (Target.as_input)
        "tool": __version__,
    }
    # Compact, keys sorted: exactly `jq -cjS` of the same object (the hand check in docs/auditor.md recomputes it).
    return sha256_bytes(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())

"""The per-build context and what happens before the push is confirmed: one ``BuildContext`` per
engine build of a target (made once the offline checks pass), checked against the engine and the
source and assembled into the engine's request (``prepare`` -> ``Prepared``), then built into the local
image store, scanned for the build's secrets, pushed and confirmed served by the registry
(``run_engine``, builder/pipeline/prepush.py). Nothing here records anything.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from secrets import token_hex

from builder import __version__, log
from builder.config import cascade, contract
from builder.config.inputsource import UPSTREAM, InputSource
from builder.config.matrix import Target
from builder.config.options import BuildOptions
from builder.deps import lock
from builder.deps.buildcontext import assemble
from builder.dockerfile import compilecache
from builder.engine.buildx import BuildRequest, BuildResult, Engine, EngineInfo
from builder.errors import ConfigError, EngineUnavailable
from builder.pipeline.plan import LockSet, Offline, Plan, input_key, offline_checks, parallelism
from builder.records import store as records
from builder.source import bundles, fetches, kernelmap, kernelplan
from builder.source import pinned as source
from builder.source.kernelmap import SourcePlan
from builder.source.kernelplan import Sandbox
from builder.source.pinned import PinnedSource
from builder.source.requirements import SourceTree


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
    inputs: InputSource = UPSTREAM  # where the sources, files and bases come from (the escrow: no network)

    @classmethod
    def checked(
        cls,
        plan: Plan,
        engine: Engine,
        options: BuildOptions,
        *,
        tag: str | None = None,
        no_cache: bool | None = None,
        offline: Offline | None = None,
        inputs: InputSource = UPSTREAM,
    ) -> BuildContext:
        """The offline checks (`plan.offline_checks`), then the context of a build of the bytes they
        read. ``tag``: the target's unless given; ``no_cache``: --no-cache unless given;
        ``offline``: the offline checks' result when they already ran in this build (not run again)."""
        dockerfile_text, locks = offline if offline is not None else offline_checks(plan)
        return cls(
            plan=plan,
            engine=engine,
            options=options,
            dockerfile_text=dockerfile_text,
            locks=locks,
            input_key=input_key(plan, dockerfile_text, locks),
            tag=plan.tag if tag is None else tag,
            no_cache=options.no_cache if no_cache is None else no_cache,
            inputs=inputs,
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


def prepare(ctx: BuildContext, secret_dir: Path | None = None) -> Prepared:
    """Engine and source checks, then the context: nothing here pushes or records anything."""
    target, plan = ctx.target, ctx.plan
    extra_secrets = _cache_secret(target, ctx.options, secret_dir)
    # Room for what the build writes after the push (the record set) and along the way (the log):
    # refused now, not after the image is pushed and attached.
    records.check_writable(plan.record_dir, "the record set")
    records.check_writable(contract.artifacts_path(plan.root, target.name, "x").parent, "the build's artifacts")
    info = _preflight(ctx)
    # The source and what its build files are held to, before anything is written for this build:
    # a refusal here leaves no artifacts directory behind.
    pinned = _source_checked(ctx)
    build_id = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + token_hex(3)
    workdir = contract.artifacts_path(plan.root, target.name, build_id)
    workdir.mkdir(parents=True)
    log_path = workdir / contract.BUILD_LOG_NAME
    of = f"target {target.name}" + (f" for {plan.platform}" if plan.platform else "")
    log_path.write_text(f"[k3-builder] build {build_id} of {of}, tool {__version__}\n")
    started = contract.now_iso()
    third = _fetch_inputs(ctx, pinned)
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


def _source_checked(ctx: BuildContext) -> PinnedSource:
    """The pinned source, fetched and verified, then held to the matrix before any third-party fetch
    or compile: every fetch in its build files pinned or waived (exit 2), and each platform's kernel
    plan covering what ``kernels.required`` asks (exit 1, KernelPlanFailed)."""
    target = ctx.target
    if ctx.inputs.escrowed:  # from the bundle in the escrow, not the source's host
        with log.step(f"{target.name}: source @ {target.source.commit[:12]} from the escrow {ctx.inputs.reference}"):
            pinned = bundles.from_mirror(target.source)
    else:
        with log.step(f"{target.name}: fetch source {target.source.branch} @ {target.source.commit[:12]}", long=True):
            pinned = source.fetch(target.source)
        if pinned.branch_head != target.source.commit:
            log.warn(
                f"{target.source.branch} has moved to {pinned.branch_head[:12]}; building the pin "
                f"{target.source.commit[:12]} (run `build track` to move it)"
            )
    with log.step(f"{target.name}: every fetch in the source's build files is pinned or waived"):
        fetches.check(pinned, target)
    kernel_preflight(ctx.plan, pinned, lambda: cmake_sandbox(ctx.engine))
    return pinned


def kernel_preflight(plan: Plan, tree: SourceTree, sandbox: Callable[[], Sandbox]) -> list[SourcePlan]:
    """Each platform's kernel plan (its own arch list), all of them before any platform compiles;
    ``sandbox`` is asked for only when the target requires a kernel (upstream's CMake runs there,
    never on this host)."""
    compiled = plan.compiled_targets()
    if not any(t.kernels.required for _, t in compiled):
        return []
    names = ", ".join(p for p, _ in compiled if p) or "its arch list"
    with log.step(f"{plan.target.name}: the kernel plan covers kernels.required ({names})"):
        plans = kernelmap.check(tree, compiled, f"{plan.target.source.commit[:12]}", sandbox())
        for sp in plans:
            where = sp.platform or plan.target.name
            log.info(f"    {where}: arch {' '.join(sp.arch_list)}: every required kernel reaches its families")
    return plans


def cmake_sandbox(engine: Engine) -> Sandbox:
    """Where the preflight's kernel plan runs upstream's CMake: a container on the build's own engine
    (builder/engine/sandbox.py). An engine that brings its own sandbox (``cmake_sandbox()``: the
    unit tests' fake) is asked for it; any other has none, and the plan is not run on the host."""
    own = getattr(engine, "cmake_sandbox", None)
    if callable(own):
        return own()
    from builder.engine.buildx import DockerEngine
    from builder.engine.sandbox import CMakeSandbox

    if isinstance(engine, DockerEngine):
        return CMakeSandbox(engine.docker.client_config.docker_cmd, kernelplan.cmake_data())
    raise EngineUnavailable(
        "the kernel plan needs a sandbox container on the engine, and this engine offers none; "
        "upstream's CMake never runs on the build host"
    )


def _fetch_inputs(ctx: BuildContext, pinned: PinnedSource) -> dict:
    target, locks = ctx.target, ctx.locks
    third = {}
    if target.source.third_party:
        with log.step(f"{target.name}: fetch {len(target.source.third_party)} pinned third-party source(s)", long=True):
            third = source.fetch_all_third_party(target.source, pinned, live=not ctx.inputs.escrowed)
            for tp in third.values():
                log.info(
                    f"    {tp.name}: {tp.url} @ {tp.commit[:12]}"
                    + (f" + {len(tp.submodules)} submodule(s)" if tp.submodules else "")
                )
    with log.step(f"{target.name}: check the locks were made from these inputs"):
        lock.check_current(locks.runtime, lock.inputs(target, pinned, "runtime"), locks.runtime_text)
        lock.check_current(locks.build, lock.inputs(target, pinned, "build"), locks.build_text)
    return third


def _preflight(ctx: BuildContext) -> EngineInfo:
    target = ctx.target
    with log.step(f"{target.name}: engine preflight"):
        info = ctx.engine.preflight(ctx.options.builder)
        log.info(
            f"    engine {info.server_version}, buildx {info.buildx_version}, builder {info.builder} ({info.driver})"
        )
    emulated_refused(ctx.plan.target.name, ctx.plan.platform, info.native, ctx.options.allow_emulated)
    if info.driver != "docker":
        # BuildKit's attestations exist only in a push BuildKit makes; the image is pushed from the
        # local store once scanned, so the tool's own SBOM and provenance are the only ones.
        log.info(
            f"    note: no BuildKit attestations on the {info.driver} driver (the image is pushed from the local "
            f"store after the secret scan); the tool's SBOM and provenance "
            f"({ctx.plan.record_dir.relative_to(ctx.plan.root)}/) are the record"
        )
    return info


def emulated_refused(target: str, platform: str | None, native: tuple[str, ...], allowed: bool) -> None:
    """A compile under QEMU takes hours (cu129's far more): refused unless --allow-emulated, but for
    the smoke (minutes). Unknown native platforms (an engine that says nothing) refuse nothing."""
    if platform is None or not native or platform in native or allowed or target == "smoke":
        return
    raise ConfigError(
        f"{target} {platform}: the builder runs {', '.join(native)} natively, so this compile would run "
        "emulated (QEMU, hours); use a native or multi-node builder (`docker buildx create --append` "
        f"a {platform} node, then --builder), or pass --allow-emulated"
    )


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
            **_base_args(ctx),
        },
        build_contexts=contexts,
        source_date_epoch=epoch,
        push=False,  # into the local image store: nothing leaves the host before the secret scan
        no_cache=ctx.no_cache,
        builder=options.builder,
        attest=False,  # BuildKit attestations exist only in a BuildKit push; dockerd pushes the scanned image
        cache_from=options.cache_from,
        cache_to=options.cache_to,
        secrets=options.secrets + secrets,
        platform=ctx.plan.platform,  # one platform of an image index: built for it (emulated if foreign)
    )


def _base_args(ctx: BuildContext) -> dict[str, str]:
    """From the escrow: each base by the same digest, from the escrow's repository (build args
    over the Dockerfile's defaults: the Dockerfile, and the image, are the recorded ones)."""
    bases = ctx.target.bases
    pairs = (("BUILD_BASE_IMAGE", bases.build.digest), ("RUNTIME_BASE_IMAGE", bases.runtime.digest))
    return {arg: ref for arg, digest in pairs if (ref := ctx.inputs.base_ref(digest))}


def _cache_secret(target: Target, options: BuildOptions, secret_dir: Path | None) -> tuple[str, ...]:
    """The remote compile cache's BuildKit secret: the command line's backend, else the matrix's."""
    url = cascade.compile_cache(options, target).value
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


def run_engine(prep: Prepared) -> BuildResult:
    """Build into the local image store, scan it for the build's secrets, and only then push and
    make sure the registry serves the scanned image (builder/pipeline/prepush.py)."""
    from builder.pipeline import prepush

    target, engine, req = prep.target, prep.ctx.engine, prep.request
    image_id = prepush.build_scanned(engine, target, req, prep.log_path)
    return prepush.push(engine, target, req, image_id, prep.log_path)

"""Command line: ``build [--matrix M] [--target T] [COMMAND] ...``. Only ``main()`` exits."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from builder import __version__, log
from builder.config.matrix import Matrix, load
from builder.errors import BuilderError, CheckFailed, ConfigError, DriftError, Interrupted, VerifyFailed, host_resources

if TYPE_CHECKING:
    from builder.config.options import BuildOptions

DESCRIPTION = """\
Reproducible builds of vLLM for Kimi K3 against CUDA 12.9, from matrix.yaml.

With no command, builds --target (the maintainer's `build --target cu129`).
--matrix and --target may stand before or after the command."""

EPILOG = """\
exit codes: 0 ok; 1 build/check failed or drift found; 2 bad input (matrix, target, lock,
record, source); 3 out of reach (Docker engine, registry, git remote, package index);
74 this host is out of disk space, a writable disk, memory or threads;
75 another build (or lock, prune) of the same target is running; 130 interrupted."""


class Output:
    """What a command prints on stdout: lines for people, or one JSON document with --json.

    Progress, tables and errors go to stderr either way, so stdout stays machine-readable."""

    def __init__(self, json_mode: bool) -> None:
        self.json_mode = json_mode
        self.data: dict = {}

    def line(self, text: str) -> None:
        if not self.json_mode:
            print(text)

    def finish(self, code: int, error: BuilderError | None = None) -> None:
        if self.json_mode:
            doc = {"ok": code == 0, "exit_code": code, **self.data}
            if error is not None:
                doc["error"] = log.redact(error.message)
            print(json.dumps(doc, indent=2, sort_keys=True, default=str))


class _TargetAction(argparse.Action):
    """--target T: always a list after parsing; given again (or as a,b), several targets. A
    repeated name counts once (`--target smoke --target smoke` builds smoke once)."""

    def __call__(self, parser, namespace, values, option_string=None):
        names = [v for v in values.split(",") if v]
        current = getattr(namespace, self.dest, None) or []
        setattr(namespace, self.dest, list(dict.fromkeys([*current, *names])))


def _globals(parser: argparse.ArgumentParser, top: bool) -> None:
    # Subcommand copies use SUPPRESS so a value given before the command is not reset after it.
    default = (lambda v: v) if top else (lambda v: argparse.SUPPRESS)
    parser.add_argument(
        "--matrix", type=Path, default=default(Path("matrix.yaml")), help="the build matrix (default: ./matrix.yaml)"
    )
    parser.add_argument(
        "--target",
        default=default([]),
        action=_TargetAction,
        help="a target name from the matrix (repeatable for `build`)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="print one JSON document on stdout instead of human output",
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="build", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _globals(p, top=True)
    _build_options(p, top=True)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    r = sub.add_parser(
        "render",
        help="render dockerfiles/<target>/Dockerfile from the matrix",
        description="Render every target's Dockerfile (or --target's) from the matrix "
        "into dockerfiles/<target>/Dockerfile beside the matrix.",
    )
    _globals(r, top=False)
    r.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if a committed Dockerfile differs from what the matrix renders",
    )

    lk = sub.add_parser(
        "lock",
        help="resolve and hash-lock a target's dependencies (uv pip compile)",
        description="Write locks/<target>/requirements.txt and build-requirements.txt with "
        "uv pip compile --generate-hashes for the target's Python and glibc, from the "
        "matrix's pins, overrides and indexes and the source's requirement files at "
        "the pinned commit. Ignores the machine's pip and uv configuration; emits no "
        "index URLs. A target with os_packages also gets locks/<target>/os-packages.txt, "
        "resolved with apt in a container of the runtime base (exit 3 when its archive "
        "is out of reach); nothing is written unless every lock resolved. "
        "--rehearse resolves against PyPI only (pins that live only on "
        "another index substituted or left out, each listed), reports every "
        "distribution of another CUDA major, exits 1 on one the matrix gives no "
        "reason for, and writes nothing under locks/ (report: "
        "artifacts/<target>/rehearsal/).",
    )
    _globals(lk, top=False)
    lk.add_argument(
        "--rehearse",
        action="store_true",
        help="resolve against PyPI only, as a rehearsal of the real lock; writes no lock",
    )

    pl = sub.add_parser(
        "plan",
        help="show everything a build of --target reads and produces (no network)",
        description="Print bases with digests, source commit, versions, build args, locks "
        "and the output reference. Reads only the matrix and local files.",
    )
    _globals(pl, top=False)

    b = sub.add_parser(
        "build",
        help="build, push and record --target (the default command)",
        description="Check the committed Dockerfile and locks, fetch the pinned source, "
        "assemble a hermetic context, build and push with buildx, confirm the "
        "registry serves the digest, and record it in locks/<target>/image.json.",
    )
    _globals(b, top=False)
    _build_options(b, top=False)

    t = sub.add_parser(
        "test",
        help="run the image checks (testinfra) on --target's recorded image or --image",
        description="Check an image against the matrix: CUDA version, no other CUDA major, "
        "compiled modules and ops, pinned versions, expiry and labels, contents "
        "equal to the lock, pip check, non-root. Writes a JUnit report.",
    )
    _globals(t, top=False)
    t.add_argument("--image", help="image reference to check (default: the digest in locks/<target>/image.json)")

    v = sub.add_parser(
        "verify",
        help="the auditor's check: every link from matrix to registry, one row each",
        description="Check matrix <-> Dockerfile <-> lock <-> image.json <-> SBOM <-> provenance, one "
        "row per link, from the repository alone. --registry also checks that the "
        "registry serves the recorded digest (and the tag points at it), that the SBOM "
        "and provenance attached to it equal the committed files, and the image's "
        "signature: verified (cosign on PATH accepted a keyless signature by matrix "
        "signing.identity or $K3_SIGNING_IDENTITY, issuer signing.issuer or "
        "$K3_SIGNING_ISSUER), present-unverified (signed, not checked: no cosign or no "
        "identity), missing (a failure only when an identity is set) or failed. "
        "Exit 0 only if all hold; nothing recorded at all is a failure.",
    )
    _globals(v, top=False)
    v.add_argument(
        "--registry", action="store_true", help="also check the registry: image and tag, SBOM + provenance, signature"
    )

    rp = sub.add_parser(
        "reproduce",
        help="rebuild the recorded image with no cache and compare digests",
        description="Rebuild --target from the committed records with no cache, push it as "
        "<tag>-reproduce and compare with the recorded digest. On a difference, "
        "report config fields, then layer by layer and file by file. Takes the build "
        "options (--secret for targets that need one, --builder, ...).",
    )
    _globals(rp, top=False)
    _build_options(rp, top=False)

    tr = sub.add_parser(
        "track",
        help="follow --target's branch: move the commit pin when the branch moved",
        description="Resolve refs/heads/<branch> with ls-remote (no clone). When it moved past the "
        "pin, update targets.<t>.source.commit in the matrix (that line only; comments "
        "and order kept), re-render the Dockerfile and list the commits in between. "
        "A deleted branch, a rewritten (force-pushed) history or a file:// URL without "
        "K3_ALLOW_FILE_URLS=1: exit 2; an unreachable remote: exit 3; the matrix untouched.",
    )
    _globals(tr, top=False)
    tr.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 when the pin is behind, 0 when current"
    )

    dr = sub.add_parser(
        "doctor",
        help="can this image start on this host's driver? which route applies?",
        description="Read the host's driver (nvidia-smi, or a captured --nvidia-smi-file: the "
        "table, -q, --version or a --query-gpu CSV with its header, R610's KMD "
        "Version too, Windows/WSL captures included) and the image's CUDA version "
        "(labels, env), and say in one line whether it can start and why: minimum "
        "driver per CUDA release, minor-version compatibility within a major, forward "
        "compatibility only on data-center GPUs. A broken host (NVML mismatch, no "
        "libnvidia-ml.so, no driver, no devices) is a verdict with its route. Also "
        "reports an expired image; --record DIR writes the decision record (Markdown "
        "and JSON). Exit 0 compatible, 1 incompatible or broken host, 2 bad input, "
        "3 engine or registry out of reach.",
    )
    _globals(dr, top=False)
    dr.add_argument("--image", help="image reference (default: --target's recorded image)")
    dr.add_argument("--nvidia-smi-file", type=Path, help="captured nvidia-smi output (table, -q, --version, CSV)")
    dr.add_argument("--record", type=Path, metavar="DIR", help="write the decision record (.md and .json) into DIR")
    dr.add_argument("--evidence", type=Path, metavar="ARCHIVE", help="the `build evidence` archive the record names")

    ev = sub.add_parser(
        "evidence",
        help="save host, engine, image and container state before changing anything",
        description="Collect date -u, nvidia-smi (or its absence), uname -a, hostname, the loaded "
        "NVIDIA kernel modules and driver version, nvidia-smi topo -m, InfiniBand state "
        "(/sys/class/infiniband, ibv_devinfo), running containers, docker version and "
        "info, image inspect, vLLM version and source from labels, the NCCL version "
        "inside the image, the environment sorted with secrets redacted, and a "
        "container's log, into one timestamped tar.gz with a manifest of what was "
        "captured and what was missing (and why). Works with no GPU, no nvidia-smi "
        "and no Docker.",
    )
    _globals(ev, top=False)
    ev.add_argument("--image", help="image reference to inspect")
    ev.add_argument("--container", help="container whose log to capture")
    ev.add_argument("--out", type=Path, required=True, help="directory for the archive")
    ev.add_argument("--nvidia-smi-file", type=Path, help="captured nvidia-smi output instead of running it")

    cp = sub.add_parser(
        "compare",
        help="package-by-package diff of --target's image against a reference image",
        description="Python distributions, OS packages, CUDA version and labels of our image "
        "(--target's recorded one, or --image) against --against REF.",
    )
    _globals(cp, top=False)
    cp.add_argument("--against", required=True, help="the reference image, e.g. vllm/vllm-openai:kimi-k3")
    cp.add_argument("--image", help="our image (default: --target's recorded image)")
    cp.add_argument(
        "--format",
        choices=("text", "markdown"),
        default="text",
        help="markdown: a table for $GITHUB_STEP_SUMMARY (appended there when set)",
    )
    cp.add_argument("--all", action="store_true", help="list every difference after the summary")

    pr = sub.add_parser(
        "prune",
        help="remove old build and test directories under artifacts/",
        description="Keep the newest --keep build directories and --keep test directories of "
        "each target (all targets unless --target) under artifacts/<target>/; "
        "remove the rest. Builds already drop their context/source copies.",
    )
    _globals(pr, top=False)
    pr.add_argument("--keep", type=int, default=5, help="how many of each kind to keep per target (default 5)")

    sm = sub.add_parser(
        "smoke-init",
        help="make the smoke target's bases, source repo and matrix (demo/tests)",
        description="Create the smoke target on this machine: Debian 12 base images "
        "(debootstrap) pushed to --registry and pinned by digest, a git "
        "repository of the stand-in source, and OUT/matrix.yaml.",
    )
    sm.add_argument("--out", type=Path, default=Path("smoke"), help="where to write (default: ./smoke)")
    sm.add_argument("--registry", default="127.0.0.1:5000", help="registry for the bases and the image")
    sm.add_argument("--repository", default="k3/smoke", help="repository of the smoke image (default: k3/smoke)")
    return p


def _build_options(parser: argparse.ArgumentParser, top: bool) -> None:
    default = (lambda v: v) if top else (lambda v: argparse.SUPPRESS)
    parser.add_argument(
        "--no-cache", action="store_true", default=default(False), help="build without the engine's layer cache"
    )
    parser.add_argument("--builder", default=default(None), help="buildx builder to use (default: the current one)")
    parser.add_argument(
        "--max-jobs",
        type=int,
        default=default(None),
        help="override MAX_JOBS for the compile (default: derived from the builder's memory)",
    )
    parser.add_argument(
        "--no-checks",
        action="store_true",
        default=default(False),
        help="skip the image checks after the push (they run by default)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        default=default(False),
        help="build even when the inputs equal the recorded ones and the registry serves the image",
    )
    parser.add_argument(
        "--cache-from",
        action="append",
        default=default([]),
        metavar="SPEC",
        help="buildx cache source, repeatable (a bare image ref means type=registry,ref=REF)",
    )
    parser.add_argument(
        "--cache-to",
        default=default(None),
        metavar="SPEC",
        help="buildx cache export, e.g. type=inline (docker driver) or "
        "type=registry,ref=REF,mode=max / type=local,dest=DIR (docker-container)",
    )
    parser.add_argument(
        "--secret",
        action="append",
        default=default([]),
        metavar="id=ID,env=VAR|src=FILE",
        help="a BuildKit secret for an id the matrix lists in compile.secrets (repeatable); "
        "its value is never logged, labelled or recorded",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=default(1),
        help="build this many targets at once (with several --target); one summary",
    )
    parser.add_argument(
        "--keep-context",
        action="store_true",
        default=default(False),
        help="keep the build's context/, source/ and third_party/ copies under artifacts/",
    )
    parser.add_argument(
        "--compile-cache",
        default=default(None),
        metavar="URL",
        help="remote sccache backend for targets with compile.remote_cache: redis://host:port, "
        "s3://bucket/prefix?region=R, gcs://bucket, webdav(s)://host/path, gha:// "
        "(default: $K3_COMPILE_CACHE); it travels as a BuildKit secret",
    )


def _targets(matrix: Matrix, names: list[str]) -> list[str]:
    """The named targets (each checked, with a "did you mean"), or every target when none is named."""
    for name in names:
        matrix.target(name)
    return list(names) or sorted(matrix.targets)


def _per_target(args: argparse.Namespace, out: Output, body) -> int:
    """Run ``body(plan, out)`` for --target, or for every target when none is named: every command
    takes --target the same way. One target: its document as it is; several: under "targets"."""
    from builder.pipeline.plan import Plan

    matrix = load(args.matrix)
    names = _targets(matrix, args.target)
    if len(names) == 1:
        return body(Plan.of(matrix, names[0]), out)
    codes, docs = [], {}
    for name in names:
        sub = Output(out.json_mode)
        try:
            codes.append(body(Plan.of(matrix, name), sub))
            docs[name] = {"ok": codes[-1] == 0, **sub.data}
        except BuilderError as exc:
            codes.append(exc.exit_code)
            log.info(f"error: {name}: {log.redact(exc.message)}")
            docs[name] = {"ok": False, "exit_code": exc.exit_code, "error": log.redact(exc.message), **sub.data}
    out.data["targets"] = docs
    return max(codes)


def _options(args: argparse.Namespace, plans) -> BuildOptions:
    from builder.config.options import BuildOptions, parse_secrets

    wanted = {sid for p in plans for sid in p.target.compile.secrets}
    return BuildOptions(
        no_cache=args.no_cache,
        builder=args.builder,
        max_jobs=args.max_jobs,
        run_checks=not args.no_checks,
        force=args.force,
        cache_from=tuple(args.cache_from),
        cache_to=args.cache_to,
        secrets=parse_secrets(args.secret, wanted),
        jobs=args.jobs,
        keep_context=args.keep_context,
        compile_cache=args.compile_cache or os.environ.get("K3_COMPILE_CACHE") or None,
        compile_cache_from_env=not args.compile_cache and bool(os.environ.get("K3_COMPILE_CACHE")),
    )


def _engine():
    from builder.engine.buildx import DockerEngine

    return DockerEngine()


def cmd_render(args: argparse.Namespace, out: Output) -> int:
    from builder.pipeline.build import render_all

    matrix = load(args.matrix)
    status = render_all(matrix, _targets(matrix, args.target), check=args.check)
    out.data["dockerfiles"] = status
    drift = [n for n, s in status.items() if s not in ("up to date", "written")]
    for name, state in status.items():
        log.info(f"{args.matrix.resolve().parent / 'dockerfiles' / name / 'Dockerfile'}: {state}")
    if drift:
        raise DriftError(
            f"{len(drift)} Dockerfile(s) out of date ({', '.join(drift)}); run `build render` and commit the result"
        )
    return 0


def cmd_lock(args: argparse.Namespace, out: Output) -> int:
    return _per_target(args, out, lambda plan, o: _lock(plan, o, args.rehearse))


def _lock(plan, out: Output, rehearse: bool) -> int:
    from builder.pipeline.build import lock_target, rehearse_lock

    if not rehearse:
        written = lock_target(plan, _engine)
        for path in written.values():
            log.info(f"{path}: written")
        out.data["locks"] = {kind: str(path) for kind, path in written.items()}
        return 0
    result = rehearse_lock(plan)
    log.info(
        f"REHEARSAL ({result.source}): resolved {result.entries} entries against PyPI only; "
        "the real lock still needs the real indexes"
    )
    for sub in result.substitutions:
        log.info(f"    substituted  {sub.line()}")
    for finding in result.findings:
        log.info(f"    {finding.line()}")
    log.info(f"    report: {result.report}")
    out.data["rehearsal"] = result.to_json()
    if not result.ok:
        raise CheckFailed(
            f"{plan.target.name}: the rehearsal found distributions of another CUDA major with no "
            "reason in cuda.other_major (see above)"
        )
    out.line(str(result.report))
    return 0


def cmd_plan(args: argparse.Namespace, out: Output) -> int:
    return _per_target(args, out, _show_plan)


def _show_plan(plan, out: Output) -> int:
    width = max(len(k) for k, _ in plan.rows())
    for key, value in plan.rows():
        out.line(f"{key:<{width}}  {value}")
    out.data["plan"] = plan.to_json()
    return 0


def _summarize(outcomes, errors, out: Output) -> None:
    rows = []
    for o in outcomes:
        status = "up to date" if o.up_to_date else "pushed" if o.changed else "pushed (same digest)"
        if o.cache and o.cache.hit_rate is not None:
            status += f", compile cache {o.cache.hits}/{o.cache.hits + o.cache.misses} hits"
        if o.cache and o.cache.backend_unreachable:
            status += " (cache backend unreachable)"
        size = f"{o.size / 1e6:.1f} MB" if o.size else "-"
        rows.append(log.SummaryRow(o.image.split("@")[0], o.digest, size, o.seconds, status))
        if o.log:
            log.info(f"{o.target}: recorded in {o.record}; log in {o.log}")
    for name, exc in errors:
        rows.append(log.SummaryRow(name, "-", "-", 0.0, f"FAILED: {exc.message[:80]}"))
    log.summary(rows)
    for o in outcomes:
        out.line(o.image)
    out.data["builds"] = [
        {
            "target": o.target,
            "image": o.image,
            "digest": o.digest,
            "size": o.size,
            "seconds": round(o.seconds, 2),
            "status": "up to date" if o.up_to_date else "pushed",
            "compile_cache": o.cache.__dict__ if o.cache else None,
            "log": str(o.log) if o.log else None,
        }
        for o in outcomes
    ]
    out.data["errors"] = [{"target": name, "error": log.redact(exc.message)} for name, exc in errors]


def cmd_build(args: argparse.Namespace, out: Output) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from builder.pipeline.build import build
    from builder.pipeline.plan import Plan

    matrix = load(args.matrix)
    plans = [Plan.of(matrix, name) for name in _targets(matrix, args.target)]
    options = _options(args, plans)
    engine = _engine()
    if len(plans) == 1:
        outcomes, errors = [build(plans[0], engine, options)], []
    else:
        # Several targets: per-target logs under artifacts/<target>/<build-id>/, one summary.
        log.quiet_build_output(True)
        with ThreadPoolExecutor(max_workers=options.jobs) as pool:
            futures = [(p.target.name, pool.submit(build, p, engine, options)) for p in plans]
        outcomes, errors = [], []
        for name, future in futures:
            try:
                outcomes.append(future.result())
            except BuilderError as exc:
                errors.append((name, exc))
    _summarize(outcomes, errors, out)
    if errors:
        raise max((e for _, e in errors), key=lambda e: e.exit_code)
    return 0


def cmd_test(args: argparse.Namespace, out: Output) -> int:
    from builder.config import contract
    from builder.engine.buildx import image_config
    from builder.pipeline.build import test

    engine = _engine()
    if args.image and not args.target:  # the image's own label says which target it is
        labels = image_config(engine, args.image).labels
        key = contract.keys_in(labels).target
        label = labels.get(key)
        if not label:
            raise ConfigError(f"test: {args.image} has no {key} label; pass --target")
        args.target = [label]

    def one(plan, o: Output) -> int:
        report = test(plan, engine, args.image)
        o.data.update(report.to_json())
        o.line(report.image)
        return 0

    return _per_target(args, out, one)


def cmd_verify(args: argparse.Namespace, out: Output) -> int:
    from builder.records.verify import verify_targets

    matrix = load(args.matrix)
    engine = _engine() if args.registry else None
    results = verify_targets(matrix, _targets(matrix, args.target), engine, explicit=bool(args.target))
    out.data["rows"] = []
    failed = []
    for name, row in results:
        log.info(f"{'ok  ' if row.ok else 'FAIL'}  {name:<8} {row.check:<28} {row.detail}")
        out.data["rows"].append({"target": name, "check": row.check, "ok": row.ok, "detail": row.detail})
        if not row.ok:
            failed.append(f"{name}: {row.check}")
    if failed:
        raise VerifyFailed(f"verify failed: {'; '.join(failed)}")
    return 0


def cmd_reproduce(args: argparse.Namespace, out: Output) -> int:
    from builder.pipeline.build import reproduce

    engine = _engine()

    def one(plan, o: Output) -> int:
        result = reproduce(plan, engine, _options(args, [plan]))
        o.data.update(result.to_json())
        result.raise_for_difference()
        o.line(f"{plan.target.image.name}@{result.rebuilt}")
        return 0

    return _per_target(args, out, one)


def _on_images(args: argparse.Namespace, out: Output, body) -> int:
    """``body(image, out)`` for --image, else for each target's recorded image."""
    if args.image:
        return body(args.image, out)
    from builder.pipeline.build import recorded_image

    return _per_target(args, out, lambda plan, o: body(recorded_image(plan), o))


def cmd_doctor(args: argparse.Namespace, out: Output) -> int:
    import datetime as dt

    from builder.engine.buildx import image_config
    from builder.host import doctor

    smi_text, smi_source = doctor.read_nvidia_smi(args.nvidia_smi_file)
    doctor.host_of(smi_text, smi_source)  # output it cannot read is bad input before any image is looked at
    archive = doctor.archive_facts(args.evidence)
    if args.record is not None:
        doctor.output_dir(args.record, "--record")  # refused before anything is diagnosed or written
    engine = _engine()

    def one(image: str, o: Output, built: dict | None = None) -> int:
        config = image_config(engine, image)
        d = doctor.diagnose(smi_text, smi_source, config.labels, config.env, image)
        o.line(d.line)
        o.line(f"route: {d.route}")
        for text in (
            ([d.expiry] if d.expiry else [])
            + [f"note: {n}" for n in d.notes]
            + ([f"save first: {d.save}"] if d.save else [])
        ):
            o.line(text)
        o.data.update(
            {
                "compatible": d.compatible,
                "verdict": d.line,
                "route": d.route,
                "expiry": d.expiry,
                "notes": d.notes,
                "save": d.save,
                **d.facts,
            }
        )
        if args.record is not None:
            doc = doctor.decision(d, config.labels, built, archive, dt.datetime.now(dt.timezone.utc))
            md, js = doctor.write_decision(args.record, doc)
            o.line(f"record: {md}")
            o.data.update({"record": str(md), "record_json": str(js)})
        return 0 if d.compatible else 1

    if args.image:
        return one(args.image, out)
    from builder.pipeline.build import recorded_image

    return _per_target(args, out, lambda plan, o: one(recorded_image(plan), o, doctor.image_record(plan)))


def cmd_evidence(args: argparse.Namespace, out: Output) -> int:
    from builder.host.evidence import evidence
    from builder.pipeline.build import recorded_image

    image = args.image
    if image is None and args.target:  # --target names the image: its recorded one
        if len(args.target) > 1:
            raise ConfigError(f"evidence: one image per archive; --target names {', '.join(args.target)}")
        from builder.pipeline.plan import Plan

        image = recorded_image(Plan.of(load(args.matrix), args.target[0]))
    path, manifest = evidence(_engine(), args.out, image, args.container, args.nvidia_smi_file)
    for name, why in sorted(manifest["missing"].items()):
        log.info(f"    not captured: {name}: {why}")
    log.info(f"    captured: {', '.join(manifest['captured'])}")
    out.line(str(path))
    out.data.update({"archive": str(path), **manifest})
    return 0


def cmd_compare(args: argparse.Namespace, out: Output) -> int:
    from builder.host.compare import compare

    engine = _engine()

    def one(image: str, o: Output) -> int:
        result = compare(engine, image, args.against)
        if args.format == "markdown":
            o.line(result.markdown())
            summary = os.environ.get("GITHUB_STEP_SUMMARY")
            if summary:
                with open(summary, "a", encoding="utf-8") as fh:
                    fh.write(result.markdown())
        else:
            for line in result.text() if args.all else result.summary():
                o.line(line)
        o.data.update(result.to_json())
        return 0

    return _on_images(args, out, one)


def cmd_smoke_init(args: argparse.Namespace, out: Output) -> int:
    from builder.pipeline import smoke

    matrix_path = smoke.init(args.out, args.registry, _engine(), repository=args.repository)
    out.line(str(matrix_path))
    out.data["matrix"] = str(matrix_path)
    return 0


def cmd_track(args: argparse.Namespace, out: Output) -> int:
    return _per_target(args, out, lambda plan, o: _track(args, plan.target.name, o))


def _track(args: argparse.Namespace, name: str, out: Output) -> int:
    from builder.source.track import track

    result = track(args.matrix, load(args.matrix), name, check=args.check)
    out.data.update(result.to_json())
    if not result.moved:
        log.info(f"{name}: {result.branch} is at the pin {result.old[:12]}; nothing to do")
        out.line(f"{name}: current {result.old}")
        return 0
    log.info(
        f"{name}: {result.branch} moved {result.old[:12]} -> {result.new[:12]} "
        f"({len(result.subjects)} commit{'s' if len(result.subjects) != 1 else ''})"
    )
    for subject in result.subjects:
        log.info(f"    {subject}")
    for tp, names in result.third_party_changed.items():
        log.warn(
            f"{name}: third-party {tp!r}: the new commit's build files no longer name the pinned ref; they "
            f"name {', '.join(names)}: re-pin source.third_party.{tp} (ref and commit) before `build lock`"
        )
    if args.check:
        out.line(f"{name}: behind {result.old} -> {result.new}")
        return 1
    log.info(
        f"{args.matrix}: targets.{name}.source.commit updated; Dockerfile re-rendered; "
        f"next: `build lock --target {name}` and `build --target {name}`"
    )
    out.line(f"{name}: {result.old} -> {result.new}")
    return 0


def cmd_prune(args: argparse.Namespace, out: Output) -> int:
    from builder.pipeline.build import prune

    if args.keep < 0:
        raise ConfigError(f"--keep: must be 0 or more (got {args.keep})")
    matrix = load(args.matrix)
    removed = prune(args.matrix.resolve().parent, _targets(matrix, args.target), args.keep)
    for path in removed:
        log.info(f"removed {path}")
    out.data["removed"] = [str(p) for p in removed]
    out.line(f"removed {len(removed)} director{'y' if len(removed) == 1 else 'ies'}")
    return 0


COMMANDS = {
    "render": cmd_render,
    "lock": cmd_lock,
    "plan": cmd_plan,
    "build": cmd_build,
    "test": cmd_test,
    "verify": cmd_verify,
    "reproduce": cmd_reproduce,
    "track": cmd_track,
    "doctor": cmd_doctor,
    "evidence": cmd_evidence,
    "compare": cmd_compare,
    "smoke-init": cmd_smoke_init,
    "prune": cmd_prune,
}


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    command = args.command or "build"
    if args.command is None and not args.target:
        parser.print_help(sys.stderr)
        sys.exit(2)
    # SIGTERM (a CI runner cancelling the job) takes the same path as Ctrl-C: the build's child is
    # stopped, the log says so, and no record is written. SIGINT is set too: a shell without job
    # control starts `build ... &` with SIGINT ignored, and Python keeps an inherited ignore, so
    # a deliberate `kill -INT` would otherwise be lost and the build would run on.
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    out = Output(args.json)
    try:
        code = COMMANDS[command](args, out)
    except BuilderError as exc:
        # One line, always: control characters from hostile input are shown escaped.
        message = "".join(c if c.isprintable() else repr(c)[1:-1] for c in log.redact(exc.message))
        log.info(f"error: {message}")
        out.finish(exc.exit_code, exc)
        sys.exit(exc.exit_code)
    except BrokenPipeError:  # `build plan | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    except (OSError, MemoryError, RuntimeError) as exc:
        # Resource exhaustion wherever it strikes (a full or read-only disk, a memory limit):
        # its own exit code and one line, never a traceback nor "bad input".
        resources = host_resources(exc)
        if resources is None:
            raise
        log.info(f"error: {log.redact(resources.message)}")
        out.finish(resources.exit_code, resources)
        sys.exit(resources.exit_code)
    except KeyboardInterrupt:
        log.info("error: interrupted; records untouched")
        out.finish(130, Interrupted("interrupted; records untouched"))
        sys.exit(130)
    out.finish(code)
    sys.exit(code)


def _terminate(signum, frame):  # noqa: ARG001 - signal handler signature
    raise KeyboardInterrupt

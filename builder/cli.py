"""Command line: ``build [--matrix M] [--target T] [COMMAND] ...``. Only ``main()`` exits."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from builder import __version__, contract, lock, log, render, source
from builder.errors import BuilderError, CheckFailed, ConfigError, DriftError, Interrupted, VerifyFailed
from builder.fsutil import atomic_write
from builder.matrix import Matrix, load

DESCRIPTION = """\
Reproducible builds of vLLM for Kimi K3 against CUDA 12.9, from matrix.yaml.

With no command, builds --target (the maintainer's `build --target cu129`).
--matrix and --target may stand before or after the command."""

EPILOG = """\
exit codes: 0 ok; 1 build/check failed or drift found; 2 bad input (matrix, target, lock,
record, source); 3 Docker engine or registry unreachable; 130 interrupted."""


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
    """--target T: a name; given again (or as a,b), the build command builds several."""

    def __call__(self, parser, namespace, values, option_string=None):
        names = [v for v in values.split(",") if v]
        current = getattr(namespace, self.dest, None)
        previous = current if isinstance(current, list) else ([current] if current else [])
        merged = previous + names
        setattr(namespace, self.dest, merged[0] if len(merged) == 1 else merged)


def _globals(parser: argparse.ArgumentParser, top: bool) -> None:
    # Subcommand copies use SUPPRESS so a value given before the command is not reset after it.
    default = (lambda v: v) if top else (lambda v: argparse.SUPPRESS)
    parser.add_argument("--matrix", type=Path, default=default(Path("matrix.yaml")),
                        help="the build matrix (default: ./matrix.yaml)")
    parser.add_argument("--target", default=default(None), action=_TargetAction,
                        help="a target name from the matrix (repeatable for `build`)")
    parser.add_argument("--json", action="store_true", default=default(False),
                        help="print one JSON document on stdout instead of human output")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="build", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _globals(p, top=True)
    _build_options(p, top=True)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    r = sub.add_parser("render", help="render dockerfiles/<target>/Dockerfile from the matrix",
                       description="Render every target's Dockerfile (or --target's) from the matrix "
                                   "into dockerfiles/<target>/Dockerfile beside the matrix.")
    _globals(r, top=False)
    r.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if a committed Dockerfile differs from what the matrix renders")

    lk = sub.add_parser("lock", help="resolve and hash-lock a target's dependencies (uv pip compile)",
                        description="Write locks/<target>/requirements.txt and build-requirements.txt with "
                                    "uv pip compile --generate-hashes for the target's Python and glibc, from the "
                                    "matrix's pins, overrides and indexes and the source's requirement files at "
                                    "the pinned commit. Ignores the machine's pip and uv configuration; emits no "
                                    "index URLs. --rehearse resolves against PyPI only (pins that live only on "
                                    "another index substituted or left out, each listed), reports every "
                                    "distribution of another CUDA major, exits 1 on one the matrix gives no "
                                    "reason for, and writes nothing under locks/ (report: "
                                    "artifacts/<target>/rehearsal/).")
    _globals(lk, top=False)
    lk.add_argument("--rehearse", action="store_true",
                    help="resolve against PyPI only, as a rehearsal of the real lock; writes no lock")

    pl = sub.add_parser("plan", help="show everything a build of --target reads and produces (no network)",
                        description="Print bases with digests, source commit, versions, build args, locks "
                                    "and the output reference. Reads only the matrix and local files.")
    _globals(pl, top=False)

    b = sub.add_parser("build", help="build, push and record --target (the default command)",
                       description="Check the committed Dockerfile and locks, fetch the pinned source, "
                                   "assemble a hermetic context, build and push with buildx, confirm the "
                                   "registry serves the digest, and record it in locks/<target>/image.json.")
    _globals(b, top=False)
    _build_options(b, top=False)

    t = sub.add_parser("test", help="run the image checks (testinfra) on --target's recorded image or --image",
                       description="Check an image against the matrix: CUDA version, no other CUDA major, "
                                   "compiled modules and ops, pinned versions, expiry and labels, contents "
                                   "equal to the lock, pip check, non-root. Writes a JUnit report.")
    _globals(t, top=False)
    t.add_argument("--image", help="image reference to check (default: the digest in locks/<target>/image.json)")

    v = sub.add_parser("verify", help="check the audit chain: matrix, Dockerfile, locks, image.json, SBOM, provenance",
                       description="Offline by default: matrix <-> rendered Dockerfile <-> lock <-> image.json <-> "
                                   "SBOM <-> provenance, one row per link. --registry also checks the registry "
                                   "serves the recorded digest (and the tag points at it) and that the SBOM and "
                                   "provenance attached to it equal the committed files. Exit 0 only if all hold.")
    _globals(v, top=False)
    v.add_argument("--registry", action="store_true", help="also check the registry")

    rp = sub.add_parser("reproduce", help="rebuild the recorded image with no cache and compare digests",
                        description="Rebuild --target from the committed records with no cache, push it as "
                                    "<tag>-reproduce and compare with the recorded digest. On a difference, "
                                    "report config fields, then layer by layer and file by file.")
    _globals(rp, top=False)
    rp.add_argument("--builder", default=None, help="buildx builder to use")

    tr = sub.add_parser("track", help="follow --target's branch: move the commit pin when the branch moved",
                        description="Resolve refs/heads/<branch> with ls-remote (no clone). When it moved past the "
                                    "pin, update targets.<t>.source.commit in the matrix (that line only; comments "
                                    "and order kept), re-render the Dockerfile and list the commits in between. "
                                    "An unreachable remote, a deleted branch, a rewritten (force-pushed) history "
                                    "or a file:// URL without K3_ALLOW_FILE_URLS=1: exit 2, matrix untouched.")
    _globals(tr, top=False)
    tr.add_argument("--check", action="store_true", help="change nothing; exit 1 when the pin is behind, 0 when current")

    dr = sub.add_parser("doctor", help="can this image start on this host's driver? which route applies?",
                        description="Read the host's driver (nvidia-smi, or a captured --nvidia-smi-file in the "
                                    "table or -q format) and the image's CUDA version (labels, env), and say in one "
                                    "line whether it can start and why: minimum driver per CUDA release, "
                                    "minor-version compatibility within a major, forward compatibility only on "
                                    "data-center GPUs. Also reports an expired image. Exit 0 compatible, "
                                    "1 incompatible, 2 bad input.")
    _globals(dr, top=False)
    dr.add_argument("--image", help="image reference (default: --target's recorded image)")
    dr.add_argument("--nvidia-smi-file", type=Path, help="captured `nvidia-smi` or `nvidia-smi -q` output")

    ev = sub.add_parser("evidence", help="save host, engine, image and container state before changing anything",
                        description="Collect date -u, nvidia-smi (or its absence), docker version and info, image "
                                    "inspect, vLLM version and source from labels, the environment sorted with "
                                    "secrets redacted, and a container's log, into one timestamped tar.gz with a "
                                    "manifest of what was captured and what was missing. Works with no GPU, no "
                                    "nvidia-smi and no Docker.")
    _globals(ev, top=False)
    ev.add_argument("--image", help="image reference to inspect")
    ev.add_argument("--container", help="container whose log to capture")
    ev.add_argument("--out", type=Path, required=True, help="directory for the archive")
    ev.add_argument("--nvidia-smi-file", type=Path, help="captured nvidia-smi output instead of running it")

    cp = sub.add_parser("compare", help="package-by-package diff of --target's image against a reference image",
                        description="Python distributions, OS packages, CUDA version and labels of our image "
                                    "(--target's recorded one, or --image) against --against REF.")
    _globals(cp, top=False)
    cp.add_argument("--against", required=True, help="the reference image, e.g. vllm/vllm-openai:kimi-k3")
    cp.add_argument("--image", help="our image (default: --target's recorded image)")

    sm = sub.add_parser("smoke-init", help="make the smoke target's bases, source repo and matrix (demo/tests)",
                        description="Create the smoke target on this machine: Debian 12 base images "
                                    "(debootstrap) pushed to --registry and pinned by digest, a git "
                                    "repository of the stand-in source, and OUT/matrix.yaml.")
    sm.add_argument("--out", type=Path, default=Path("artifacts/smoke"), help="where to write (default: artifacts/smoke)")
    sm.add_argument("--registry", default="127.0.0.1:5000", help="registry for the bases and the image")
    sm.add_argument("--repository", default="k3/smoke", help="repository of the smoke image (default: k3/smoke)")
    return p


def _build_options(parser: argparse.ArgumentParser, top: bool) -> None:
    default = (lambda v: v) if top else (lambda v: argparse.SUPPRESS)
    parser.add_argument("--no-cache", action="store_true", default=default(False),
                        help="build without the engine's layer cache")
    parser.add_argument("--builder", default=default(None), help="buildx builder to use (default: the current one)")
    parser.add_argument("--max-jobs", type=int, default=default(None),
                        help="override MAX_JOBS for the compile (default: derived from the builder's memory)")
    parser.add_argument("--no-checks", action="store_true", default=default(False),
                        help="skip the image checks after the push (they run by default)")
    parser.add_argument("--force", action="store_true", default=default(False),
                        help="build even when the inputs equal the recorded ones and the registry serves the image")
    parser.add_argument("--cache-from", action="append", default=default([]), metavar="SPEC",
                        help="buildx cache source, repeatable (a bare image ref means type=registry,ref=REF)")
    parser.add_argument("--cache-to", default=default(None), metavar="SPEC",
                        help="buildx cache export, e.g. type=inline (docker driver) or "
                             "type=registry,ref=REF,mode=max / type=local,dest=DIR (docker-container)")
    parser.add_argument("--secret", action="append", default=default([]), metavar="id=ID,env=VAR|src=FILE",
                        help="a BuildKit secret for an id the matrix lists in compile.secrets (repeatable); "
                             "its value is never logged, labelled or recorded")
    parser.add_argument("--jobs", type=int, default=default(1),
                        help="build this many targets at once (with several --target); one summary")


def _targets(matrix: Matrix, name) -> list[str]:
    if isinstance(name, list):
        for n in name:
            matrix.target(n)
        return name
    if name is None:
        return sorted(matrix.targets)
    matrix.target(name)  # raises with a "did you mean"
    return [name]


def _need_target(args: argparse.Namespace, command: str) -> str:
    if not args.target:
        raise ConfigError(f"{command}: --target is required (e.g. `build {command} --target cu129`)")
    if isinstance(args.target, list):
        raise ConfigError(f"{command}: takes one --target (got {', '.join(args.target)})")
    return args.target


def cmd_render(args: argparse.Namespace, out: Output) -> int:
    matrix = load(args.matrix)
    names = _targets(matrix, args.target)
    rendered = {n: render.render(matrix.target(n)) for n in names}  # all rendered before any write
    drift = []
    out.data["dockerfiles"] = {}
    for name, text in rendered.items():
        path = render.output_path(args.matrix, name)
        current = path.read_text() if path.exists() else None
        if current == text:
            log.info(f"{path}: up to date")
            out.data["dockerfiles"][name] = "up to date"
            continue
        if args.check:
            drift.append(f"{path}: {'missing' if current is None else 'differs from what the matrix renders'}")
            out.data["dockerfiles"][name] = "missing" if current is None else "differs"
            continue
        atomic_write(path, text)
        log.info(f"{path}: written")
        out.data["dockerfiles"][name] = "written"
    if drift:
        for line in drift:
            log.info(line)
        raise DriftError(f"{len(drift)} Dockerfile(s) out of date; run `build render` and commit the result")
    return 0


def cmd_lock(args: argparse.Namespace, out: Output) -> int:
    from builder.pipeline import Plan, lock_target, rehearse_lock

    plan = Plan.of(load(args.matrix), _need_target(args, "lock"))
    if args.rehearse:
        result = rehearse_lock(plan)
        log.info(f"REHEARSAL ({result.source}): resolved {result.entries} entries against PyPI only; "
                 "the real lock still needs the real indexes")
        for sub in result.substitutions:
            log.info(f"    substituted  {sub.line()}")
        for finding in result.findings:
            log.info(f"    {finding.line()}")
        log.info(f"    report: {result.report}")
        out.data["rehearsal"] = result.to_json()
        if not result.ok:
            raise CheckFailed(f"{plan.target.name}: the rehearsal found distributions of another CUDA major with no "
                              "reason in cuda.other_major (see above)")
        out.line(str(result.report))
        return 0
    written = lock_target(plan)
    for path in written.values():
        log.info(f"{path}: written")
    out.data["locks"] = {kind: str(path) for kind, path in written.items()}
    return 0


def cmd_plan(args: argparse.Namespace, out: Output) -> int:
    from builder.pipeline import Plan

    matrix = load(args.matrix)
    plan = Plan.of(matrix, _need_target(args, "plan"))
    width = max(len(k) for k, _ in plan.rows())
    for key, value in plan.rows():
        out.line(f"{key.ljust(width)}  {value}")
    out.data["plan"] = dict(plan.rows())
    return 0


def cmd_build(args: argparse.Namespace, out: Output) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from builder.engine import Engine
    from builder.pipeline import Plan, build

    matrix = load(args.matrix)
    names = args.target if isinstance(args.target, list) else [_need_target(args, "build")]
    plans = [Plan.of(matrix, name) for name in names]  # every name checked before anything runs
    if args.jobs < 1:
        raise ConfigError(f"--jobs: must be at least 1 (got {args.jobs})")
    secrets = _secrets(args.secret, plans)
    engine = Engine()

    def one(plan):
        return build(plan, engine, no_cache=args.no_cache, builder=args.builder, max_jobs_override=args.max_jobs,
                     run_checks=not args.no_checks, force=args.force, cache_from=tuple(args.cache_from),
                     cache_to=args.cache_to, secrets=secrets)

    if len(plans) == 1:
        outcomes, errors = [one(plans[0])], []
    else:
        # Several targets: per-target logs under artifacts/<target>/<build-id>/, one summary.
        log.quiet_build_output(True)
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = [(p.target.name, pool.submit(one, p)) for p in plans]
        outcomes, errors = [], []
        for name, future in futures:
            try:
                outcomes.append(future.result())
            except BuilderError as exc:
                errors.append((name, exc))
    rows = []
    for o in outcomes:
        status = "up to date" if o.up_to_date else "pushed" if o.changed else "pushed (same digest)"
        size = f"{o.size / 1e6:.1f} MB" if o.size else "-"
        rows.append(log.SummaryRow(o.image.split("@")[0], o.digest, size, o.seconds, status))
        if o.log:
            log.info(f"{o.target}: recorded in {o.record}; log in {o.log}")
    for name, exc in errors:
        rows.append(log.SummaryRow(name, "-", "-", 0.0, f"FAILED: {exc.message[:80]}"))
    log.summary(rows)
    for o in outcomes:
        out.line(o.image)
    out.data["builds"] = [{"target": o.target, "image": o.image, "digest": o.digest, "size": o.size,
                           "seconds": round(o.seconds, 2),
                           "status": "up to date" if o.up_to_date else "pushed", "log": str(o.log) if o.log else None}
                          for o in outcomes]
    out.data["errors"] = [{"target": name, "error": log.redact(exc.message)} for name, exc in errors]
    if errors:
        worst = max(errors, key=lambda e: e[1].exit_code)[1]
        raise worst
    return 0


def _secrets(specs: list[str], plans) -> tuple[str, ...]:
    """Check --secret specs against the matrix and register their values for redaction."""
    import os

    wanted = {sid for p in plans for sid in p.target.compile.secrets}
    given = {}
    for spec in specs:
        fields = dict(item.split("=", 1) for item in spec.split(",") if "=" in item)
        sid = fields.get("id", "")
        if sid not in wanted:
            raise ConfigError(f"--secret: id {sid!r} is not in compile.secrets of the target(s) "
                              f"({', '.join(sorted(wanted)) or 'none'})")
        if "env" in fields:
            value = os.environ.get(fields["env"])
            if value is None:
                raise ConfigError(f"--secret {sid}: environment variable {fields['env']} is not set")
        elif "src" in fields:
            try:
                value = Path(fields["src"]).read_text()
            except OSError as exc:
                raise ConfigError(f"--secret {sid}: cannot read {fields['src']}: {exc.strerror}") from None
        else:
            raise ConfigError(f"--secret {sid}: give env=VAR or src=FILE")
        log.register_secret(value.strip())
        given[sid] = spec
    missing = sorted(wanted - set(given))
    if missing:
        raise ConfigError(f"--secret: the matrix needs {', '.join(missing)}; pass --secret id=ID,env=VAR")
    return tuple(given[k] for k in sorted(given))


def cmd_test(args: argparse.Namespace, out: Output) -> int:
    import datetime as dt

    from builder import checks, records
    from builder.engine import Engine
    from builder.pipeline import Plan

    matrix = load(args.matrix)
    plan = Plan.of(matrix, _need_target(args, "test"))
    target = plan.target
    record = records.read(contract.record_path(plan.root, target.name))
    ref = _recorded_image(args, "test")
    lock.read_entries(plan.locks["runtime"])
    engine = Engine()
    with log.step(f"{target.name}: engine preflight"):
        engine.preflight()
    with log.step(f"{target.name}: fetch source {target.source.branch} @ {target.source.commit[:12]}"):
        pinned = source.fetch(target.source)
    recorded = record is not None and ref == record.image
    build_date = dt.date.fromisoformat(record.build["finished"][:10]) if recorded else dt.date.today()
    out_dir = plan.root / contract.ARTIFACTS_DIR / target.name / ("test-" + dt.datetime.now(dt.timezone.utc)
                                                                  .strftime("%Y%m%dT%H%M%SZ"))
    with log.step(f"{target.name}: image checks on {ref}"):
        report = checks.check_target(engine, target, plan.locks["runtime"], pinned, ref, build_date, out_dir)
    out.data.update(report.to_json())
    report.raise_for_failures()
    out.line(ref)
    return 0


def cmd_verify(args: argparse.Namespace, out: Output) -> int:
    from builder.verify import Verifier

    matrix = load(args.matrix)
    names = _targets(matrix, args.target)
    engine = None
    if args.registry:
        from builder.engine import Engine

        engine = Engine()
    failed = []
    root = args.matrix.resolve().parent
    out.data["rows"] = []
    for name in names:
        if not contract.record_path(root, name).exists() and args.target is None:
            log.info(f"{name}: not built yet (no image.json); skipped")
            continue
        for row in Verifier(root, matrix.target(name)).rows(engine):
            log.info(f"{'ok  ' if row.ok else 'FAIL'}  {name:<8} {row.check:<28} {row.detail}")
            out.data["rows"].append({"target": name, "check": row.check, "ok": row.ok, "detail": row.detail})
            if not row.ok:
                failed.append(f"{name}: {row.check}")
    if failed:
        raise VerifyFailed(f"verify failed: {'; '.join(failed)}")
    return 0


def cmd_reproduce(args: argparse.Namespace, out: Output) -> int:
    from builder.engine import Engine
    from builder.pipeline import Plan, reproduce

    matrix = load(args.matrix)
    plan = Plan.of(matrix, _need_target(args, "reproduce"))
    result = reproduce(plan, Engine(), builder=args.builder)
    out.data.update(result.to_json())
    result.raise_for_difference()
    out.line(f"{plan.target.image.name}@{result.rebuilt}")
    return 0


def _recorded_image(args: argparse.Namespace, command: str) -> str:
    from builder import records

    if getattr(args, "image", None):
        return args.image
    matrix = load(args.matrix)
    name = _need_target(args, command)
    matrix.target(name)
    record = records.read(contract.record_path(args.matrix.resolve().parent, name))
    if record is None:
        raise ConfigError(f"{command}: {name} has no recorded image; pass --image REF")
    return record.image


def cmd_doctor(args: argparse.Namespace, out: Output) -> int:
    from builder import doctor
    from builder.engine import Engine

    image = _recorded_image(args, "doctor")
    smi_text, smi_source = doctor.read_nvidia_smi(args.nvidia_smi_file)
    config = Engine().image_config(image)
    d = doctor.diagnose(smi_text, smi_source, config.labels, config.env, image)
    out.line(d.line)
    out.line(f"route: {d.route}")
    if d.expiry:
        out.line(d.expiry)
    out.data.update({"compatible": d.compatible, "verdict": d.line, "route": d.route, "expiry": d.expiry, **d.facts})
    return 0 if d.compatible else 1


def cmd_evidence(args: argparse.Namespace, out: Output) -> int:
    from builder import doctor
    from builder.engine import Engine

    path, manifest = doctor.evidence(Engine(), args.out, args.image, args.container, args.nvidia_smi_file)
    for name, why in sorted(manifest["missing"].items()):
        log.info(f"    not captured: {name}: {why}")
    log.info(f"    captured: {', '.join(manifest['captured'])}")
    out.line(str(path))
    out.data.update({"archive": str(path), **manifest})
    return 0


def cmd_compare(args: argparse.Namespace, out: Output) -> int:
    from builder.compare import compare
    from builder.engine import Engine

    ours = _recorded_image(args, "compare")
    result = compare(Engine(), ours, args.against)
    for line in result.text():
        out.line(line)
    out.data.update(result.to_json())
    return 0


def cmd_smoke_init(args: argparse.Namespace, out: Output) -> int:
    from builder import smoke
    from builder.engine import Engine

    matrix_path = smoke.init(args.out, args.registry, Engine(), repository=args.repository)
    out.line(str(matrix_path))
    out.data["matrix"] = str(matrix_path)
    return 0


def cmd_track(args: argparse.Namespace, out: Output) -> int:
    from builder.track import track

    matrix = load(args.matrix)
    name = _need_target(args, "track")
    result = track(args.matrix, matrix, name, check=args.check)
    out.data.update(result.to_json())
    if not result.moved:
        log.info(f"{name}: {result.branch} is at the pin {result.old[:12]}; nothing to do")
        out.line(f"{name}: current {result.old}")
        return 0
    log.info(f"{name}: {result.branch} moved {result.old[:12]} -> {result.new[:12]} "
             f"({len(result.subjects)} commit{'s' if len(result.subjects) != 1 else ''})")
    for subject in result.subjects:
        log.info(f"    {subject}")
    for tp, names in result.third_party_changed.items():
        log.warn(f"{name}: third-party {tp!r}: the new commit's build files no longer name the pinned ref; they "
                 f"name {', '.join(names)}: re-pin source.third_party.{tp} (ref and commit) before `build lock`")
    if args.check:
        out.line(f"{name}: behind {result.old} -> {result.new}")
        return 1
    log.info(f"{args.matrix}: targets.{name}.source.commit updated; Dockerfile re-rendered; "
             f"next: `build lock --target {name}` and `build --target {name}`")
    out.line(f"{name}: {result.old} -> {result.new}")
    return 0


COMMANDS = {"render": cmd_render, "lock": cmd_lock, "plan": cmd_plan, "build": cmd_build, "test": cmd_test,
            "verify": cmd_verify, "reproduce": cmd_reproduce, "track": cmd_track,
            "doctor": cmd_doctor, "evidence": cmd_evidence, "compare": cmd_compare,
            "smoke-init": cmd_smoke_init}


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    command = args.command or "build"
    if args.command is None and not args.target:
        parser.print_help(sys.stderr)
        sys.exit(2)
    # SIGTERM (a CI runner cancelling the job) takes the same path as Ctrl-C: the build's child is
    # stopped, the log says so, and no record is written.
    signal.signal(signal.SIGTERM, _terminate)
    out = Output(args.json)
    try:
        code = COMMANDS[command](args, out)
    except BuilderError as exc:
        # One line, always: control characters from hostile input are shown escaped.
        message = "".join(c if c.isprintable() else repr(c)[1:-1] for c in log.redact(exc.message))
        log.info(f"error: {message}")
        out.finish(exc.exit_code, exc)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        log.info("error: interrupted; records untouched")
        out.finish(130, Interrupted("interrupted; records untouched"))
        sys.exit(130)
    out.finish(code)
    sys.exit(code)


def _terminate(signum, frame):  # noqa: ARG001 - signal handler signature
    raise KeyboardInterrupt

"""`build build` (and `build` with no command): build, push and record --target, several at once
with --jobs, and one summary table."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from builder import log
from builder.commands._build_options import add_build_options, build_options
from builder.commands._common import Output, add_globals, docker_engine, targets
from builder.config.gpu import cell_runs
from builder.config.matrix import load
from builder.errors import BuilderError

if TYPE_CHECKING:
    from builder.pipeline.build import BuildOutcome

NAME = "build"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        NAME,
        help="build, push and record --target (the default command)",
        description="Check the committed Dockerfile and locks, fetch the pinned source, "
        "assemble a hermetic context, build and push with buildx, confirm the "
        "registry serves the digest, and record it in locks/<target>/image.json.",
    )
    add_globals(p)
    add_build_options(p)


def run(args: argparse.Namespace, out: Output) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from builder.pipeline.build import build
    from builder.pipeline.plan import Plan

    matrix = load(args.matrix)
    plans = [Plan.of(matrix, name) for name in targets(matrix, args.target)]
    options = build_options(args, plans)
    engine = docker_engine()
    outcomes: list[BuildOutcome] = []
    errors: list[tuple[str, BuilderError]] = []
    if len(plans) == 1:
        outcomes.append(build(plans[0], engine, options))
    else:
        # Several targets: per-target logs under artifacts/<target>/<build-id>/, one summary.
        log.quiet_build_output(True)
        with ThreadPoolExecutor(max_workers=options.jobs) as pool:
            futures = [(p.target.name, pool.submit(build, p, engine, options)) for p in plans]
        for name, future in futures:
            try:
                outcomes.append(future.result())
            except BuilderError as exc:
                errors.append((name, exc))
    summarize(outcomes, errors, out)
    if errors:
        raise max((e for _, e in errors), key=lambda e: e.exit_code)
    return 0


def summarize(outcomes: list[BuildOutcome], errors: list[tuple[str, BuilderError]], out: Output) -> None:
    """The summary table on stderr, each image on stdout, and the builds in the JSON document."""
    rows = []
    for o in outcomes:
        status = "up to date" if o.up_to_date else "pushed" if o.changed else "pushed (same digest)"
        if o.cache and o.cache.hit_rate is not None:
            status += f", compile cache {o.cache.hits}/{o.cache.hits + o.cache.misses} hits"
        if o.cache and o.cache.backend_unreachable:
            status += " (cache backend unreachable)"
        if o.gpu:
            status += f", {gpu_summary(o.gpu)}"
        size = f"{o.size / 1e6:.1f} MB" if o.size else "-"
        rows.append(log.SummaryRow(o.image.split("@")[0], o.digest, size, o.seconds, status))
        for p in o.platforms:  # an image index: each platform's manifest under it
            state = "up to date" if p.up_to_date else "pushed" if p.changed else "pushed (same digest)"
            size = f"{p.size / 1e6:.1f} MB" if p.size else "-"
            rows.append(log.SummaryRow(f"  {p.platform}", p.digest, size, p.seconds, state))
        if o.log:
            log.info(f"{o.target}: recorded in {o.record}; log in {o.log}")
    for name, exc in errors:
        rows.append(log.SummaryRow(name, "-", "-", 0.0, f"FAILED: {exc.message[:80]}"))
    log.summary(rows)
    for o in outcomes:
        out.line(o.image)
    out.data["builds"] = [_build_doc(o) for o in outcomes]
    out.data["errors"] = [{"target": name, "error": log.redact(exc.message)} for name, exc in errors]


def gpu_summary(gpu: dict) -> str:
    """The record's gpu in a few words: the derived floor against the claim, the families covered."""
    coverage = gpu.get("coverage") or {}
    cells = [how for row in coverage.values() for how in row.values()]
    served = sum(cell_runs(how) for how in cells)
    derived = gpu.get("derived_floor") or "none"
    return (
        f"GPU floor {derived} (CUDA {gpu.get('derived_cuda')}) <= {gpu.get('driver_floor')}, "
        f"{' '.join(gpu.get('families', []))}: {served}/{len(cells)} extension x family served"
    )


def _build_doc(o: BuildOutcome) -> dict:
    return {
        "target": o.target,
        "image": o.image,
        "digest": o.digest,
        "size": o.size,
        "seconds": round(o.seconds, 2),
        "status": "up to date" if o.up_to_date else "pushed",
        "compile_cache": o.cache.__dict__ if o.cache else None,
        "gpu": o.gpu,
        "log": str(o.log) if o.log else None,
        **({"platform": o.platform} if o.platform else {}),
        **({"platforms": [_build_doc(p) for p in o.platforms]} if o.platforms else {}),
    }

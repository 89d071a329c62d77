"""`build lock`: resolve and hash-lock a target's dependencies; --rehearse against PyPI only."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from builder import log
from builder.commands._common import Output, add_globals, docker_engine, per_target
from builder.errors import CheckFailed

if TYPE_CHECKING:
    from builder.pipeline.plan import Plan

NAME = "lock"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        NAME,
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
    add_globals(p)
    p.add_argument(
        "--rehearse",
        action="store_true",
        help="resolve against PyPI only, as a rehearsal of the real lock; writes no lock",
    )


def run(args: argparse.Namespace, out: Output) -> int:
    return per_target(args, out, lambda plan, o: _lock(plan, o, args.rehearse))


def _lock(plan: Plan, out: Output, rehearse: bool) -> int:
    from builder.pipeline.build import lock_target, rehearse_lock

    if not rehearse:
        written = lock_target(plan, docker_engine)
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

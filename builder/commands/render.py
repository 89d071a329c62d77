"""`build render`: every target's Dockerfile (or --target's) from the matrix; --check for drift."""

from __future__ import annotations

import argparse

from builder import log
from builder.commands._common import Output, add_globals, targets
from builder.config.matrix import load
from builder.errors import DriftError

NAME = "render"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        NAME,
        help="render dockerfiles/<target>/Dockerfile from the matrix",
        description="Render every target's Dockerfile (or --target's) from the matrix "
        "into dockerfiles/<target>/Dockerfile beside the matrix.",
    )
    add_globals(p)
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if a committed Dockerfile differs from what the matrix renders",
    )


def run(args: argparse.Namespace, out: Output) -> int:
    from builder.pipeline.build import render_all

    matrix = load(args.matrix)
    status = render_all(matrix, targets(matrix, args.target), check=args.check)
    out.data["dockerfiles"] = status
    drift = [n for n, s in status.items() if s not in ("up to date", "written")]
    for name, state in status.items():
        log.info(f"{args.matrix.resolve().parent / 'dockerfiles' / name / 'Dockerfile'}: {state}")
    if drift:
        raise DriftError(
            f"{len(drift)} Dockerfile(s) out of date ({', '.join(drift)}); run `build render` and commit the result"
        )
    return 0

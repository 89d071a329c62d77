"""`build prune`: remove old build and test directories under artifacts/."""

from __future__ import annotations

import argparse

from builder import log
from builder.commands._common import Output, add_globals, targets
from builder.config.matrix import load
from builder.errors import ConfigError

NAME = "prune"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        NAME,
        help="remove old build and test directories under artifacts/",
        description="Keep the newest --keep build directories and --keep test directories of "
        "each target (all targets unless --target) under artifacts/<target>/; "
        "remove the rest. Builds already drop their context/source copies.",
    )
    add_globals(p)
    p.add_argument("--keep", type=int, default=5, help="how many of each kind to keep per target (default 5)")


def run(args: argparse.Namespace, out: Output) -> int:
    from builder.pipeline.build import prune

    if args.keep < 0:
        raise ConfigError(f"--keep: must be 0 or more (got {args.keep})")
    matrix = load(args.matrix)
    removed = prune(args.matrix.resolve().parent, targets(matrix, args.target), args.keep)
    for path in removed:
        log.info(f"removed {path}")
    out.data["removed"] = [str(p) for p in removed]
    out.line(f"removed {len(removed)} director{'y' if len(removed) == 1 else 'ies'}")
    return 0

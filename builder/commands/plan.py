"""`build plan`: everything a build of --target reads and produces, from local files only."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from builder.commands._common import Output, add_globals, per_target

if TYPE_CHECKING:
    from builder.pipeline.plan import Plan

NAME = "plan"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        NAME,
        help="show everything a build of --target reads and produces (no network)",
        description="Print bases with digests, source commit, versions, build args, locks "
        "and the output reference. Reads only the matrix and local files.",
    )
    add_globals(p)


def run(args: argparse.Namespace, out: Output) -> int:
    return per_target(args, out, _show)


def _show(plan: Plan, out: Output) -> int:
    width = max(len(k) for k, _ in plan.rows())
    for key, value in plan.rows():
        out.line(f"{key:<{width}}  {value}")
    out.data["plan"] = plan.to_json()
    return 0

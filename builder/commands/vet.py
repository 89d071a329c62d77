"""`build vet`: the image checks that need none of this pipeline's records, on any image, as a
scorecard (builder/checks/vet.py); exit 0 fit for the target's hosts, 1 not fit."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from builder import log
from builder.commands._common import Output, add_globals, docker_engine
from builder.errors import ConfigError
from builder.fsutil import written

if TYPE_CHECKING:
    from builder.checks.vet import Scorecard

NAME = "vet"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        NAME,
        help="the image checks on any image (upstream's, say): a pass/fail/n/a scorecard for --target's hosts",
        description="Run every image check that needs none of this pipeline's labels, lock or record on any "
        "image, by digest, with the expectations of --target in the matrix (CUDA version, GPU families and "
        "driver floor, ops, recipe, pins): the CUDA runtime and other majors, shared libraries, Python trees, "
        "compiled modules and ops, the recipe CLI, the GPU code, the run-time toolchain, pip check, hygiene. "
        "The checks that need our records are rows 'n/a'; advisory rows (hardening) are shown but do not "
        "decide. Default --image: the target's `reference` (upstream's image). Exit 0 fit for the target's "
        "hosts, 1 not fit, 2 bad input, 3 engine or registry out of reach.",
    )
    add_globals(p)
    p.add_argument("--image", help="the image to vet (default: --target's `reference` in the matrix)")
    p.add_argument(
        "--prefix",
        metavar="DIR",
        help="where the image's Python environment lives (default: its interpreter's sys.prefix, or its "
        "site-packages when that is the system's /usr)",
    )
    p.add_argument(
        "--format",
        choices=("text", "markdown"),
        default="text",
        help="markdown: a table for $GITHUB_STEP_SUMMARY (appended there when set)",
    )
    p.add_argument(
        "--no-source",
        action="store_true",
        help="do not fetch the pinned source: the compiled modules are those the matrix adds (n/a if none)",
    )
    p.add_argument(
        "--decision",
        type=Path,
        metavar="RECORD.json",
        help="add the scorecard to a decision record `build doctor --record` wrote (its .json and .md)",
    )


def show(card: Scorecard, fmt: str, o: Output) -> None:
    if fmt == "markdown":
        o.line(card.markdown())
        log.step_summary(card.markdown())
    else:
        for line in card.text():
            o.line(line)


def run(args: argparse.Namespace, out: Output) -> int:
    from builder.checks.vetrun import VetParams, default_image, pick_target, vet_one
    from builder.config.matrix import load
    from builder.host.doctor import amend_decision

    matrix = load(args.matrix)
    target = pick_target(matrix, args.target, args.image)
    image = default_image(target, args.image)
    if args.decision is not None and not args.decision.is_file():
        raise ConfigError(f"--decision {args.decision}: no such decision record")
    engine = docker_engine()
    card = vet_one(engine, args.matrix.parent, target, image, VetParams(no_source=args.no_source, prefix=args.prefix))
    show(card, args.format, out)
    out.data.update(card.to_json())
    if args.decision is not None:
        record = card.to_json()
        js, md = written(
            lambda: amend_decision(args.decision, "--decision", "vet", record), f"--decision {args.decision}"
        )
        out.line(f"record: {md}")
        out.data["record"] = str(md)
    return 0 if card.fit else 1

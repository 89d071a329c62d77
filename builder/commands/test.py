"""`build test`: the image checks (pytest, in a hardened container) on --target's recorded image or on --image."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from builder.commands._common import Output, add_globals, docker_engine, per_target
from builder.errors import ConfigError

if TYPE_CHECKING:
    from builder.pipeline.plan import Plan

NAME = "test"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        NAME,
        help="run the image checks (pytest, in a hardened container) on --target's recorded image or --image",
        description="Check an image against the matrix: CUDA version, no other CUDA major, "
        "compiled modules and ops, pinned versions, expiry and labels, contents "
        "equal to the lock, pip check, non-root. Writes a JUnit report.",
    )
    add_globals(p)
    p.add_argument("--image", help="image reference to check (default: the digest in locks/<target>/image.json)")


def run(args: argparse.Namespace, out: Output) -> int:
    from builder.config import contract
    from builder.engine.buildx import image_config
    from builder.pipeline.build import test

    engine = docker_engine()
    if args.image and not args.target:  # the image's own label says which target it is
        labels = image_config(engine, args.image).labels
        key = contract.keys_in(labels).target
        label = labels.get(key)
        if not label:
            raise ConfigError(f"test: {args.image} has no {key} label; pass --target")
        args.target = [label]

    def one(plan: Plan, o: Output) -> int:
        reports = test(plan, engine, args.image)
        if len(reports) == 1 and not plan.target.platforms:
            o.data.update(reports[0].to_json())
        else:  # an image index: one report per platform, in the matrix's order
            names = plan.target.platform_names()
            o.data["platforms"] = [{"platform": p, **r.to_json()} for p, r in zip(names, reports, strict=True)]
        for r in reports:
            o.line(r.image)
        return 0

    return per_target(args, out, one)

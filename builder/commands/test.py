"""`build test`: the image checks (pytest, in a hardened container) on --target's recorded image or on --image."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from builder import log
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
        "equal to the lock, pip check, non-root. Writes a JUnit report. Of a target built into an "
        "image index, every platform's image is checked; --platform checks one (and --image may "
        "then be that platform's image alone, not an index).",
    )
    add_globals(p)
    p.add_argument("--image", help="image reference to check (default: the digest in locks/<target>/image.json)")
    p.add_argument(
        "--platform",
        action="append",
        default=argparse.SUPPRESS,  # `build --platform P test` (the top-level option) counts too
        metavar="OS/ARCH",
        help="of a target built into an image index, check only this platform's image: the index's "
        "manifest for it, or --image one image of this platform (a plain manifest)",
    )


def _platform(args: argparse.Namespace) -> str | None:
    """--platform, read before anything is contacted: one platform, one a target can name."""
    from builder.config import platforms

    given = list(getattr(args, "platform", None) or [])
    if len(given) > 1:
        raise ConfigError(f"test: --platform {', '.join(given)}: check one platform at a time")
    return platforms.flag(given[0]) if given else None


def run(args: argparse.Namespace, out: Output) -> int:
    from builder.config import contract
    from builder.engine.buildx import image_config
    from builder.pipeline.build import test

    platform = _platform(args)
    engine = docker_engine()
    if args.image and not args.target:  # the image's own label says which target it is
        labels = image_config(engine, args.image, platform.split("/")[1] if platform else None).labels
        key = contract.keys_in(labels).target
        label = labels.get(key)
        if not label:
            raise ConfigError(f"test: {args.image} has no {key} label; pass --target")
        args.target = [label]

    def one(plan: Plan, o: Output) -> int:
        names = list(plan.target.platform_names())
        if platform:  # one platform of the target: said before the checks, so a failure says it too
            others = ", ".join(p for p in names if p != platform)
            log.info(
                f"{plan.target.name}: checking its {platform} image alone"
                + (f"; {others} not checked" if others else "")
            )
        reports = test(plan, engine, args.image, platform)
        if platform:  # the report names the platform checked and the target's others
            o.data.update({"platform": platform, "target_platforms": names, **reports[0].to_json()})
        elif len(reports) == 1 and not plan.target.platforms:
            o.data.update(reports[0].to_json())
        else:  # an image index: one report per platform, in the matrix's order
            o.data["platforms"] = [{"platform": p, **r.to_json()} for p, r in zip(names, reports, strict=True)]
        for r in reports:
            o.line(r.image)
        return 0

    return per_target(args, out, one)

"""`build compare`: --target's image against a reference image, package by package."""

from __future__ import annotations

import argparse

from builder import log
from builder.commands._common import Output, add_globals, docker_engine, on_images
from builder.errors import ConfigError

NAME = "compare"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        NAME,
        help="package-by-package diff of --target's image against a reference image",
        description="Python distributions, OS packages, CUDA version and labels of our image "
        "(--target's recorded one, or --image) against --against REF.",
    )
    add_globals(p)
    p.add_argument(
        "--against",
        help="the reference image, e.g. vllm/vllm-openai:kimi-k3 (default: --target's `reference` in the matrix)",
    )
    p.add_argument("--image", help="our image (default: --target's recorded image)")
    p.add_argument(
        "--format",
        choices=("text", "markdown"),
        default="text",
        help="markdown: a table for $GITHUB_STEP_SUMMARY (appended there when set)",
    )
    p.add_argument("--all", action="store_true", help="list every difference after the summary")
    p.add_argument(
        "--vet",
        action="store_true",
        help="also run `build vet` on both images for --target and show the two scorecards side by side",
    )
    p.add_argument("--no-source", action="store_true", help="with --vet: as `build vet --no-source`")


def run(args: argparse.Namespace, out: Output) -> int:
    from builder.host.compare import compare

    engine = docker_engine()
    against = args.against or _reference(args)

    def one(image: str, o: Output) -> int:
        result = compare(engine, image, against)
        if args.vet:
            result.vet = _scorecards(engine, args, image, against)
        if args.format == "markdown":
            o.line(result.markdown())
            log.step_summary(result.markdown())
        else:
            for line in result.text() if args.all else result.summary():
                o.line(line)
        o.data.update(result.to_json())
        return 0

    return on_images(args, out, one)


def _reference(args: argparse.Namespace) -> str:
    from builder.checks.vetrun import default_image, pick_target
    from builder.config.matrix import load

    if not args.target:
        raise ConfigError("compare: pass --against REF, or --target whose `reference` the matrix names")
    return default_image(pick_target(load(args.matrix), args.target, None), None)


def _scorecards(engine, args: argparse.Namespace, ours: str, reference: str) -> dict:
    """`build vet` on both images for --target, side by side (builder/host/compare.py)."""
    from builder.checks.vetrun import VetParams, pick_target, vet_one
    from builder.config.matrix import load
    from builder.host.compare import side_by_side

    target = pick_target(load(args.matrix), args.target, None)
    params = VetParams(no_source=args.no_source)
    cards = [vet_one(engine, args.matrix.parent, target, image, params).to_json() for image in (ours, reference)]
    return side_by_side(*cards)

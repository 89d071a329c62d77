"""`build compare`: --target's image against a reference image, package by package."""

from __future__ import annotations

import argparse
import os

from builder.commands._common import Output, add_globals, docker_engine, on_images

NAME = "compare"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        NAME,
        help="package-by-package diff of --target's image against a reference image",
        description="Python distributions, OS packages, CUDA version and labels of our image "
        "(--target's recorded one, or --image) against --against REF.",
    )
    add_globals(p)
    p.add_argument("--against", required=True, help="the reference image, e.g. vllm/vllm-openai:kimi-k3")
    p.add_argument("--image", help="our image (default: --target's recorded image)")
    p.add_argument(
        "--format",
        choices=("text", "markdown"),
        default="text",
        help="markdown: a table for $GITHUB_STEP_SUMMARY (appended there when set)",
    )
    p.add_argument("--all", action="store_true", help="list every difference after the summary")


def run(args: argparse.Namespace, out: Output) -> int:
    from builder.host.compare import compare

    engine = docker_engine()

    def one(image: str, o: Output) -> int:
        result = compare(engine, image, args.against)
        if args.format == "markdown":
            o.line(result.markdown())
            summary = os.environ.get("GITHUB_STEP_SUMMARY")
            if summary:
                with open(summary, "a", encoding="utf-8") as fh:
                    fh.write(result.markdown())
        else:
            for line in result.text() if args.all else result.summary():
                o.line(line)
        o.data.update(result.to_json())
        return 0

    return on_images(args, out, one)

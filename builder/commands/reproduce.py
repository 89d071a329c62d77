"""`build reproduce`: rebuild the recorded image with no cache and compare the digests."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from builder.commands._build_options import add_build_options, build_options
from builder.commands._common import Output, add_globals, docker_engine, per_target

if TYPE_CHECKING:
    from builder.pipeline.plan import Plan

NAME = "reproduce"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        NAME,
        help="rebuild the recorded image with no cache and compare digests",
        description="Rebuild --target from the committed records with no cache, push it as "
        "<tag>-reproduce and compare with the recorded digest. A target built into an image "
        "index is reproduced platform by platform (--platform), each from locks/<target>/<os>-<arch>/, "
        "pushed as <tag>-<os>-<arch>-reproduce. On a difference, "
        "report config fields, then layer by layer and file by file. Takes the build "
        "options (--secret for targets that need one, --builder, ...).",
    )
    add_globals(p)
    add_build_options(p)
    p.add_argument(
        "--from-escrow",
        metavar="REF",
        help="rebuild from the escrow REF that `build escrow` printed, with no network but its registry: "
        "its manifest's signature checked, every input downloaded with its digest checked into "
        "artifacts/<target>/escrow/ (a wrong digest or a missing input: exit 2, nothing written), then the "
        "sources, wheels, .debs and CPython read from there through a fresh cache of the run's own and the "
        "bases pulled by digest from REF's repository; the digests compared as without it",
    )


def run(args: argparse.Namespace, out: Output) -> int:
    from builder.config.inputsource import UPSTREAM
    from builder.pipeline.build import reproduce_all

    engine = docker_engine()

    def one(plan: Plan, o: Output, inputs=UPSTREAM) -> int:
        results = reproduce_all(plan, engine, build_options(args, [plan]), inputs)
        if plan.indexed:  # each platform from its own record set
            o.data["platforms"] = [r.to_json() for r in results]
        else:
            o.data.update(results[0].to_json())
        for result in results:
            result.raise_for_difference()
        for result in results:
            o.line(f"{plan.target.image.name}@{result.rebuilt}")
        return 0

    if getattr(args, "from_escrow", None):
        return _from_escrow(args, out, one)
    return per_target(args, out, one)


def _from_escrow(args: argparse.Namespace, out: Output, one) -> int:
    """The escrow downloaded and checked, a fresh cache filled from it, then the same reproduce."""
    import tempfile
    from pathlib import Path

    from builder import log
    from builder.config import contract
    from builder.config.matrix import load
    from builder.errors import ConfigError
    from builder.escrow import offline
    from builder.escrow.fetch import download
    from builder.pipeline.plan import Plan

    matrix = load(args.matrix)
    if len(args.target) != 1:
        raise ConfigError("reproduce --from-escrow: name one --target (the escrow manifest names its target)")
    target = matrix.target(args.target[0])
    root = matrix.path.resolve().parent
    dest = root / contract.ARTIFACTS_DIR / target.name / "escrow"
    ref = args.from_escrow
    # The escrow held to the checkout's record before its inputs are downloaded: another build's is refused.
    escrowed = download(ref, target, root, dest, check=lambda e: offline.held(ref, e, target, root))
    log.info(f"downloaded {len(escrowed.entries)} inputs of {escrowed.digest[:19]}, each digest checked, into {dest}")
    out.data.update({"escrow": args.from_escrow, "downloaded": str(dest), "inputs": len(escrowed.entries)})
    # The run's own cache, empty: nothing this machine cached or mirrored before is read.
    with tempfile.TemporaryDirectory(prefix=".cache.", dir=dest.parent) as cache:
        inputs = offline.inputs(args.from_escrow, dest, escrowed, target, root, Path(cache))
        return one(Plan.of(matrix, target.name), out, inputs)

"""`build vet`: the image checks that need none of this pipeline's records, on any image, as a
scorecard (builder/checks/vet.py); exit 0 fit for the target's hosts, 1 not fit."""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path
from secrets import token_hex
from typing import TYPE_CHECKING

from builder import log
from builder.commands._common import Output, add_globals, docker_engine, written
from builder.config.imageref import names_registry_host
from builder.errors import BuildError, ConfigError, Unreachable, is_network_failure

if TYPE_CHECKING:
    from builder.checks.vet import Scorecard
    from builder.config.matrix import Matrix, Target
    from builder.engine.buildx import Engine

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


def pick_target(matrix: Matrix, names: list[str], image: str | None) -> Target:
    """--target; else the target whose reference is --image; else the matrix's only target."""
    if len(names) > 1:
        raise ConfigError(f"vet: one --target at a time (given {', '.join(names)})")
    if names:
        return matrix.target(names[0])
    if image:
        for t in matrix.targets.values():
            if t.reference and t.reference.image.digest in image:
                return t
    if len(matrix.targets) == 1:
        return next(iter(matrix.targets.values()))
    raise ConfigError(f"vet: pass --target (the matrix has {len(matrix.targets)} targets)")


def pin(engine: Engine, ref: str) -> str:
    """``ref`` by digest: as given when it carries one, else the digest its registry serves, else
    the local image's ID. A reference that is malformed or not served is bad input (exit 2), one
    whose registry cannot be reached is exit 3."""
    from builder.engine.buildx import image_config

    try:
        config = image_config(engine, ref)
    except BuildError as exc:  # a pull that never reached the registry (no Docker Hub here): exit 3
        if is_network_failure(exc.message):
            raise Unreachable(f"--image {ref}: out of reach: {exc.message}") from None
        if any(m in exc.message.lower() for m in ("manifest unknown", "not found", "repository does not exist")):
            raise ConfigError(f"--image {ref}: the registry does not serve it: {exc.message}") from None
        raise
    if "@sha256:" in ref:
        return ref
    if names_registry_host(ref):
        digest = engine.registry.resolve_digest(ref)
        if digest is None:
            raise ConfigError(f"--image {ref}: the registry does not serve it")
        return f"{ref}@{digest}"
    return config.id or ref


def vet_one(engine: Engine, matrix_root: Path, target: Target, image: str, args: argparse.Namespace) -> Scorecard:
    """Vet ``image`` for ``target``: pin it, fetch the source (unless --no-source), run, score."""
    from builder import log
    from builder.checks import vet
    from builder.config import contract
    from builder.source import pinned as source

    pinned_ref = pin(engine, image)
    engine.preflight()
    src, why = None, "--no-source"
    if not getattr(args, "no_source", False):
        try:
            with log.step(f"{target.name}: fetch source {target.source.branch} @ {target.source.commit[:12]}"):
                src = source.fetch(target.source)
        except Unreachable as exc:  # the checks that need it say so; the rest still run
            why = exc.message
            log.warn(f"vet: the pinned source is out of reach, compiled modules from the matrix only: {why}")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_dir = contract.artifacts_path(matrix_root, target.name, f"vet-{stamp}-{token_hex(3)}")
    with log.step(f"{target.name}: vet {pinned_ref}"):
        return vet.vet(
            engine,
            image,
            pinned_ref,
            target,
            source=src,
            out_dir=out_dir,
            prefix=getattr(args, "prefix", None),
            why_no_source=why,
        )


def default_image(target: Target, image: str | None) -> str:
    if image:
        return image
    if target.reference is None:
        raise ConfigError(f"vet: targets.{target.name}.reference is not set; pass --image")
    return target.reference.image.ref


def add_to_decision(path: Path, card: dict) -> tuple[Path, Path]:
    """The decision record at ``path`` (.json) with the scorecard under "vet"; its .md re-written."""
    from builder.host.doctor import amend_decision

    return amend_decision(path, "--decision", "vet", card)


def show(card: Scorecard, fmt: str, o: Output) -> None:
    if fmt == "markdown":
        o.line(card.markdown())
        log.step_summary(card.markdown())
    else:
        for line in card.text():
            o.line(line)


def run(args: argparse.Namespace, out: Output) -> int:
    from builder.config.matrix import load

    matrix = load(args.matrix)
    target = pick_target(matrix, args.target, args.image)
    image = default_image(target, args.image)
    if args.decision is not None and not args.decision.is_file():
        raise ConfigError(f"--decision {args.decision}: no such decision record")
    engine = docker_engine()
    card = vet_one(engine, args.matrix.parent, target, image, args)
    show(card, args.format, out)
    out.data.update(card.to_json())
    if args.decision is not None:
        js, md = written(lambda: add_to_decision(args.decision, card.to_json()), f"--decision {args.decision}")
        out.line(f"record: {md}")
        out.data["record"] = str(md)
    return 0 if card.fit else 1

"""What the commands share: the stdout document (``Output``), the options every command takes
(--matrix, --target, --json), how --target picks the targets a command runs for, and the one
Docker engine a command talks to. The build options (``build``, ``reproduce``) are in
``_build_options``; a write that fails as bad input is ``fsutil.written``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder import log
from builder.config.matrix import Matrix, load
from builder.errors import BuilderError

if TYPE_CHECKING:
    from builder.engine.buildx import DockerEngine
    from builder.pipeline.plan import Plan


class Output:
    """What a command prints on stdout: lines for people, or one JSON document with --json.

    Progress, tables and errors go to stderr either way, so stdout stays machine-readable."""

    def __init__(self, json_mode: bool) -> None:
        self.json_mode = json_mode
        self.data: dict = {}

    def line(self, text: str) -> None:
        if not self.json_mode:  # JSON escapes control characters itself
            print(log.printable(text))

    def finish(self, code: int, error: BuilderError | None = None) -> None:
        if self.json_mode:
            doc = {"ok": code == 0, "exit_code": code, **self.data}
            if error is not None:
                doc["error"] = log.redact(error.message)
            print(json.dumps(doc, indent=2, sort_keys=True, default=str))


class TargetAction(argparse.Action):
    """--target T: always a list after parsing; given again (or as a,b), several targets. A
    repeated name counts once (`--target smoke --target smoke` builds smoke once)."""

    def __call__(self, parser, namespace, values, option_string=None):
        names = [v for v in str(values).split(",") if v]
        current = getattr(namespace, self.dest, None) or []
        setattr(namespace, self.dest, list(dict.fromkeys([*current, *names])))


# (flags, add_argument keywords): "default" is the top-level parser's; the subcommands' copies
# default to SUPPRESS so a value given before the command is not reset after it.
GLOBAL_OPTIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--matrix", dict(type=Path, default=Path("matrix.yaml"), help="the build matrix (default: ./matrix.yaml)")),
    (
        "--target",
        dict(default=[], action=TargetAction, help="a target name from the matrix (repeatable for `build`)"),
    ),
    (
        "--json",
        dict(action="store_true", default=False, help="print one JSON document on stdout instead of human output"),
    ),
)


def add_options(parser: argparse.ArgumentParser, options: tuple[tuple[str, dict[str, Any]], ...], top: bool) -> None:
    for flag, keywords in options:
        parser.add_argument(flag, **(keywords if top else {**keywords, "default": argparse.SUPPRESS}))


def add_globals(parser: argparse.ArgumentParser, top: bool = False) -> None:
    """--matrix, --target and --json, which may stand before or after the command."""
    add_options(parser, GLOBAL_OPTIONS, top)


def targets(matrix: Matrix, names: list[str]) -> list[str]:
    """The named targets (each checked, with a "did you mean"), or every target when none is named."""
    for name in names:
        matrix.target(name)
    return list(names) or sorted(matrix.targets)


def per_target(args: argparse.Namespace, out: Output, body: Callable[[Plan, Output], int]) -> int:
    """Run ``body(plan, out)`` for --target, or for every target when none is named: every command
    takes --target the same way. One target: its document as it is; several: under "targets"."""
    from builder.pipeline.plan import Plan

    matrix = load(args.matrix)
    names = targets(matrix, args.target)
    if len(names) == 1:
        return body(Plan.of(matrix, names[0]), out)
    codes, docs = [], {}
    for name in names:
        sub = Output(out.json_mode)
        try:
            codes.append(body(Plan.of(matrix, name), sub))
            docs[name] = {"ok": codes[-1] == 0, **sub.data}
        except BuilderError as exc:
            codes.append(exc.exit_code)
            log.info(f"error: {name}: {log.redact(exc.message)}")
            docs[name] = {"ok": False, "exit_code": exc.exit_code, "error": log.redact(exc.message), **sub.data}
    out.data["targets"] = docs
    return max(codes)


def on_images(args: argparse.Namespace, out: Output, body: Callable[[str, Output], int]) -> int:
    """``body(image, out)`` for --image, else for each target's recorded image."""
    if args.image:
        return body(args.image, out)
    from builder.pipeline.build import recorded_image

    return per_target(args, out, lambda plan, o: body(recorded_image(plan), o))


def docker_engine() -> DockerEngine:
    """The engine a command talks to (made here so that only the commands that need one pay for it)."""
    from builder.engine.buildx import DockerEngine

    return DockerEngine()

"""What the commands share: the stdout document (``Output``), the options every command takes
(--matrix, --target, --json) and the build options (``build``, ``reproduce``), how --target picks
the targets a command runs for, and the one Docker engine a command talks to."""

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
    from builder.config.options import BuildOptions
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

BUILD_OPTIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--no-cache", dict(action="store_true", default=False, help="build without the engine's layer cache")),
    ("--builder", dict(default=None, help="buildx builder to use (default: the current one)")),
    (
        "--max-jobs",
        dict(
            type=int,
            default=None,
            help="override MAX_JOBS for the compile (default: derived from the builder's memory)",
        ),
    ),
    (
        "--no-checks",
        dict(action="store_true", default=False, help="skip the image checks after the push (they run by default)"),
    ),
    (
        "--force",
        dict(
            action="store_true",
            default=False,
            help="build even when the inputs equal the recorded ones and the registry serves the image",
        ),
    ),
    (
        "--cache-from",
        dict(
            action="append",
            default=[],
            metavar="SPEC",
            help="buildx cache source, repeatable (a bare image ref means type=registry,ref=REF)",
        ),
    ),
    (
        "--cache-to",
        dict(
            default=None,
            metavar="SPEC",
            help="buildx cache export, e.g. type=inline (docker driver) or "
            "type=registry,ref=REF,mode=max / type=local,dest=DIR (docker-container)",
        ),
    ),
    (
        "--secret",
        dict(
            action="append",
            default=[],
            metavar="id=ID,env=VAR|src=FILE",
            help="a BuildKit secret for an id the matrix lists in compile.secrets (repeatable); "
            "its value is never logged, labelled or recorded",
        ),
    ),
    (
        "--jobs",
        dict(type=int, default=1, help="build this many targets at once (with several --target); one summary"),
    ),
    (
        "--keep-context",
        dict(
            action="store_true",
            default=False,
            help="keep the build's context/, source/ and third_party/ copies under artifacts/",
        ),
    ),
    (
        "--compile-cache",
        dict(
            default=None,
            metavar="URL",
            help="remote sccache backend for targets with compile.remote_cache: redis://host:port, "
            "s3://bucket/prefix?region=R, gcs://bucket, webdav(s)://host/path, gha:// "
            "(default: $K3_COMPILE_CACHE); it travels as a BuildKit secret",
        ),
    ),
    (
        "--allow-emulated",
        dict(
            action="store_true",
            default=False,
            help="compile a platform the builder runs only under QEMU (refused for every target but "
            "the smoke: hours; use a native or multi-node builder, `docker buildx create --append`)",
        ),
    ),
    (
        "--platform",
        dict(
            action="append",
            default=[],
            metavar="OS/ARCH",
            help="of a target built into an image index, build only this platform (repeatable); the "
            "index names the others' last recorded manifests",
        ),
    ),
)


def _add(parser: argparse.ArgumentParser, options: tuple[tuple[str, dict[str, Any]], ...], top: bool) -> None:
    for flag, keywords in options:
        parser.add_argument(flag, **(keywords if top else {**keywords, "default": argparse.SUPPRESS}))


def add_globals(parser: argparse.ArgumentParser, top: bool = False) -> None:
    """--matrix, --target and --json, which may stand before or after the command."""
    _add(parser, GLOBAL_OPTIONS, top)


def add_build_options(parser: argparse.ArgumentParser, top: bool = False) -> None:
    """How a build runs this time (``BuildOptions``), for ``build`` and ``reproduce``."""
    _add(parser, BUILD_OPTIONS, top)


def build_options(args: argparse.Namespace, plans: list[Plan]) -> BuildOptions:
    """The BuildOptions of this command line for these plans (the cascade: builder/config/cascade.py)."""
    from builder.config import cascade

    wanted = {sid for p in plans for sid in p.target.compile.secrets}
    return cascade.build_options(vars(args), wanted)


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


def written(write, what: str):
    """``write()``, with a path that fails between the check and the write (removed, made
    unwritable) as one line, exit 2; a full or read-only disk stays exit 74 (cli's mapping)."""
    from builder.errors import RESOURCE_ERRNOS, ConfigError

    try:
        return write()
    except OSError as exc:
        if exc.errno in RESOURCE_ERRNOS:
            raise
        raise ConfigError(f"{what}: cannot write {exc.filename or 'the record'}: {exc.strerror}") from None

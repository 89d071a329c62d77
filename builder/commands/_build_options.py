"""The build options, for ``build`` and ``reproduce``: how a build runs this time (the matrix
says what is built), and the ``BuildOptions`` a command line gives (the cascade:
builder/config/cascade.py)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from builder.commands._common import add_options

if TYPE_CHECKING:
    from builder.config.options import BuildOptions
    from builder.pipeline.plan import Plan

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


def add_build_options(parser: argparse.ArgumentParser, top: bool = False) -> None:
    """How a build runs this time (``BuildOptions``), for ``build`` and ``reproduce``."""
    add_options(parser, BUILD_OPTIONS, top)


def build_options(args: argparse.Namespace, plans: list[Plan]) -> BuildOptions:
    """The BuildOptions of this command line for these plans (the cascade: builder/config/cascade.py)."""
    from builder.config import cascade

    wanted = {sid for p in plans for sid in p.target.compile.secrets}
    return cascade.build_options(vars(args), wanted)

"""The `build` parser: the top-level options, then each command module's subparser, in the order
`build --help` lists them; and which function runs each command."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from builder import __version__
from builder.commands import (
    accept,
    build,
    compare,
    doctor,
    escrow,
    evidence,
    lock,
    plan,
    prune,
    render,
    reproduce,
    schema,
    smoke_init,
    test,
    track,
    verify,
    vet,
)
from builder.commands._build_options import add_build_options
from builder.commands._common import Output, add_globals

DESCRIPTION = """\
Reproducible builds of vLLM for Kimi K3 against CUDA 12.9, from matrix.yaml.

With no command, builds --target (the maintainer's `build --target cu129`).
--matrix and --target may stand before or after the command."""

EPILOG = """\
exit codes: 0 ok; 1 build/check failed or drift found; 2 bad input (matrix, target, lock,
record, source); 3 out of reach (Docker engine, registry, git remote, package index);
74 this host is out of disk space, a writable disk, memory or threads;
75 another build (or lock, prune) of the same target is running; 130 interrupted."""

MODULES = (
    render,
    lock,
    plan,
    build,
    test,
    verify,
    reproduce,
    escrow,
    track,
    doctor,
    evidence,
    compare,
    vet,
    accept,
    prune,
    smoke_init,
    schema,
)
DEFAULT = build.NAME  # `build --target T` with no command

# Command name -> what runs it (the CLI dispatches through this table; tests replace entries).
COMMANDS: dict[str, Callable[[argparse.Namespace, Output], int]] = {m.NAME: m.run for m in MODULES}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="build", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_globals(p, top=True)
    add_build_options(p, top=True)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for module in MODULES:
        module.register(sub)
    return p

"""`build schema`: the JSON Schema of matrix.yaml, made from the models the matrix is read into
(builder/config/schema.py), for editors; --check: exit 1 when the committed copy differs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from builder import log
from builder.commands._common import Output, add_globals
from builder.config.matrixschema import text
from builder.errors import DriftError

NAME = "schema"
COMMITTED = Path("docs") / "matrix.schema.json"  # beside the matrix, which names it on its first line
MAX_SCHEMA_BYTES = 1 << 20


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        NAME,
        help="print matrix.yaml's JSON Schema, for editors (docs/matrix.schema.json)",
        description="Print the JSON Schema of the matrix, made from the models the matrix is read into: "
        "every key with its type, default and pattern. matrix.yaml names the committed copy, "
        f"{COMMITTED}, on its first line (# yaml-language-server: $schema=...), so editors "
        "complete and check it. --check writes nothing and exits 1 when the committed copy beside "
        "the matrix differs.",
    )
    add_globals(p)
    p.add_argument(
        "--check",
        action="store_true",
        help=f"print nothing; exit 1 if {COMMITTED} beside the matrix differs from the schema",
    )


def run(args: argparse.Namespace, out: Output) -> int:
    current = text()
    if not args.check:
        out.line(current.removesuffix("\n"))
        out.data["schema"] = json.loads(current)
        return 0
    path = args.matrix.resolve().parent / COMMITTED
    state = "missing" if not path.exists() else "up to date" if _committed(path) == current else "out of date"
    log.info(f"{path}: {state}")
    out.data.update({"schema": str(path), "status": state})
    if state != "up to date":
        raise DriftError(f"{COMMITTED}: {state}; run `build schema > {COMMITTED}` and commit the result")
    return 0


def _committed(path: Path) -> str | None:
    from builder.fsutil import read_regular

    try:
        return read_regular(path, MAX_SCHEMA_BYTES, "the matrix schema").decode("utf-8")
    except UnicodeDecodeError:
        return None  # not what `build schema` writes: out of date

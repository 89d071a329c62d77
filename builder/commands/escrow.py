"""`build escrow`: every input of the recorded build pushed beside its image, with a signed
escrow manifest (builder/escrow/)."""

from __future__ import annotations

import argparse

from builder import log
from builder.commands._common import Output, add_globals, targets
from builder.config import contract
from builder.config.matrix import load

NAME = "escrow"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        NAME,
        help="push every input of the recorded build beside its image, with a signed escrow manifest",
        description="Push every input the record set of --target names, as content-addressed OCI "
        "artifacts: the pinned source and each third-party tree and submodule (git bundles of the "
        "pinned commits), every wheel of both locks, every .deb of the OS lock, the standalone "
        "CPython, the Dockerfile and locks, and each base image by digest with every platform it "
        "carries. Then an escrow manifest mapping each input to its escrow digest, signed like the "
        "provenance, pushed and written as locks/<target>/escrow.json. By default into "
        "<image repository>-escrow on the image's registry. Idempotent: what is already there is "
        "not pushed again; bytes pushed, mounted and already there are reported per input kind. "
        "Prints the escrow reference (give it to `build reproduce --from-escrow`).",
    )
    add_globals(p)
    p.add_argument("--to", metavar="REGISTRY/REPO", help="the repository to escrow into (default: beside the image)")


def run(args: argparse.Namespace, out: Output) -> int:
    from builder.escrow.run import escrow_target

    matrix = load(args.matrix)
    root = matrix.path.resolve().parent
    names = targets(matrix, args.target)
    if not args.target:  # every target that has a record (a named one without a record is refused)
        names = [n for n in names if contract.record_path(root, n).exists()]
    docs = {}
    for name in names:
        pushed = escrow_target(matrix, name, args.to)
        ref = f"{pushed.repository}@{pushed.index}"
        for row in pushed.tally.rows():
            log.info(
                f"escrow  {name:<8} {row['kind']:<7} pushed {_size(row['pushed'])}, mounted "
                f"{_size(row['mounted'])}, already there {_size(row['already'])}"
            )
        docs[name] = {
            "escrow": ref,
            "tag": f"{pushed.repository}:{pushed.tag}",
            "inputs": len(pushed.manifest.entries),
            "bytes": pushed.tally.rows(),
        }
        out.line(ref)
    if not docs:
        from builder.errors import RecordError

        raise RecordError(f"escrow: nothing recorded in {root / contract.LOCKS_DIR} to escrow; build first")
    out.data.update(docs[args.target[0]] if len(docs) == 1 and args.target else {"targets": docs})
    return 0


def _size(n: int | str) -> str:
    n = int(n)
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"

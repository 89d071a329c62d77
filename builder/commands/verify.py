"""`build verify`: the auditor's check, every link from matrix to registry, one row each."""

from __future__ import annotations

import argparse

from builder import log
from builder.commands._common import Output, add_globals, docker_engine, targets
from builder.config import contract
from builder.config.matrix import load
from builder.errors import VerifyFailed

NAME = "verify"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        NAME,
        help="the auditor's check: every link from matrix to registry, one row each",
        description="Check matrix <-> Dockerfile <-> lock <-> image.json <-> SBOM <-> provenance, one "
        "row per link, from the repository alone. --registry also checks that the "
        "registry serves the recorded digest (and the tag points at it), that the SBOM "
        "and provenance attached to it equal the committed files, and the image's "
        "signature: verified (cosign on PATH accepted a keyless signature by matrix "
        "signing.identity or $K3_SIGNING_IDENTITY, issuer signing.issuer or "
        "$K3_SIGNING_ISSUER), present-unverified (signed, not checked: no cosign or no "
        "identity), missing (a failure only when an identity is set) or failed; and, for a "
        "target escrowed by `build escrow`, that its signed escrow manifest names every input "
        "the record names and the escrow registry serves each one. "
        "Exit 0 only if all hold; nothing recorded at all is a failure.",
    )
    add_globals(p)
    p.add_argument(
        "--registry", action="store_true", help="also check the registry: image and tag, SBOM + provenance, signature"
    )


def run(args: argparse.Namespace, out: Output) -> int:
    from builder.records.verify import verify_targets

    matrix = load(args.matrix)
    engine = docker_engine() if args.registry else None
    names = targets(matrix, args.target)
    results = verify_targets(matrix, names, engine, explicit=bool(args.target))
    if args.registry:  # the escrow's row (builder/escrow/check.py), once per recorded target
        from builder.escrow.check import escrow_row

        root = matrix.path.resolve().parent
        recorded = [n for n in names if contract.record_path(root, n).exists()]
        results += [(n, escrow_row(root, matrix.target(n))) for n in recorded]
    out.data["rows"] = []
    failed = []
    for name, row in results:
        log.info(f"{'ok  ' if row.ok else 'FAIL'}  {name:<8} {row.check:<28} {row.detail}")
        out.data["rows"].append({"target": name, "check": row.check, "ok": row.ok, "detail": row.detail})
        if not row.ok:
            failed.append(f"{name}: {row.check}")
    if failed:
        raise VerifyFailed(f"verify failed: {'; '.join(failed)}")
    return 0

"""`build smoke-init`: the smoke target's bases, source repository and matrix on this machine."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder.commands._common import Output, docker_engine

NAME = "smoke-init"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        NAME,
        help="make the smoke target's bases, source repo and matrix (demo/tests)",
        description="Create the smoke target on this machine: Debian 12 base images "
        "(mmdebstrap minbase) pushed to --registry and pinned by digest, a git "
        "repository of the stand-in source, and OUT/matrix.yaml.",
    )
    p.add_argument("--out", type=Path, default=Path("smoke"), help="where to write (default: ./smoke)")
    p.add_argument("--registry", default="127.0.0.1:5000", help="registry for the bases and the image")
    p.add_argument("--repository", default="k3/smoke", help="repository of the smoke image (default: k3/smoke)")
    p.add_argument(
        "--arm64",
        action="store_true",
        help="name linux/arm64 beside linux/amd64: bases made with mmdebstrap --architectures=arm64 (under QEMU "
        "on an x86 machine), each joined with its amd64 base into one index",
    )


def run(args: argparse.Namespace, out: Output) -> int:
    from builder.smoke import smoke, smokearm64

    second = smokearm64.second_platform if args.arm64 else None
    matrix_path = smoke.init(args.out, args.registry, docker_engine(), repository=args.repository, second=second)
    out.line(str(matrix_path))
    out.data["matrix"] = str(matrix_path)
    return 0

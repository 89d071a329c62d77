"""`build evidence`: save host, engine, image and container state into one archive before anything
is changed."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder import log
from builder.commands._common import Output, add_globals, docker_engine
from builder.config.matrix import load
from builder.errors import ConfigError
from builder.fsutil import written

NAME = "evidence"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        NAME,
        help="save host, engine, image and container state before changing anything",
        description="Collect date -u, nvidia-smi (or its absence), uname -a, hostname, the loaded "
        "NVIDIA kernel modules and driver version, nvidia-smi topo -m, InfiniBand state "
        "(/sys/class/infiniband, ibv_devinfo), running containers, docker version and "
        "info, image inspect, vLLM version and source from labels, the NCCL version "
        "inside the image, the environment sorted with secrets redacted, and a "
        "container's log, into one timestamped tar.gz with a manifest of what was "
        "captured and what was missing (and why). Works with no GPU, no nvidia-smi "
        "and no Docker.",
    )
    add_globals(p)
    p.add_argument("--image", help="image reference to inspect")
    p.add_argument("--container", help="container whose log to capture")
    p.add_argument("--out", type=Path, required=True, help="directory for the archive")
    p.add_argument("--nvidia-smi-file", type=Path, help="captured nvidia-smi output instead of running it")


def run(args: argparse.Namespace, out: Output) -> int:
    from builder.host.evidence import evidence
    from builder.pipeline.build import recorded_image

    image = args.image
    if image is None and args.target:  # --target names the image: its recorded one
        if len(args.target) > 1:
            raise ConfigError(f"evidence: one image per archive; --target names {', '.join(args.target)}")
        from builder.pipeline.plan import Plan

        image = recorded_image(Plan.of(load(args.matrix), args.target[0]))
    path, manifest = written(
        lambda: evidence(docker_engine(), args.out, image, args.container, args.nvidia_smi_file), f"--out {args.out}"
    )
    for name, why in sorted(manifest["missing"].items()):
        log.info(f"    not captured: {name}: {why}")
    log.info(f"    captured: {', '.join(manifest['captured'])}")
    out.line(str(path))
    out.data.update({"archive": str(path), **manifest})
    return 0

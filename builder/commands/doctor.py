"""`build doctor`: can this image start on this host's driver, and which route applies; --record
writes the decision record."""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

from builder.commands._common import Output, add_globals, docker_engine, per_target, written

NAME = "doctor"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        NAME,
        help="can this image start on this host's driver? which route applies?",
        description="Read the host's driver (nvidia-smi, or a captured --nvidia-smi-file: the "
        "table, -q, --version or a --query-gpu CSV with its header, R610's KMD "
        "Version too, Windows/WSL captures included) and the image's CUDA version "
        "(labels, env), and say in one line whether it can start and why: minimum "
        "driver per CUDA release, minor-version compatibility within a major, forward "
        "compatibility only on data-center GPUs. A broken host (NVML mismatch, no "
        "libnvidia-ml.so, no driver, no devices) is a verdict with its route. Also "
        "reports an expired image; --record DIR writes the decision record (Markdown "
        "and JSON). Exit 0 compatible, 1 incompatible or broken host, 2 bad input, "
        "3 engine or registry out of reach.",
    )
    add_globals(p)
    p.add_argument("--image", help="image reference (default: --target's recorded image)")
    p.add_argument("--nvidia-smi-file", type=Path, help="captured nvidia-smi output (table, -q, --version, CSV)")
    p.add_argument("--record", type=Path, metavar="DIR", help="write the decision record (.md and .json) into DIR")
    p.add_argument("--evidence", type=Path, metavar="ARCHIVE", help="the `build evidence` archive the record names")


def run(args: argparse.Namespace, out: Output) -> int:
    from builder.engine.buildx import image_config
    from builder.host import doctor

    smi_text, smi_source = doctor.read_nvidia_smi(args.nvidia_smi_file)
    doctor.host_of(smi_text, smi_source)  # output it cannot read is bad input before any image is looked at
    archive = doctor.archive_facts(args.evidence)
    if args.record is not None:
        doctor.output_dir(args.record, "--record")  # refused before anything is diagnosed or written
    engine = docker_engine()

    def one(image: str, o: Output, built: dict | None = None) -> int:
        config = image_config(engine, image)
        d = doctor.diagnose(smi_text, smi_source, config.labels, config.env, image)
        o.line(d.line)
        o.line(f"route: {d.route}")
        for text in (
            ([d.expiry] if d.expiry else [])
            + [f"note: {n}" for n in d.notes]
            + ([f"save first: {d.save}"] if d.save else [])
        ):
            o.line(text)
        o.data.update(
            {
                "compatible": d.compatible,
                "verdict": d.line,
                "route": d.route,
                "expiry": d.expiry,
                "notes": d.notes,
                "save": d.save,
                **d.facts,
            }
        )
        if args.record is not None:
            doc = doctor.decision(d, config.labels, built, archive, dt.datetime.now(dt.timezone.utc))
            md, js = written(lambda: doctor.write_decision(args.record, doc), f"--record {args.record}")
            o.line(f"record: {md}")
            o.data.update({"record": str(md), "record_json": str(js)})
        return 0 if d.compatible else 1

    if args.image:
        return one(args.image, out)
    from builder.pipeline.build import recorded_image

    return per_target(args, out, lambda plan, o: one(recorded_image(plan), o, doctor.image_record(plan)))

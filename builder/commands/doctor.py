"""`build doctor`: can this image start on this host's driver, and which route applies; --record
writes the decision record."""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

from builder.commands._common import Output, add_globals, docker_engine, per_target
from builder.fsutil import written

NAME = "doctor"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        NAME,
        help="can this image start on this host's driver? which route applies?",
        description="Read the host (nvidia-smi, or a captured --nvidia-smi-file: the table, -q, -q -x, "
        "--version or a --query-gpu CSV, headerless with --columns; R610's KMD Version, Windows/WSL captures "
        "included) and the image (CUDA version, platforms, the driver floor and GPU families its labels "
        "carry), and say in one line whether it can start and why: the host kind (vGPU manager or guest, "
        "Windows TCC or WDDM, WSL, a container without the GPU runtime), the CPU against the image's "
        "platforms, each GPU's compute capability against the image's GPU code, the driver against the "
        "CUDA release and the image's driver floor; forward compatibility only on data-center GPUs CUDA 13 "
        "supports. A broken host is a verdict with its route. Also reports an expired image; --record DIR "
        "writes the decision record (Markdown and JSON). Exit 0 compatible, 1 incompatible or broken host, "
        "2 bad input (no nvidia-smi output), 3 engine or registry out of reach.",
    )
    add_globals(p)
    p.add_argument("--image", help="image reference (default: --target's recorded image)")
    p.add_argument("--nvidia-smi-file", type=Path, help="captured nvidia-smi output (table, -q, -q -x, --version, CSV)")
    p.add_argument("--record", type=Path, metavar="DIR", help="write the decision record (.md and .json) into DIR")
    p.add_argument(
        "--evidence",
        type=Path,
        metavar="ARCHIVE",
        help="the `build evidence` archive the record names; its uname gives the host's CPU architecture",
    )
    p.add_argument(
        "--columns",
        metavar="COLS",
        help="the columns of a headerless --query-gpu CSV (--format=csv,noheader), as passed to --query-gpu",
    )


def run(args: argparse.Namespace, out: Output) -> int:
    from builder.engine.seam import image_config
    from builder.host import doctor, hostctx, imagefacts

    smi_text, smi_source = doctor.read_nvidia_smi(args.nvidia_smi_file)
    ctx = hostctx.gather(args.nvidia_smi_file, args.evidence, args.columns, live_smi_missing=smi_text is None)
    # Output it cannot read is bad input before any image; the host's platform (uname, else a Grace
    # or Jetson GPU) picks both the index's platform and the build record read.
    host_arch = doctor.host_arch(smi_text, smi_source, ctx)
    archive = doctor.archive_facts(args.evidence)
    if args.record is not None:
        doctor.output_dir(args.record, "--record")  # refused before anything is diagnosed or written
    engine = docker_engine()

    def one(image: str, o: Output, built: dict | None = None) -> int:
        config = image_config(engine, image, _platform(engine, image, host_arch, o))
        record = Path(built["record"]) if built and built["image"] == image else None
        facts = imagefacts.read(engine, image, config.labels, record)
        d = doctor.diagnose(smi_text, smi_source, config.labels, config.env, image, facts=facts, ctx=ctx)
        o.line(d.line)
        o.line(f"route: {d.route}")
        o.line(f"verdict: {d.name} (host kind {d.facts['host_kind']})")
        for g in dict.fromkeys(doctor.gpu_lines(d)):
            o.line(g)
        for text in (
            ([d.expiry] if d.expiry else [])
            + [f"note: {n}" for n in d.notes]
            + ([f"save first: {d.save}"] if d.save else [])
        ):
            o.line(text)
        o.data.update(
            {
                "compatible": d.compatible,
                "verdict_name": d.name,
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

    return per_target(args, out, lambda plan, o: one(recorded_image(plan), o, doctor.image_record(plan, host_arch)))


def _platform(engine, image: str, host_arch: str | None, o: Output) -> str | None:
    """The platform of ``image`` to read: of an index, the host's (its labels, floor and families are
    that platform's; the line docs/r575.md promises says which); not offered, the default one (the
    CPU verdict says so)."""
    from builder.host import imagefacts

    offered = imagefacts.platforms(engine, image)[0]
    pick = host_arch if host_arch and f"linux/{host_arch}" in offered and len(offered) > 1 else None
    if pick:
        o.line(f"platform: linux/{pick} of {', '.join(offered)} (the host's)")
        o.data["image_platform"] = f"linux/{pick}"  # "platform" is the driver's (linux, windows, wsl)
    return pick

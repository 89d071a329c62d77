"""`build accept --endpoint URL`: a launched server checked step by step (the migration guide's
order), the report written, and with --record the decision record's "Launch verification"."""

from __future__ import annotations

import argparse
import datetime as dt
import os
from pathlib import Path

from builder import log
from builder.commands._accept_options import API_KEY_ENV, DESCRIPTION, OPTIONS
from builder.commands._common import Output, add_globals, docker_engine
from builder.errors import ConfigError, Unreachable
from builder.fsutil import written

NAME = "accept"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        NAME,
        help="check a launched OpenAI-compatible (vLLM) server step by step; completes the decision record",
        description=DESCRIPTION,
    )
    add_globals(p)
    for flag, keywords in OPTIONS:
        p.add_argument(flag, **keywords)


def _api_key(name: str | None) -> str | None:
    value = os.environ.get(name or API_KEY_ENV) or None
    if name and value is None:
        raise ConfigError(f"--api-key-env {name}: ${name} is not set")
    if value:
        from builder.host.redaction import forms

        log.register_secret_forms(value, tuple(f for f in forms(value) if f != value))
    return value


def _image_version(image: str) -> str | None:
    from builder.config import contract
    from builder.engine.seam import image_config

    return image_config(docker_engine(), image, None).labels.get(contract.OCI_VERSION)


def _options(args: argparse.Namespace, record: tuple[Path, dict] | None):
    from builder.accept import decision
    from builder.accept.client import base_url
    from builder.accept.recipe import from_target
    from builder.accept.session import Options
    from builder.host.doctor import output_dir

    base_url(args.endpoint)  # bad input before anything is written
    exp, version, source = from_target(args.matrix, args.target)
    if args.image:
        version, source = _image_version(args.image), f"--image {args.image}"
    elif record is not None and (found := decision.record_version(record[1])) is not None:
        version, source = found, f"the record {record[0].name}"
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    wanted = args.out or Path(f"k3-accept-{stamp}")
    made = not wanted.exists()
    out = output_dir(wanted, "--out")
    opts = Options(
        endpoint=args.endpoint,
        out=out,
        model=args.model,
        expected=exp,
        version=version,
        version_from=source,
        context_tokens=args.context_tokens,
        max_concurrency=args.max_concurrency,
        nodes=args.nodes,
        server_log=args.server_log,
        gpu_state=args.gpu_state,
        timeout=args.timeout,
        max_tokens=args.max_tokens,
    )
    return opts, made


def run(args: argparse.Namespace, out: Output) -> int:
    from builder.accept import decision, report
    from builder.accept.run import REPORT_MD
    from builder.accept.run import run as accept_run
    from builder.accept.session import LogSource
    from builder.host.doctor import amend_decision

    key = _api_key(args.api_key_env)
    record = decision.load_record(args.record) if args.record is not None else None
    LogSource(args.server_log)  # a --server-log path that is not there is bad input, before anything runs
    opts, made = _options(args, record)
    try:
        doc = written(lambda: accept_run(opts, key, opts.out), f"--out {opts.out}")
    except Unreachable:
        if made and not any(opts.out.iterdir()):  # out of reach at once: nothing to keep
            opts.out.rmdir()
        raise
    markdown = report.markdown(doc)
    log.step_summary(markdown)
    if args.format == "markdown":
        out.line(markdown)
    else:
        out.line(f"outcome: {doc['outcome']} (load step reached {doc['reached']})")
        out.line(f"report: {opts.out / REPORT_MD}")
    out.data.update({**doc, "report_dir": str(opts.out)})
    if record is not None:
        entry = decision.section(doc, opts.out, opts.expected)
        js, md = written(lambda: amend_decision(record[0], "--record", "launch", entry), f"--record {record[0]}")
        out.line(f"record: {md}")
        out.data["record"] = str(md)
    return decision.exit_code(doc)

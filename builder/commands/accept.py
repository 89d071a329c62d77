"""`build accept --endpoint URL`: a launched server checked step by step (the migration guide's
order), the report written, and with --record the decision record's "Launch verification"."""

from __future__ import annotations

import argparse
import datetime as dt
import os
from pathlib import Path
from typing import Any

from builder import log
from builder.commands._common import Output, add_globals, docker_engine, written
from builder.errors import ConfigError, Unreachable

NAME = "accept"
API_KEY_ENV = "K3_ACCEPT_API_KEY"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more: {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 86400: {text!r}")
    return value


OPTIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--endpoint", dict(required=True, metavar="URL", help="the server, http(s)://HOST:PORT (a /v1 suffix is fine)")),
    ("--model", dict(metavar="NAME", help="the served model name expected on /v1/models (default: --target's recipe)")),
    ("--image", dict(metavar="REF", help="the image the server runs: its version label is held against /version")),
    (
        "--context-tokens",
        dict(
            type=_positive,
            metavar="N",
            help="the team's target context (default: the server's max_model_len less the answer)",
        ),
    ),
    (
        "--max-concurrency",
        dict(type=_positive, default=8, metavar="N", help="the highest concurrency level (default: 8)"),
    ),
    (
        "--nodes",
        dict(
            type=_positive,
            default=1,
            metavar="N",
            help="nodes the deployment spans; step 7 runs only with 2 or more (default: 1)",
        ),
    ),
    (
        "--server-log",
        dict(
            metavar="CMD_OR_FILE",
            help="the server's log: a file, or a shell command printing it, e.g. "
            "'docker logs --since {since} k3' ({since}: the last capture's Unix time)",
        ),
    ),
    (
        "--gpu-state",
        dict(
            metavar="CMD",
            help="a shell command printing the GPU state at each step, e.g. "
            "'nvidia-smi --query-gpu=index,memory.used,memory.total,utilization.gpu --format=csv'",
        ),
    ),
    (
        "--record",
        dict(
            type=Path,
            metavar="DIR",
            help="add 'Launch verification' to the decision record `build doctor --record DIR` wrote "
            "(the newest in DIR, or a record's .json)",
        ),
    ),
    ("--out", dict(type=Path, metavar="DIR", help="the report directory (default: ./k3-accept-<UTC time>)")),
    (
        "--format",
        dict(choices=("text", "markdown"), default="text", help="stdout: a summary (text) or the Markdown report"),
    ),
    (
        "--api-key-env",
        dict(
            metavar="NAME",
            help=f"the environment variable holding the API key (default: {API_KEY_ENV}, if set); never printed",
        ),
    ),
    (
        "--timeout",
        dict(
            type=_seconds,
            default=300.0,
            metavar="SECONDS",
            help="how long a request waits for the server's next byte (default: 300)",
        ),
    ),
    (
        "--max-tokens",
        dict(type=_positive, default=32, metavar="N", help="tokens each test request may generate (default: 32)"),
    ),
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        NAME,
        help="check a launched OpenAI-compatible (vLLM) server step by step; completes the decision record",
        description="After the launch, the migration guide's steps in its order, each a row (pass, fail, n/a) "
        "with its evidence and reason: 1 loaded with no traffic (/health, /v1/models, /version, /metrics' "
        "cache_config_info), 2 a short request, 3 the target context (counted by the server's /tokenize), "
        "4 prefix caching (two requests sharing a prefix; a one-token change at the start; the cause named when "
        "reuse fails), 5 concurrency 1, 2, 4 ... --max-concurrency (streaming: p50/p95 TTFT and latency, "
        "tokens/s, errors), 6 agent (forced, required and auto tool calls, the tool loop, json_schema output), "
        "7 cross-node (n/a on one node). Load stops rising at the first failing step. Each step's evidence "
        "(requests and responses redacted, /metrics, GPU state, the server log since the last step, OOM and NCCL "
        "findings) is written as it completes into --out. Exit 0 every step passes (n/a allowed), 1 a step "
        "fails, 2 bad input, 3 the endpoint is out of reach.",
    )
    add_globals(p)
    for flag, keywords in OPTIONS:
        p.add_argument(flag, **keywords)


def _api_key(name: str | None) -> str | None:
    value = os.environ.get(name or API_KEY_ENV) or None
    if name and value is None:
        raise ConfigError(f"--api-key-env {name}: ${name} is not set")
    if value:
        log.register_secret(value)
    return value


def _expected(args: argparse.Namespace):
    """(the recipe's expectations, the image's vLLM version, where it came from) from --target/--image."""
    from builder.accept.recipe import expected

    if not args.target:
        return None, None, None
    if len(args.target) > 1:
        raise ConfigError(f"accept: one target per run; --target names {', '.join(args.target)}")
    from builder.config.matrix import load

    target = load(args.matrix).target(args.target[0])
    recipe = target.runtime.recipe
    version = target.source.wheel_version if target.source.package == "vllm" else None
    return (expected(recipe.command) if recipe else None), version, (f"--target {target.name}" if version else None)


def _image_version(image: str) -> str | None:
    from builder.config import contract
    from builder.engine.buildx import image_config

    return image_config(docker_engine(), image, None).labels.get(contract.OCI_VERSION)


def _record_version(record: Path | None) -> str | None:
    import json

    from builder.config import contract

    if record is None:
        return None
    try:
        labels = json.loads(record.read_text(encoding="utf-8"))["verification"]["labels"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return labels.get(contract.OCI_VERSION) if isinstance(labels, dict) else None


def _options(args: argparse.Namespace, record: Path | None):
    from builder.accept.client import base_url
    from builder.accept.session import Options
    from builder.host.doctor import output_dir

    base_url(args.endpoint)  # bad input before anything is written
    exp, version, source = _expected(args)
    if args.image:
        version, source = _image_version(args.image), f"--image {args.image}"
    elif record is not None and (found := _record_version(record)) is not None:
        version, source = found, f"the record {record.name}"
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
    record = decision.record_file(args.record) if args.record is not None else None
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
        js, md = written(lambda: amend_decision(record, "--record", "launch", entry), f"--record {record}")
        out.line(f"record: {md}")
        out.data["record"] = str(md)
    return 1 if doc["outcome"] == "fail" else 0

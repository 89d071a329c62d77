"""`build accept`'s flags: the table `builder/commands/accept.py` registers, kept apart so the
command itself stays a thin parse-and-print."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

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
            help="the server's log: an existing file, else a shell command printing it (one word with a / or . "
            "and no shell syntax is a file name and must exist), e.g. "
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


DESCRIPTION = (
    "After the launch, the migration guide's steps in its order, each a row (pass, fail, n/a) "
    "with its evidence and reason: 1 loaded with no traffic (/health, /v1/models, /version, /metrics' "
    "cache_config_info), 2 a short request, 3 the target context (counted by the server's /tokenize), "
    "4 prefix caching (two requests sharing a prefix; a one-token change at the start; the cause named when "
    "reuse fails), 5 concurrency 1, 2, 4 ... --max-concurrency (streaming: p50/p95 TTFT and latency, "
    "tokens/s, errors), 6 agent (forced, required and auto tool calls, the tool loop, json_schema output), "
    "7 cross-node (n/a on one node). Load stops rising at the first failing step. Each step's evidence "
    "(requests and responses redacted, /metrics, GPU state, the server log since the last step, OOM and NCCL "
    "findings) is written as it completes into --out. Exit 0 every step passes (n/a allowed), 1 a step "
    "fails, 2 bad input, 3 the endpoint is out of reach."
)

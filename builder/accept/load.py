"""Step 5, concurrency 1, 2, 4, ... up to the maximum (streaming; p50/p95 of TTFT and latency,
tokens/s, errors; the load stops rising at the first level with an error), and step 7, cross-node."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from builder.accept import stats
from builder.accept.client import EndpointDown, Streamed
from builder.accept.model import Outcome, Step, StepResult
from builder.accept.session import Session

ROUNDS = 2  # waves of `level` simultaneous requests per level


def _one(s: Session, level: int, i: int) -> Streamed | str:
    prompt = f"[{s.nonce}-{level}-{i}] Write one sentence about rack {i} in hall {level}."
    try:
        out = s.client.stream_chat(s.chat([{"role": "user", "content": prompt}]))
    except EndpointDown as exc:
        return str(exc)
    if out.error or out.status != 200:
        return out.error or f"HTTP {out.status}"
    if out.finish_reason is None:
        return "the stream ended without a finish_reason"
    return out


def run_level(s: Session, level: int) -> tuple[dict, list[str]]:
    """``ROUNDS`` waves of ``level`` simultaneous streamed requests: the level's summary row, errors."""
    done: list[Streamed | str] = []
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=level) as pool:
        for _ in range(ROUNDS):
            done += list(pool.map(lambda i: _one(s, level, i), range(level)))
    wall = time.monotonic() - start
    ok = [d for d in done if isinstance(d, Streamed)]
    errors = [d for d in done if isinstance(d, str)]
    tokens = sum(int((d.usage or {}).get("completion_tokens") or 0) for d in ok)
    row = stats.summary([d.ttft for d in ok if d.ttft is not None], [d.latency for d in ok], tokens, wall, len(errors))
    return {"concurrency": level, **row}, errors


def concurrency(s: Session) -> StepResult:
    rows = []
    for level in stats.levels(s.opts.max_concurrency):
        row, errors = run_level(s, level)
        rows.append(row)
        if errors:
            return StepResult(
                Step.CONCURRENCY,
                Outcome.FAIL,
                f"{len(errors)} of {row['requests']} requests failed at concurrency {level}: {errors[0][:200]}",
                {"levels": rows, "errors": errors[:20]},
            )
    top = rows[-1]
    return StepResult(
        Step.CONCURRENCY,
        Outcome.PASS,
        f"up to {top['concurrency']} at once, no error: TTFT p95 {top['ttft_p95']}s, latency p95 "
        f"{top['latency_p95']}s, {top['tokens_per_s']} tokens/s",
        {"levels": rows},
    )


def cross_node(s: Session) -> StepResult:
    """n/a on one node; on several, the highest level again with the log read for NCCL (the runner
    fails the step on a NCCL error), which needs the log."""
    if s.opts.nodes <= 1:
        return StepResult(Step.CROSS_NODE, Outcome.NA, "one node (--nodes 1): the deployment has no cross-node path")
    if not s.opts.server_log:
        return StepResult(
            Step.CROSS_NODE,
            Outcome.NA,
            f"{s.opts.nodes} nodes, but no --server-log: a cross-node fault shows in the log",
        )
    row, errors = run_level(s, s.opts.max_concurrency)
    if errors:
        return StepResult(Step.CROSS_NODE, Outcome.FAIL, f"{len(errors)} requests failed: {errors[0][:200]}", row)
    return StepResult(
        Step.CROSS_NODE,
        Outcome.PASS,
        f"{row['requests']} requests across {s.opts.nodes} nodes answered; the log is read for NCCL below",
        row,
    )

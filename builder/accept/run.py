"""The run: the guide's steps in order, each timed, its evidence (exchanges, /metrics snapshot, GPU
state, server log since the last step and what the log shows) written atomically as it completes,
and the report rewritten after every step, so an interrupted run keeps every finished step."""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from builder import log
from builder.accept import agent, basic, load, logscan, png, prefix, report
from builder.accept.client import Client, EndpointDown, base_url
from builder.accept.model import LogKind, NcclKind, Outcome, Step, StepResult, not_reached
from builder.accept.session import GpuState, LogSource, Options, Session, dump, gpu_line
from builder.errors import Interrupted
from builder.fsutil import atomic_write

STEPS: tuple[tuple[Step, Callable[[Session], StepResult]], ...] = (
    (Step.LOADED, basic.loaded),
    (Step.SHORT, basic.short),
    (Step.CONTEXT, basic.context),
    (Step.PREFIX, prefix.prefix),
    (Step.CONCURRENCY, load.concurrency),
    (Step.AGENT, agent.agent),
    (Step.CROSS_NODE, load.cross_node),
)
REPORT_JSON, REPORT_MD, PLOT, PLOT_SVG = "accept.json", "accept.md", "concurrency.png", "concurrency.svg"


def _put(path: Path, text: str) -> None:
    """Evidence as written: redacted (the API key, URL credentials), control characters escaped."""
    atomic_write(path, log.printable(log.redact(text)))


def serious(finding) -> bool:
    """A log finding that fails its step: an OOM, the original driver error, a NCCL error (not a warning)."""
    return finding.kind is not LogKind.NCCL or finding.nccl is not NcclKind.WARNING


def _with_findings(r: StepResult, findings: tuple) -> StepResult:
    bad = [f for f in findings if serious(f)]
    if not bad or r.outcome is Outcome.FAIL:
        return replace(r, findings=findings)
    first = bad[0]
    what = first.phase.value if first.phase else first.nccl.value if first.nccl else "original error"
    reason = f"the server log shows {first.kind.value} ({what}): {first.line[:160]}"
    if first.kind is LogKind.NCCL:
        reason += "; " + logscan.NCCL_ADVICE
    return replace(r, outcome=Outcome.FAIL, reason=reason, findings=findings)


def _evidence(s: Session, step: Step, r: StepResult, out: Path) -> StepResult:
    metrics = s.metrics()
    text, why = s.logs.since_last()
    first_token = r.measured.get("ttft_s") is not None if isinstance(r.measured, dict) else None
    r = _with_findings(r, logscan.classify(text or "", step, first_token))
    stem = f"{step.value:02d}-{re.sub(r'[^a-z0-9]+', '-', step.title).strip('-')}"
    steps = out / "steps"
    if metrics is not None:
        _put(steps / f"{stem}.metrics.txt", metrics)
    if text is not None:
        _put(steps / f"{stem}.log", text)
    gpu = s.gpu.take()
    missing = why if text is None and s.opts.server_log else None
    r = replace(r, log_missing=missing, gpu=gpu_line(gpu) if s.opts.gpu_state else None)
    evidence = {
        **r.to_json(),
        "exchanges": s.client.exchanges,
        "metrics": f"{stem}.metrics.txt" if metrics is not None else f"n/a: {s.metrics_why}",
        "gpu": gpu,
        "server_log": f"{stem}.log" if text is not None else f"n/a: {why}",
    }
    _put(steps / f"{stem}.json", dump(evidence))
    return r


def _one(s: Session, step: Step, fn: Callable[[Session], StepResult], out: Path) -> StepResult:
    s.client.exchanges = []
    start = time.monotonic()
    try:
        r = fn(s)
    except EndpointDown as exc:
        r = StepResult(step, Outcome.FAIL, f"the server stopped answering: {exc}", server_gone=True)
    except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
        # An answer of a shape no OpenAI-compatible server gives (a field of another type): the
        # step fails, saying so, and its evidence (the exchanges) is kept like any other.
        r = StepResult(step, Outcome.FAIL, f"could not read the server's answer: {type(exc).__name__}: {exc}")
    if r.outcome is Outcome.FAIL and not r.server_gone:
        r = _gone(s, r)
    r = replace(r, seconds=time.monotonic() - start)
    return _evidence(s, step, r, out)


def _gone(s: Session, r: StepResult) -> StepResult:
    """A failed step whose server no longer answers says so first: a broken stream or an error
    status is then the server going away, not the feature failing."""
    try:
        s.client.get("/health", timeout=10)
    except EndpointDown as exc:
        return replace(r, reason=f"the server stopped answering ({exc}); before that: {r.reason}", server_gone=True)
    return r


def _head(s: Session, created: str) -> dict:
    return {
        "created": created,
        "endpoint": log.redact(s.client.url),  # a URL with user:password@ is never written as it is
        "model": s.model or None,
        "launch": {"recipe": s.opts.expected.command if s.opts.expected else None, "server": dict(s.facts)},
        "expected_version": s.opts.version,
        "expected_version_from": s.opts.version_from,
        "options": {
            "context_tokens": s.opts.context_tokens,
            "max_concurrency": s.opts.max_concurrency,
            "nodes": s.opts.nodes,
            "timeout": s.opts.timeout,
            "max_tokens": s.opts.max_tokens,
        },
        "evidence": "steps/",
        "plot": None,
    }


def _write(s: Session, out: Path, head: dict, results: list[StepResult], complete: bool) -> dict:
    levels = next((r.measured.get("levels") for r in results if r.step is Step.CONCURRENCY), None)
    if levels:
        atomic_write(out / PLOT, png.plot(levels))
        atomic_write(out / PLOT_SVG, png.svg(levels))
        head["plot"] = PLOT
    head.update({"model": s.model or None, "launch": {**head["launch"], "server": dict(s.facts)}})
    doc = report.document(head, results, complete, log_read=bool(s.opts.server_log))
    _put(out / REPORT_JSON, dump(doc))
    _put(out / REPORT_MD, report.markdown(doc))
    return doc


def run(opts: Options, api_key: str | None, out: Path) -> dict:
    """Every step against ``opts.endpoint``; the report document. Unreachable (step 1) propagates;
    Ctrl-C keeps the report of the steps done (the one interrupted is n/a) and says where it is."""
    client = Client(base_url(opts.endpoint), api_key, opts.timeout)
    s = Session(opts, client, LogSource(opts.server_log), GpuState(opts.gpu_state))
    head = _head(s, dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    results: list[StepResult] = []
    basic.reach(s)  # out of reach: exit 3 before any step starts
    log.info("  step name                 outcome reason")
    try:
        _steps(s, out, head, results)
    except KeyboardInterrupt:
        step = STEPS[len(results)][0]
        results.append(StepResult(step, Outcome.NA, "interrupted (Ctrl-C or SIGTERM) during this step", ran=False))
        _write(s, out, head, results, complete=False)
        raise Interrupted(f"interrupted at step {step.value}; the report of the steps done is kept in {out}") from None
    return _write(s, out, head, results, complete=True)


def _steps(s: Session, out: Path, head: dict, results: list[StepResult]) -> None:
    failed: StepResult | None = None
    for step, fn in STEPS:
        if failed is not None:
            results.append(not_reached(step, failed.step))
            continue
        with log.step(f"step {step.value}: {step.title}", long=step in (Step.CONTEXT, Step.CONCURRENCY)):
            r = _one(s, step, fn, out)
        results.append(r)
        log.info(report.row(r))
        failed = r if r.outcome is Outcome.FAIL else None
        _write(s, out, head, results, complete=False)

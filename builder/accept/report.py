"""The run's report: one JSON document and its Markdown (the same facts), the progress rows the
logger prints as steps complete, and the guide's decision signs measured by the run."""

from __future__ import annotations

from typing import Any

from builder.accept.model import LogKind, NcclKind, Outcome, ReuseCause, RunOutcome, Step, StepResult

REPORT_SCHEMA = 1
NOT_MEASURED = "not measured"


def reached(results: list[StepResult]) -> int:
    """The load step reached: the last step that ran before the first failure (or the last run)."""
    ran = [r for r in results if r.ran]
    failed = [r for r in ran if r.outcome is Outcome.FAIL]
    return (failed[0] if failed else ran[-1]).step.value if ran else 0


def _sign(result: StepResult | None, yes: str) -> str:
    if result is None or result.outcome is Outcome.NA:
        return f"{NOT_MEASURED}" + (f": {result.reason}" if result else "")
    if result.outcome is Outcome.PASS:
        return yes
    return "no" + (f" ({result.cause.value})" if result.cause else "") + f": {result.reason}"


def _recurs(results: list[StepResult], log_given: bool) -> str:
    """ "no" only when every step that ran had its log read: an unread log shows nothing."""
    driver = [f.line for r in results for f in r.findings if f.kind is LogKind.DRIVER]
    if driver:
        return f"yes: {driver[0]}"
    if not log_given:
        return f"{NOT_MEASURED}: no --server-log"
    unread = next((r for r in results if r.ran and r.log_missing), None)
    if unread is not None:
        return f"{NOT_MEASURED}: the server log after step {unread.step.value} is n/a: {unread.log_missing}"
    return "no: not in the server log"


def signs(results: list[StepResult], log_read: bool) -> dict[str, str | None]:
    """The guide's four signs for keep / isolate / return; the fourth is a person's. ``log_read``:
    a --server-log was given (each step's result says whether its part was read)."""
    by = {r.step: r for r in results}
    return {
        "original_error_recurs": _recurs(results, log_read),
        "prefix_caching_as_expected": _sign(by.get(Step.PREFIX), "yes"),
        "agent_tools_work": _sign(by.get(Step.AGENT), "yes"),
        "manual_steps": None,  # how many manual steps the environment needs: only a person knows
    }


def run_outcome(results: list[StepResult], complete: bool) -> RunOutcome:
    if any(r.outcome is Outcome.FAIL for r in results):
        return RunOutcome.FAIL
    return RunOutcome.PASS if complete else RunOutcome.INCOMPLETE


def document(head: dict[str, Any], results: list[StepResult], complete: bool, log_read: bool) -> dict[str, Any]:
    return {
        "schema": REPORT_SCHEMA,
        **head,
        "complete": complete,
        "outcome": run_outcome(results, complete).value,
        "reached": reached(results),
        "steps": [r.to_json() for r in results],
        "signs": signs(results, log_read),
    }


def row(r: StepResult) -> str:
    """One progress line of the table the logger prints as each step completes."""
    cause = f" [{r.cause.value}]" if r.cause else ""
    return f"  {r.step.value}  {r.step.title:<20} {r.outcome.value:<5} {r.reason}{cause}"


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")[:400]


def _findings(step: dict) -> list[str]:
    lines = []
    for f in step["log_findings"]:
        what = f["phase"] or f["nccl"] or ""
        advice = (
            " (topology, RDMA, environment)"
            if f["kind"] == LogKind.NCCL.value and f["nccl"] != NcclKind.WARNING.value
            else ""
        )
        lines.append(f"- step {step['step']}: {f['kind']} {what}{advice}: `{_cell(f['line'])}`")
    return lines


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        f"# build accept: {doc['endpoint']}",
        "",
        f"- model: {doc.get('model') or '(not known)'}; created {doc['created']}; outcome **{doc['outcome']}**, "
        f"load step reached {doc['reached']}",
        f"- launch (recipe): `{doc['launch']['recipe']}`"
        if doc["launch"].get("recipe")
        else "- launch (recipe): no --target given",
        f"- server reports: {_cell(server_line(doc['launch'].get('server') or {}))}",
        "",
        "| step | name | outcome | reason |",
        "| --- | --- | --- | --- |",
    ]
    for s in doc["steps"]:
        cause = f" (cause: {s['cause']})" if s["cause"] else ""
        lines.append(f"| {s['step']} | {s['name']} | {s['outcome']} | {_cell(s['reason'])}{cause} |")
    found = sum((_findings(s) for s in doc["steps"]), [])
    lines += [
        "",
        *prefix_lines(doc),
        *concurrency_table(doc),
        *gpu_lines(doc),
        "## Log findings",
        "",
        *(found or ["- none (or no --server-log)"]),
    ]
    lines += ["", "## Decision signs", ""]
    lines += [
        f"- {k.replace('_', ' ')}: {v if v is not None else 'TO FILL (a person)'}" for k, v in doc["signs"].items()
    ]
    return "\n".join(lines) + "\n"


def _measured(doc: dict[str, Any], step: Step) -> dict[str, Any]:
    return next((s["measured"] for s in doc["steps"] if s["step"] == step.value), None) or {}


def prefix_lines(doc: dict[str, Any]) -> list[str]:
    """Step 4's numbers: reuse, the TTFT of the second request over the first's, the /metrics hits."""
    m = _measured(doc, Step.PREFIX)
    if not m.get("second"):
        return []
    hits = ", ".join(f"{k} {(m.get(k) or {}).get('hits_delta')}" for k in ("first", "second", "changed"))
    return [
        "## Prefix caching",
        "",
        f"- shared tokens {m.get('shared_tokens')}, reused {m['second'].get('cached_tokens')} "
        f"(ratio {m.get('reuse_ratio')}); changed at token {m.get('changed_at_token')} "
        f"(block {m.get('block_size')}): reused {(m.get('changed') or {}).get('cached_tokens')}",
        f"- TTFT second / first: {m.get('ttft_second_over_first')}",
        f"- /metrics prefix-cache hits delta: {hits}",
        "",
    ]


def gpu_lines(doc: dict[str, Any]) -> list[str]:
    """The GPU state after each step that ran (only when --gpu-state was given)."""
    rows = [f"- step {s['step']}: {_cell(s['gpu'])}" for s in doc["steps"] if s.get("ran") and s.get("gpu")]
    return ["## GPU state", "", *rows, ""] if rows else []


def concurrency_table(doc: dict[str, Any]) -> list[str]:
    levels = next((s["measured"].get("levels") for s in doc["steps"] if s["step"] == Step.CONCURRENCY.value), None)
    if not levels:
        return []
    lines = [
        "## Concurrency",
        "",
        "| concurrency | requests | errors | TTFT p50 | TTFT p95 | latency p50 | latency p95 | tokens/s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    keys = ("concurrency", "requests", "errors", "ttft_p50", "ttft_p95", "latency_p50", "latency_p95", "tokens_per_s")
    lines += ["| " + " | ".join(str(lv.get(k)) for k in keys) + " |" for lv in levels]
    return lines + (["", f"Plot: `{doc['plot']}` (labelled: `concurrency.svg`)"] if doc.get("plot") else []) + [""]


def server_line(server: dict[str, Any]) -> str:
    config = server.get("cache_config") or {}
    return (
        f"models {server.get('models')}, version {server.get('version') or 'unknown'}, max_model_len "
        f"{server.get('max_model_len')}, enable_prefix_caching {config.get('enable_prefix_caching', 'not exported')}"
        + (f", block_size {config['block_size']}" if config.get("block_size") else "")
    )


CAUSES = tuple(c.value for c in ReuseCause)

"""Steps 1 to 3: the model loaded with no traffic, a short request, the target context."""

from __future__ import annotations

from builder import log
from builder.accept import metrics, prompts
from builder.accept.client import EndpointDown, Streamed
from builder.accept.model import Outcome, Step, StepResult
from builder.accept.session import Session
from builder.errors import Unreachable

SHORT_PROMPT = "Say hello to the operator in five words."
ANSWER_ROOM = 8  # tokens of the template's assistant turn beyond the prompt the count leaves out


def _models(s: Session) -> tuple[list[str], dict | None, str | None]:
    reply = s.client.get("/v1/models")
    doc = reply.json()
    if not reply.ok or not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        return [], None, f"/v1/models answered HTTP {reply.status}: {reply.text[:200]}"
    entries = [e for e in doc["data"] if isinstance(e, dict) and isinstance(e.get("id"), str)]
    return [e["id"] for e in entries], (entries[0] if entries else None), None


def _version(s: Session) -> tuple[str | None, str | None]:
    """(the server's /version, None) or (None, why it is not known)."""
    reply = s.client.get("/version")
    doc = reply.json()
    if reply.ok and isinstance(doc, dict) and isinstance(doc.get("version"), str):
        return doc["version"], None
    return None, f"/version answered HTTP {reply.status} (not a vLLM server?)"


def _server_facts(s: Session, ids: list[str], entry: dict | None) -> None:
    text = s.metrics()
    samples = metrics.parse(text) if text is not None else []
    config = metrics.cache_config(samples)
    s.facts.update(
        {
            "models": ids,
            "max_model_len": entry.get("max_model_len")
            if entry and isinstance(entry.get("max_model_len"), int)
            else None,
            "cache_config": config,
            "prefix_caching": metrics.prefix_caching_on(config),
            "metrics": "present" if text is not None else s.metrics_why,
        }
    )


def _expected_model(s: Session) -> str | None:
    return s.opts.model or (s.opts.expected.name if s.opts.expected else None)


def reach(s: Session):
    """GET /health, or Unreachable (exit 3) when nothing answers: asked before step 1 starts, so
    an endpoint out of reach is that, never a failed step."""
    try:
        return s.client.get("/health", timeout=min(30.0, s.opts.timeout))
    except EndpointDown as exc:
        raise Unreachable(f"--endpoint {log.redact(s.opts.endpoint)}: {exc}") from None


def loaded(s: Session) -> StepResult:
    """/health, /v1/models names the model, /version against the image's, /metrics' cache config."""
    health = reach(s)
    # A server without /health (not vLLM) is judged by /v1/models alone; any other error fails.
    if not health.ok and health.status != 404:
        return StepResult(Step.LOADED, Outcome.FAIL, f"/health answered HTTP {health.status}")
    ids, entry, why = _models(s)
    if why:
        return StepResult(Step.LOADED, Outcome.FAIL, why)
    s.facts["health"] = "ok" if health.ok else "no /health (HTTP 404): /v1/models answered"
    _server_facts(s, ids, entry)
    want = _expected_model(s)
    if want is not None and want not in ids:
        return StepResult(Step.LOADED, Outcome.FAIL, f"the server serves {ids or 'no model'}, not {want!r}", s.facts)
    if not ids:
        return StepResult(Step.LOADED, Outcome.FAIL, "/v1/models lists no model", s.facts)
    s.model = want or ids[0]
    version, why = _version(s)
    s.facts["version"], s.facts["version_why"] = version, why
    notes = [f"serves {s.model!r}" + ("" if want else " (no --model or --target: the first listed)")]
    if s.opts.version and version and version != s.opts.version:
        return StepResult(
            Step.LOADED,
            Outcome.FAIL,
            f"/version says {version}, the image ({s.opts.version_from}) carries {s.opts.version}",
            s.facts,
        )
    notes.append(
        f"version {version}" + (f" = {s.opts.version_from}" if s.opts.version and version else "")
        if version
        else f"version unknown: {why}"
    )
    caching = s.facts["prefix_caching"]
    wanted = s.opts.expected.prefix_caching if s.opts.expected else None
    if wanted is not None and caching is not None and caching != wanted:
        return StepResult(
            Step.LOADED,
            Outcome.FAIL,
            f"the recipe launches with enable_prefix_caching={wanted}, the process runs with {caching} "
            "(cache_config_info): the flag did not reach it",
            s.facts,
        )
    notes.append(
        "cache_config_info: not exported" if caching is None else f"enable_prefix_caching={caching} in the process"
    )
    return StepResult(Step.LOADED, Outcome.PASS, "; ".join(notes), dict(s.facts))


def streamed_result(step: Step, out: Streamed, extra: dict | None = None) -> StepResult | None:
    """The failing result of a streamed request, or None when it answered."""
    if out.error or out.status != 200:
        return StepResult(
            step, Outcome.FAIL, out.error or f"HTTP {out.status}", {"status": out.status, **(extra or {})}
        )
    if out.finish_reason is None:
        return StepResult(step, Outcome.FAIL, "the stream ended without a finish_reason", {"chunks": out.chunks})
    return None


def measured(out: Streamed) -> dict:
    usage = out.usage or {}
    details = usage.get("prompt_tokens_details") or {}
    return {
        "ttft_s": None if out.ttft is None else round(out.ttft, 4),
        "latency_s": round(out.latency, 4),
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "cached_tokens": details.get("cached_tokens") if isinstance(details, dict) else None,
        "finish_reason": out.finish_reason,
        "text": out.text[:200],
    }


def short(s: Session) -> StepResult:
    out = s.client.stream_chat(s.chat([{"role": "user", "content": f"[{s.nonce}] {SHORT_PROMPT}"}]))
    failed = streamed_result(Step.SHORT, out)
    if failed:
        return failed
    m = measured(out)
    return StepResult(
        Step.SHORT,
        Outcome.PASS,
        f"{m['completion_tokens']} tokens in {m['latency_s']:.2f}s (first after {m['ttft_s']}s)",
        m,
    )


def context_target(s: Session) -> tuple[int | None, str | None]:
    """The prompt length step 3 asks for: --context-tokens, else what the server's max_model_len
    leaves for the answer; (None, why) when neither is known or it cannot fit."""
    limit = s.facts.get("max_model_len")
    want = s.opts.context_tokens
    if want is None:
        if limit is None:
            return None, "give --context-tokens: the server does not report max_model_len"
        return limit - s.opts.max_tokens - ANSWER_ROOM, None
    if limit is not None and want + s.opts.max_tokens > limit:
        return (
            None,
            f"--context-tokens {want} + {s.opts.max_tokens} to answer exceeds the server's max_model_len {limit}",
        )
    return want, None


def context(s: Session) -> StepResult:
    target, why = context_target(s)
    if target is None:
        outcome = Outcome.FAIL if s.opts.context_tokens is not None else Outcome.NA
        return StepResult(Step.CONTEXT, outcome, why or "")
    wrap = lambda text: [{"role": "user", "content": f"[{s.nonce}] Summarise these records.\n{text}"}]  # noqa: E731
    try:
        messages, n = prompts.sized(s.client, s.model, target, wrap)
    except prompts.NoTokenizer as exc:
        return StepResult(Step.CONTEXT, Outcome.NA, f"no prompt of counted length: {exc}")
    out = s.client.stream_chat(s.chat(messages))
    failed = streamed_result(Step.CONTEXT, out, {"prompt_tokens_counted": n})
    if failed:
        return failed
    m = {**measured(out), "target_tokens": target, "prompt_tokens_counted": n}
    if m["prompt_tokens"] is not None and m["prompt_tokens"] != n:
        return StepResult(
            Step.CONTEXT, Outcome.FAIL, f"/tokenize counted {n}, the request used {m['prompt_tokens']}", m
        )
    return StepResult(Step.CONTEXT, Outcome.PASS, f"{n} prompt tokens: first token after {m['ttft_s']}s", m)

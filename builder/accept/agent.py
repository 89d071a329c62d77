"""Step 6, the agent features: a forced (named) tool call and a `required` one, each call's
arguments validated against the tool's JSON schema; `auto`, reported (informational); the tool
loop (the result sent back, a final answer comes); a `json_schema` response format, validated."""

from __future__ import annotations

import json
from typing import Any

from builder.accept.model import Outcome, Step, StepResult
from builder.accept.session import Session

AGENT_TOKENS = 512  # room for a tool call's arguments or a small JSON answer, after any reasoning

WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_forecast", "description": "The weather forecast for a city.", "parameters": WEATHER},
}
ANSWER: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "warm": {"type": "boolean"}},
    "required": ["city", "warm"],
    "additionalProperties": False,
}
ASK = "What is the weather in Lyon for the next two days?"


def schema_errors(value: Any, schema: dict) -> list[str]:
    """Every way ``value`` breaks ``schema`` (JSON Schema 2020-12), as short lines; [] when valid."""
    from jsonschema import Draft202012Validator

    errors = sorted(Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message[:160]}" for e in errors]


def parsed_json(text: str | None) -> tuple[Any, str | None]:
    try:
        return json.loads(text or ""), None
    except json.JSONDecodeError as exc:
        return None, f"not JSON ({exc.msg} at {exc.pos}): {(text or '')[:120]!r}"


def _message(s: Session, body: dict) -> tuple[dict | None, str | None]:
    reply = s.client.post("/v1/chat/completions", body)
    doc = reply.json()
    if not reply.ok or not isinstance(doc, dict):
        return None, f"HTTP {reply.status}: {reply.text[:200]}"
    choice = (doc.get("choices") or [{}])[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        return None, "no message in the answer"
    return {**message, "finish_reason": choice.get("finish_reason")}, None


def check_call(message: dict | None) -> tuple[dict | None, str | None]:
    """The first tool call of ``message`` if it names the tool and its arguments fit the schema."""
    calls = (message or {}).get("tool_calls") or []
    if not calls:
        cut = " (cut at the token limit)" if (message or {}).get("finish_reason") == "length" else ""
        return None, f"no tool call{cut} (content: {str((message or {}).get('content'))[:120]!r})"
    function = calls[0].get("function") or {}
    if function.get("name") != TOOL["function"]["name"]:
        return None, f"called {function.get('name')!r}, not {TOOL['function']['name']!r}"
    args, why = parsed_json(function.get("arguments"))
    if why:
        return None, f"arguments {why}"
    errors = schema_errors(args, WEATHER)
    return (calls[0], None) if not errors else (None, "arguments break the schema: " + "; ".join(errors[:3]))


def _tool_case(s: Session, choice: Any) -> tuple[dict, dict | None]:
    body = s.chat([{"role": "user", "content": ASK}], tools=[TOOL], tool_choice=choice, max_tokens=AGENT_TOKENS)
    message, why = _message(s, body)
    call, bad = check_call(message) if not why else (None, why)
    return {"ok": bad is None, "why": bad, "call": call}, call


def _loop(s: Session, call: dict) -> dict:
    """The tool's result sent back after ``call``: a final answer (content, no new call) must come."""
    messages: list[dict] = [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call.get("id") or "call-0", "content": '{"forecast": "sunny, 24 C"}'},
    ]
    message, why = _message(s, s.chat(messages, tools=[TOOL], tool_choice="none", max_tokens=AGENT_TOKENS))
    if why:
        return {"ok": False, "why": why}
    content = (message or {}).get("content")
    if not content or (message or {}).get("tool_calls"):
        return {"ok": False, "why": f"no final answer (content {content!r})"}
    return {"ok": True, "why": None, "answer": content[:200]}


def _json_schema(s: Session) -> dict:
    body = s.chat(
        [{"role": "user", "content": "Is it warm in Lyon today? Answer as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}},
        max_tokens=AGENT_TOKENS,
    )
    message, why = _message(s, body)
    if why:
        return {"ok": False, "why": why}
    value, why = parsed_json((message or {}).get("content"))
    errors = schema_errors(value, ANSWER) if why is None else [why]
    return {"ok": not errors, "why": "; ".join(errors[:3]) or None, "value": value}


def agent(s: Session) -> StepResult:
    named, call = _tool_case(s, {"type": "function", "function": {"name": TOOL["function"]["name"]}})
    required, _ = _tool_case(s, "required")
    auto, _ = _tool_case(s, "auto")
    results = {
        "forced": named,
        "required": required,
        "tool_loop": _loop(s, call) if call else {"ok": False, "why": "no forced call to answer"},
        "json_schema": _json_schema(s),
    }
    auto_line = "called the tool" if auto["ok"] else f"no valid call ({str(auto['why'])[:80]})"
    measured = {**results, "auto": {**auto, "informational": True}}
    failed = [f"{name}: {r['why']}" for name, r in results.items() if not r["ok"]]
    if failed:
        return StepResult(Step.AGENT, Outcome.FAIL, "; ".join(failed)[:600], measured)
    return StepResult(
        Step.AGENT,
        Outcome.PASS,
        f"forced and required calls validate, the tool loop answers, json_schema validates; auto: {auto_line}",
        measured,
    )

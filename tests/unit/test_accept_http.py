"""`build accept` against a server that is OpenAI-compatible but not vLLM (no /health, /version,
/metrics or /tokenize; a chat template without tools), served on 127.0.0.1 by this test: what
cannot be measured is n/a with the reason, never a pass, and the agent step fails on the
server's own refusal. The real vLLM server: tests/integration/test_accept.py."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from builder.accept.run import run
from builder.accept.session import Options

KEY = "sk-plain-openai-test-7c1d"


class _Plain(BaseHTTPRequestHandler):
    seen_keys: list[str] = []

    def log_message(self, *args):  # quiet
        pass

    def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        _Plain.seen_keys.append(self.headers.get("Authorization", ""))
        if self.path == "/v1/models":
            return self._send(200, json.dumps({"object": "list", "data": [{"id": "plain-model"}]}).encode())
        return self._send(404, b'{"error": "not found"}')

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/chat/completions":
            return self._send(404, b'{"error": "not found"}')
        if "tools" in body or "response_format" in body:
            return self._send(400, b'{"error": {"message": "this template has no tools"}}')
        if not body.get("stream"):
            message = {"role": "assistant", "content": "hello"}
            return self._send(200, json.dumps({"choices": [{"message": message, "finish_reason": "stop"}]}).encode())
        events = [
            {"choices": [{"delta": {"content": "hi"}, "finish_reason": None}]},
            {"choices": [{"delta": {}, "finish_reason": "stop"}]},
            {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 1}},
        ]
        data = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return self._send(200, data.encode(), "text/event-stream")


@pytest.fixture()
def plain():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Plain)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_plain_openai_server_gets_na_with_reasons_never_a_false_pass(plain, tmp_path):
    from builder import log

    log.register_secret(KEY)
    opts = Options(endpoint=plain + "/v1", out=tmp_path, context_tokens=100, max_concurrency=2)
    doc = run(opts, KEY, tmp_path)
    steps = {s["step"]: s for s in doc["steps"]}
    assert [steps[n]["outcome"] for n in range(1, 8)] == ["pass", "pass", "n/a", "n/a", "pass", "fail", "n/a"]
    assert "version unknown: /version answered HTTP 404" in steps[1]["reason"]
    assert "cache_config_info: not exported" in steps[1]["reason"]
    assert doc["launch"]["server"]["health"].startswith("no /health")
    assert steps[3]["reason"] == "no prompt of counted length: /tokenize answered HTTP 404"
    assert steps[4]["reason"].startswith("the shared prefix cannot be counted")
    assert "forced: HTTP 400" in steps[6]["reason"] and "this template has no tools" in steps[6]["reason"]
    assert doc["outcome"] == "fail" and doc["signs"]["prefix_caching_as_expected"].startswith("not measured")
    assert all(k == f"Bearer {KEY}" for k in _Plain.seen_keys)  # the key is sent ...
    files = [p for p in Path(tmp_path).rglob("*") if p.is_file() and p.suffix != ".png"]
    assert files and not any(KEY in p.read_text() for p in files)  # ... and never written
    evidence = json.loads((tmp_path / "steps" / "01-loaded-no-traffic.json").read_text())
    assert evidence["metrics"] == "n/a: /metrics answered HTTP 404"
    assert evidence["gpu"] == {"state": None, "why": "n/a: no --gpu-state given"}
    assert evidence["server_log"] == "n/a: no --server-log given"


def test_without_context_tokens_and_max_model_len_step_3_asks_for_it(plain, tmp_path):
    doc = run(Options(endpoint=plain, out=tmp_path, max_concurrency=1), None, tmp_path)
    step3 = doc["steps"][2]
    assert (step3["outcome"], step3["reason"]) == (
        "n/a",
        "give --context-tokens: the server does not report max_model_len",
    )


class _Odd(_Plain):
    """Answers of a shape no OpenAI-compatible server gives: choices as a string."""

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        data = 'data: {"choices": "not a list"}\n\ndata: [DONE]\n\n'
        return self._send(200, data.encode(), "text/event-stream")


def test_an_answer_of_the_wrong_shape_fails_its_step_and_keeps_the_evidence(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Odd)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        doc = run(Options(endpoint=f"http://127.0.0.1:{server.server_address[1]}", out=tmp_path), None, tmp_path)
    finally:
        server.shutdown()
        server.server_close()
    step2 = doc["steps"][1]
    assert step2["outcome"] == "fail" and step2["reason"].startswith(
        "could not read the server's answer: AttributeError"
    )
    evidence = json.loads((tmp_path / "steps" / "02-short-request.json").read_text())
    assert [e["request"] for e in evidence["exchanges"]][0] == "POST /v1/chat/completions"
    assert [s["ran"] for s in doc["steps"]] == [True, True, False, False, False, False, False]


def test_the_command_prints_writes_the_step_summary_and_exits_1_on_a_failing_step(plain, tmp_path, monkeypatch, capsys):
    from builder import cli

    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("K3_ACCEPT_API_KEY", KEY)
    argv = [
        "accept",
        "--endpoint",
        plain,
        "--out",
        str(tmp_path / "r"),
        "--context-tokens",
        "50",
        "--format",
        "markdown",
    ]
    with pytest.raises(SystemExit) as exc:
        cli.main([*argv, "--max-concurrency", "1"])
    assert exc.value.code == 1
    out, err = capsys.readouterr()
    assert "| 6 | agent | fail |" in out and "| 6 | agent | fail |" in summary.read_text()
    assert "  6  agent                fail " in err  # the progress table on stderr
    assert (tmp_path / "r" / "accept.md").read_text() == summary.read_text()
    assert KEY not in out + err + summary.read_text()

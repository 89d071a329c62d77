"""The command line: global options before or after the command; plan needs no network."""

from __future__ import annotations

import socket

import pytest

from builder.cli import _parser, main
from tests.conftest import REPO


@pytest.mark.parametrize("command", ["render", "lock", "plan", "build"])
def test_matrix_and_target_before_or_after_the_command(command):
    p = _parser()
    before = p.parse_args(["--matrix", "m.yaml", "--target", "t", command])
    after = p.parse_args([command, "--matrix", "m.yaml", "--target", "t"])
    mixed = p.parse_args(["--matrix", "m.yaml", command, "--target", "t"])
    for ns in (after, mixed):
        assert (ns.command, str(ns.matrix), ns.target) == (before.command, str(before.matrix), before.target)
    assert str(before.matrix) == "m.yaml" and before.target == ["t"]


def test_defaults():
    ns = _parser().parse_args(["plan"])
    assert str(ns.matrix) == "matrix.yaml" and ns.target == []


def test_target_is_always_a_list_and_repeats_count_once():
    p = _parser()
    assert p.parse_args(["--target", "a", "build"]).target == ["a"]
    assert p.parse_args(["--target", "a,b", "--target", "a", "build"]).target == ["a", "b"]
    assert p.parse_args(["--target", "smoke", "--target", "smoke"]).target == ["smoke"]


def test_help_documents_each_command(capsys):
    for command in ("render", "lock", "plan", "build", "smoke-init"):
        with pytest.raises(SystemExit) as info:
            main([command, "--help"])
        assert info.value.code == 0
        assert "usage: build" in capsys.readouterr().out


@pytest.fixture()
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("network access during plan")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_plan_for_the_real_target_is_offline_and_complete(no_network, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as info:
        main(["plan", "--target", "cu129", "--no-source"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for needle in (
        "nvidia/cuda:12.9.1-devel-ubuntu22.04@sha256:38804006c937a83f28f63a959abcee688042072319c8614ad57b350958a30bd3",
        "runtime base                 nvidia/cuda:12.9.1-devel-ubuntu22.04@sha256:",
        "0.30.0+cu129 (told through VLLM_VERSION_OVERRIDE)",
        "VLLM_CUTLASS_SRC_DIR",
        "MAX_JOBS=64 NVCC_THREADS=8",
        "ced6857afa0ea7b2e3f0846a62e1394e90f15607",
        "2.13.0+cu129",
        "0.6.18.post1",
        "2.30.7",
        "TORCH_CUDA_ARCH_LIST=",
        "NVCC_THREADS=8",
        "ghcr.io/k3-cu129/vllm-openai:kimi-k3-cu129",
    ):
        assert needle in out


def test_no_target_means_every_target(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as info:
        main(["plan", "--no-source"])
    assert info.value.code == 0 and "cu129: vLLM for Kimi K3" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv", [["plan", "--target", "nope"], ["lock", "--target", "nope"], ["test", "--target", "cu129,nope"]]
)
def test_bad_target_is_exit_2(argv, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_test_platform_is_read_before_anything_is_contacted(capsys, monkeypatch):
    """`build test --platform` with a value no target names: exit 2 with a "did you mean", before
    the registry (port 9 of 127.0.0.1: nothing listens, so contacting it would be exit 3)."""
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as info:
        main(["test", "--platform", "linux/arm46", "--image", "127.0.0.1:9/k3/none@sha256:" + "0" * 64])
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert "--platform linux/arm46: no target is built for it" in err and "did you mean 'linux/arm64'?" in err
    with pytest.raises(SystemExit) as info:
        main(["test", "--platform", "linux/amd64", "--platform", "linux/arm64", "--image", "127.0.0.1:9/k3/none:x"])
    assert info.value.code == 2 and "check one platform at a time" in capsys.readouterr().err

"""Inputs that never end or never answer are refused before they are read: exit 2, one line."""

from __future__ import annotations

import contextlib
import io
import os
import threading

import pytest

from builder import cli
from tests.conftest import REPO


def _run(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            cli.main(list(argv))
        except SystemExit as exc:
            return exc.code, err.getvalue()
    return 0, err.getvalue()


@pytest.fixture()
def fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    yield path
    # Unblock anything that did open it after all (a failing test must not hang the suite).
    threading.Thread(target=lambda: open(path, "w").close(), daemon=True).start()


@pytest.mark.parametrize(
    "argv",
    [
        ("--matrix", "/dev/zero", "plan", "--target", "cu129"),
        ("--matrix", "/dev/urandom", "plan", "--target", "cu129"),
        (
            "--matrix",
            str(REPO / "matrix.yaml"),
            "doctor",
            "--image",
            "127.0.0.1:9/x/y:z",
            "--nvidia-smi-file",
            "/dev/zero",
        ),
    ],
)
def test_endless_files_are_refused(argv):
    code, err = _run(*argv)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "not a regular file" in lines[0] and "Traceback" not in err


def test_a_fifo_matrix_is_refused_without_blocking(fifo):
    code, err = _run("--matrix", str(fifo), "plan", "--target", "cu129")
    assert code == 2 and "not a regular file" in err


def test_secret_sources_that_never_end_or_are_not_text_are_refused(tmp_path, monkeypatch):
    from builder.config.options import parse_secrets
    from builder.errors import ConfigError

    binary = tmp_path / "bin"
    binary.write_bytes(b"\xff\xfe\x00")
    for src, message in (("/dev/zero", "not a regular file"), (str(binary), "not UTF-8")):
        with pytest.raises(ConfigError, match=message):
            parse_secrets([f"id=tok,src={src}"], {"tok"})
    # A value pasted where a variable name belongs is never echoed back.
    with pytest.raises(ConfigError) as info:
        parse_secrets(["id=tok,env=hunter2-is-my-password"], {"tok"})
    assert "hunter2" not in info.value.message


def test_a_multi_line_secret_is_redacted_line_by_line(tmp_path):
    from builder import log
    from builder.config.options import parse_secrets

    netrc = tmp_path / "netrc"
    netrc.write_text("machine pypi.internal.example\nlogin deploy\npassword s3cr3t-Pa55word\n")
    parse_secrets([f"id=netrc,src={netrc}"], {"netrc"})
    line = "#7 0.5 curl: using password s3cr3t-Pa55word for machine pypi.internal.example"
    assert "s3cr3t-Pa55word" not in log.redact(line)


def test_repeated_targets_build_once():
    p = cli._parser()
    assert p.parse_args(["--target", "smoke"] * 5000).target == ["smoke"]

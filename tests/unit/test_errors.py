"""Exit codes: every failure class has its own, and `cli.main` is the one place that turns a raised
error (or an interrupt) into that exit, a one-line message and, with --json, a JSON document."""

from __future__ import annotations

import json
import os
import signal

import pytest

from builder import cli, errors, log
from tests.conftest import REPO


@pytest.fixture(autouse=True)
def no_secrets(monkeypatch):
    monkeypatch.setattr(log, "_secrets", set())


# The docs' table (docs/guarantees.md, "Exit codes"), class by class.
EXIT_CODES = [
    (errors.BuilderError, 1),
    (errors.ConfigError, 2),
    (errors.RecordError, 2),
    (errors.SourceError, 2),
    (errors.LockError, 2),
    (errors.Unreachable, 3),
    (errors.EngineUnavailable, 3),
    (errors.RegistryUnavailable, 3),
    (errors.BuildError, 1),
    (errors.CheckFailed, 1),
    (errors.KernelPlanFailed, 1),
    (errors.VerifyFailed, 1),
    (errors.NotReproduced, 1),
    (errors.DriftError, 1),
    (errors.Busy, 75),
    (errors.HostResources, 74),
    (errors.Interrupted, 130),
]


def test_every_error_class_is_in_the_table():
    known = {cls for cls, _ in EXIT_CODES}
    defined = {obj for obj in vars(errors).values() if isinstance(obj, type) and issubclass(obj, errors.BuilderError)}
    assert defined == known


def test_the_exit_codes_table_in_the_docs_is_the_code_s():
    doc = (REPO / "docs" / "guarantees.md").read_text()
    section = doc.split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| `")]
    table = {
        name.strip("` "): int(code.strip("` ")) for code, _, names in rows for name in names.split(",") if name.strip()
    }
    assert table == {cls.__name__: code for cls, code in EXIT_CODES}


@pytest.mark.parametrize("cls,code", EXIT_CODES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_each_error_class_has_its_exit_code(cls, code):
    assert cls.exit_code == code
    assert cls("x").exit_code == code
    assert cls("why it failed").message == "why it failed"
    assert str(cls("why it failed")) == "why it failed"


def test_registry_unavailable_is_an_engine_unavailable():
    # Callers that catch "the engine is out of reach" also catch the registry being out of reach.
    assert issubclass(errors.RegistryUnavailable, errors.EngineUnavailable)


def test_a_build_error_names_its_log():
    exc = errors.BuildError("buildx build failed", "/a/build.log")
    assert exc.message == "buildx build failed (log: /a/build.log)" and exc.log_path == "/a/build.log"
    plain = errors.BuildError("buildx build failed")
    assert plain.message == "buildx build failed" and plain.log_path is None


@pytest.mark.parametrize(
    "text,network",
    [
        ("fatal: unable to access 'https://github.com/x/': Could not resolve host: github.com", True),
        ("error: Connection refused (os error 111)", True),
        ("Failed to fetch: `https://pypi.org/simple/torch/`", True),
        ("error sending request for url", True),
        ("operation timed out", True),
        ('ERROR: Get "http://127.0.0.1:5000/v2/": dial tcp 127.0.0.1:5000: connect: connection refused', True),
        ("ERROR: failed to push: read tcp 10.0.0.2:443: i/o timeout", True),
        ("No solution found when resolving dependencies: torch==9.9 is unavailable", False),
        ("", False),
    ],
)
def test_network_failures_are_told_apart_from_bad_input(text, network):
    assert errors.is_network_failure(text) is network
    assert errors.is_network_failure(text.upper()) is network  # case does not matter


def _main(monkeypatch, raiser, *argv):
    """Run cli.main with the `plan` command replaced by ``raiser``; (exit code, stdout, stderr)."""
    monkeypatch.setitem(cli.COMMANDS, "plan", raiser)
    with pytest.raises(SystemExit) as info:
        cli.main(["plan", *argv])
    return info.value.code


@pytest.mark.parametrize("cls,code", EXIT_CODES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_main_exits_with_the_raised_errors_code(monkeypatch, capsys, cls, code):
    def raiser(args, out):
        raise cls("the thing failed")

    assert _main(monkeypatch, raiser) == code
    captured = capsys.readouterr()
    assert captured.err == "error: the thing failed\n" and captured.out == ""


@pytest.mark.parametrize(
    "cls,code",
    [
        (errors.LockError, 2),
        (errors.EngineUnavailable, 3),
        (errors.RegistryUnavailable, 3),
        (errors.Unreachable, 3),
        (errors.Busy, 75),
    ],
)
def test_main_json_failure_document(monkeypatch, capsys, cls, code):
    def raiser(args, out):
        out.data["partial"] = "kept"
        raise cls("out of reach: https://u:tok3n@host/x")

    assert _main(monkeypatch, raiser, "--json") == code
    doc = json.loads(capsys.readouterr().out)
    assert doc == {"ok": False, "exit_code": code, "error": "out of reach: https://***@host/x", "partial": "kept"}


def test_main_success_exit_code_and_json(monkeypatch, capsys):
    def ok(args, out):
        out.data["answer"] = 42
        return 0

    assert _main(monkeypatch, ok, "--json") == 0
    assert json.loads(capsys.readouterr().out) == {"ok": True, "exit_code": 0, "answer": 42}
    assert _main(monkeypatch, lambda args, out: 1) == 1  # a command's own non-zero result (doctor: incompatible)
    assert json.loads(capsys.readouterr().out or "null") is None  # no --json: no document


@pytest.mark.parametrize("how", ["keyboard", "sigterm"])
def test_an_interrupt_is_exit_130_and_touches_no_record(monkeypatch, capsys, how):
    def raiser(args, out):
        if how == "sigterm":
            # What a CI runner's cancel sends: main installed the handler that turns it into Ctrl-C.
            assert signal.getsignal(signal.SIGTERM) is cli._terminate
            cli._terminate(signal.SIGTERM, None)
        raise KeyboardInterrupt

    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert _main(monkeypatch, raiser, "--json") == 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    captured = capsys.readouterr()
    assert captured.err == "error: interrupted; records untouched\n"
    assert json.loads(captured.out) == {"ok": False, "exit_code": 130, "error": "interrupted; records untouched"}


def test_an_inherited_ignore_of_sigint_is_undone(monkeypatch, capsys):
    """`build ... &` from a script starts with SIGINT ignored; a deliberate kill -INT must still stop it."""
    seen = []

    def command(args, out):
        seen.append(signal.getsignal(signal.SIGINT))
        os.kill(os.getpid(), signal.SIGINT)  # delivered to this (main) thread before the next bytecode
        return 0

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert _main(monkeypatch, command) == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == [signal.default_int_handler]
    assert capsys.readouterr().err == "error: interrupted; records untouched\n"


def test_sigterm_handler_raises_keyboard_interrupt():
    with pytest.raises(KeyboardInterrupt):
        cli._terminate(signal.SIGTERM, None)


def test_error_messages_are_one_line_and_redacted(monkeypatch, capsys):
    log.register_secret("hf_0123456789abcdef")

    def raiser(args, out):
        raise errors.ConfigError("bad\nvalue\x1b[31m hf_0123456789abcdef\tend")

    assert _main(monkeypatch, raiser) == 2
    err = capsys.readouterr().err
    assert err == "error: bad\\nvalue\\x1b[31m ***\\tend\n"


def test_an_unexpected_exception_is_not_swallowed(monkeypatch):
    def raiser(args, out):
        raise ValueError("a bug")

    monkeypatch.setitem(cli.COMMANDS, "plan", raiser)
    with pytest.raises(ValueError):
        cli.main(["plan"])


def test_no_command_and_no_target_prints_help_and_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([])
    assert info.value.code == 2
    assert "usage: build" in capsys.readouterr().err


def test_no_command_with_a_target_is_build(monkeypatch):
    seen = []
    monkeypatch.setitem(cli.COMMANDS, "build", lambda args, out: seen.append(args.target) or 0)
    with pytest.raises(SystemExit) as info:
        cli.main(["--target", "smoke"])
    assert info.value.code == 0 and seen == [["smoke"]]


def test_a_backslash_in_a_message_is_shown_as_it_is(monkeypatch, capsys):
    def raiser(args, out):
        raise errors.ConfigError("C:\\path\\to 'x'")

    assert _main(monkeypatch, raiser) == 2
    assert capsys.readouterr().err == "error: C:\\path\\to 'x'\n"


def test_the_json_document_is_indented_sorted_and_takes_paths(monkeypatch, capsys):
    from pathlib import Path

    def ok(args, out):
        out.data.update({"zeta": 1, "alpha": Path("/x/y")})
        return 0

    assert _main(monkeypatch, ok, "--json") == 0
    out = capsys.readouterr().out
    assert out == json.dumps({"ok": True, "exit_code": 0, "zeta": 1, "alpha": "/x/y"}, indent=2, sort_keys=True) + "\n"
    assert out.splitlines()[:3] == ["{", '  "alpha": "/x/y",', '  "exit_code": 0,']


def test_a_reader_that_left_is_not_an_error(monkeypatch):
    # `build plan | head`: stdout's reader is gone; the rest of the output goes to /dev/null, exit 0.
    import os

    calls = []

    def dup2(fd, fd2):
        calls.append((os.readlink(f"/proc/self/fd/{fd}"), fd2))
        os.close(fd)

    class Stdout:
        def fileno(self):
            return 1

    def raiser(args, out):
        raise BrokenPipeError

    import sys
    import types

    monkeypatch.setattr(
        cli, "os", types.SimpleNamespace(dup2=dup2, open=os.open, O_WRONLY=os.O_WRONLY, devnull=os.devnull)
    )
    monkeypatch.setattr(cli, "sys", types.SimpleNamespace(stdout=Stdout(), stderr=sys.stderr, exit=sys.exit))
    assert _main(monkeypatch, raiser) == 0
    assert calls == [(os.devnull, 1)]


@pytest.mark.parametrize(
    "error,expected",
    [
        (
            'ERROR: Get "http://127.0.0.1:5000/v2/": dial tcp 127.0.0.1:5000: connect: connection refused',
            "registry 127.0.0.1:5000 out of reach during the build",
        ),
        (
            "ERROR: failed to push 127.0.0.1:5000/k3/smoke:smoke: i/o timeout",
            "registry 127.0.0.1:5000 out of reach during the build",
        ),
        ("ERROR: no basic auth credentials", "registry 127.0.0.1:5000 refused the build's credentials"),
        ("ERROR: failed to push: 401 Unauthorized", "registry 127.0.0.1:5000 refused the build's credentials"),
        # A network failure inside a RUN step is the build's own (it names another host): exit 1.
        ('ERROR: process "pip download" did not complete: Could not resolve host: pypi.org', None),
        # The registry named, but neither out of reach nor refusing credentials: a failed build.
        ("ERROR: failed to push 127.0.0.1:5000/k3/smoke:smoke: unexpected status: 400 Bad Request", None),
        # The registry answering 503 to the push (issue 21): out of our hands, exit 3, the registry named.
        (
            "ERROR: failed to push 127.0.0.1:5000/k3/smoke:smoke: unexpected status from HEAD request to "
            "http://127.0.0.1:5000/v2/k3/smoke/blobs/sha256:ab: 503 Service Unavailable",
            "registry 127.0.0.1:5000 answered 503 Service Unavailable during the push",
        ),
        (
            "ERROR: failed to push 127.0.0.1:5000/k3/smoke:smoke: unexpected status code: 502",
            "registry 127.0.0.1:5000 answered status code: 502",
        ),
        # A RUN step's index answering 503 names another host: the build's own failure.
        ("ERROR: pip download: https://pypi.org/simple/x/: 503 Service Unavailable", None),
    ],
)
def test_a_registry_out_of_reach_during_the_build_is_told_apart(error, expected):
    from builder.engine.buildx import _registry_failure

    found = _registry_failure(error, ("127.0.0.1:5000/k3/smoke:smoke",))
    assert (found is None) if expected is None else found.startswith(expected)


@pytest.mark.parametrize(
    "exc,code",
    [
        (OSError(28, "No space left on device", "/x/artifacts/smoke/b/build.log"), 74),
        (OSError(30, "Read-only file system", "/x/locks/smoke/image.json"), 74),
        (MemoryError(), 74),
        (RuntimeError("can't start new thread"), 74),
    ],
)
def test_resource_exhaustion_has_its_own_exit_code_and_one_line(exc, code, monkeypatch, capsys):
    """A full or read-only disk, a memory or thread limit: exit 74 and one line, never a traceback
    nor 'bad input' (issue 21)."""
    from builder import cli
    from builder.errors import host_resources

    def fail(args, out):
        raise exc

    monkeypatch.setitem(cli.COMMANDS, "plan", fail)
    with pytest.raises(SystemExit) as done:
        cli.main(["--json", "plan", "--target", "cu129"])
    assert done.value.code == code == host_resources(exc).exit_code
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and '"exit_code": 74' in captured.out
    assert captured.err.strip().splitlines()[-1].startswith("error: ")


def test_other_os_errors_are_not_called_resource_exhaustion():
    from builder.errors import host_resources

    assert host_resources(OSError(2, "No such file or directory")) is None
    assert host_resources(RuntimeError("something else")) is None

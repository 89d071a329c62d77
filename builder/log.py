"""The one logger: steps with timings, CI log groups, and a final summary table.

Human output goes to stderr (stdout stays clean for machine-readable results, e.g. the image
reference that ci/demo.sh prints last). Under GitHub Actions each step is a collapsible log
group and the summary table is appended to $GITHUB_STEP_SUMMARY.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console


class _LazyConsole:
    """rich's Console, made on first use: importing rich costs ~30 ms that commands printing
    nothing (a no-op build's fast path prints little) should not pay up front."""

    _real: Console | None = None

    def __getattr__(self, name: str):
        if _LazyConsole._real is None:
            from rich.console import Console

            # Wide when not a terminal (CI logs), so digests in the summary table are never cut.
            _LazyConsole._real = Console(
                stderr=True, highlight=False, soft_wrap=True, width=None if sys.stderr.isatty() else 200
            )
        return getattr(_LazyConsole._real, name)


_console = _LazyConsole()


def _in_actions() -> bool:
    return os.environ.get("GITHUB_ACTIONS") == "true"


_secrets: set[str] = set()
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s:]+(?::[^/@\s]*)?@")
# user:pass@host with no scheme (K3_REGISTRY=user:pass@host) is a credential too; an image
# reference's name:tag@sha256:... is not.
_BARE_CREDENTIALS = re.compile(r"(?<![\w/:.@%+-])[A-Za-z0-9._%+-]+:[^\s/@:'\"]+@(?!sha256:)(?=[A-Za-z0-9\[])")


def register_secret(value: str) -> None:
    """A value that must never be printed (a --secret's content); redacted from every line.

    Output is redacted line by line, so a multi-line value (a netrc, a key file) is registered
    line by line too, and each credential-looking word in it (8+ characters with a digit or a
    symbol: a password after `password`, a token) on its own."""
    candidates = {value.strip()}
    for line in value.splitlines():
        candidates.add(line.strip())
        candidates.update(w for w in line.split() if len(w) >= 8 and not w.isalpha())
    _secrets.update(c for c in candidates if len(c) >= 4)


def register_secret_forms(value: str, forms: tuple[str, ...]) -> None:
    """A secret and every other form it is written in (a shell-quoted line in a secret file):
    each is redacted, and each is looked for in the built image's layers."""
    register_secret(value)
    for form in forms:
        register_secret(form)


def secret_values() -> frozenset[str]:
    """Every registered secret value and written form (for the scan of the built image)."""
    return frozenset(_secrets)


def redact(text: str) -> str:
    """Credentials in URLs (scheme://user:pass@host, or user:pass@host without a scheme) and
    registered secret values -> '***'."""
    text = _URL_CREDENTIALS.sub(r"\1***@", text)
    text = _BARE_CREDENTIALS.sub("***@", text)
    for value in sorted(_secrets, key=len, reverse=True):
        text = text.replace(value, "***")
    return text


def shown(value: object, limit: int = 60) -> str:
    """A value quoted in a message: redacted first, then cut (a cut first could split the '@'
    off a credential URL and leave the password to print)."""
    text = repr(redact(value) if isinstance(value, str) else value)
    if not isinstance(value, str):
        text = redact(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# Control characters upstream text may carry (a commit subject, a build's output, a capture file, a
# foreign image's label): ESC starts terminal sequences (retitle the window, rewrite earlier lines,
# OSC 52 writes the clipboard), CR and BS overwrite what was printed, C1 (0x80-0x9f) holds 8-bit
# CSI; the bidi controls (U+061C, U+200E/F, U+202A-U+202E, U+2066-U+2069) reorder what a reader
# sees (Trojan Source); U+2028/U+2029 break a line where a terminal or an editor shows one; the
# zero-width joiners and every other format character (Unicode category Cf) hide in plain text.
# Newline and tab are text, except in a field (``field=True``): one value printed in a line.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u2028\u2029]")
_FIELD_CONTROL = re.compile("[\t\n]")


def _escaped(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str, *, field: bool = False) -> str:
    """``text`` with every control and format character (Unicode Cc, Cf, Zl, Zp) but newline and
    tab written as a visible escape (ESC -> ``\\x1b``, U+202E -> ``\\u202e``): safe for a terminal,
    a CI log or a Markdown record. ``field``: newline and tab too (one value inside a line). The one
    helper every printed field goes through."""
    out = _CONTROL.sub(lambda m: _escaped(m.group()), text)
    if field:
        out = _FIELD_CONTROL.sub(lambda m: _escaped(m.group()), out)
    if out.isascii():
        return out
    return "".join(_escaped(ch) if unicodedata.category(ch) == "Cf" else ch for ch in out)


def info(message: str) -> None:
    _console.print(printable(redact(message)), markup=False)


def warn(message: str) -> None:
    _console.print(f"warning: {printable(redact(message))}", style="yellow", markup=False)


def plain() -> bool:
    """Whether stderr is plain text (a CI log, a pipe, ``| tee``, a file), not a terminal: the
    build's log is then relayed one line per step (engine.buildlog.Relay)."""
    return not sys.stderr.isatty()


_quiet_raw = False


def quiet_build_output(quiet: bool) -> None:
    """With several builds at once their logs would interleave: keep them in their files only."""
    global _quiet_raw
    _quiet_raw = quiet


def raw(line: str) -> None:
    """A line of a child's output (the build log): redacted, its control characters escaped (the
    build runs upstream code, whose output must not drive the operator's terminal)."""
    if _quiet_raw:
        return
    sys.stderr.write(printable(redact(line)) + "\n")
    sys.stderr.flush()


HEARTBEAT_SECONDS = 30.0  # a long step says it is alive this often (plain lines, CI logs)


@contextlib.contextmanager
def _alive(name: str, start: float) -> Iterator[None]:
    """Progress for a long step: a spinner with the elapsed time on a terminal, a plain line every
    HEARTBEAT_SECONDS elsewhere (a CI log shows the step did not hang)."""
    if sys.stderr.isatty() and not _in_actions():
        with _console.status(f"{name}", spinner="dots"):
            yield
        return
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_SECONDS):
            _console.print(f"    ... still running: {name} ({time.monotonic() - start:.0f}s)", markup=False)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()


# K3_STEP_TIMES=FILE: each finished step appends "<seconds>\t<done|FAILED|interrupted>\t<name>" to
# FILE, so a script running several commands (ci/demo.sh) can sum up where its time went.
STEP_TIMES_ENV = "K3_STEP_TIMES"
_times_lock = threading.Lock()


def _record_time(name: str, took: float, word: str) -> None:
    path = os.environ.get(STEP_TIMES_ENV)
    if not path:
        return
    line = f"{took:.1f}\t{word}\t{printable(redact(name), field=True)}\n"
    with _times_lock, contextlib.suppress(OSError):  # a timing lost is no failure of the step
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line)


@contextlib.contextmanager
def step(name: str, long: bool = False) -> Iterator[None]:
    """A named step with its timing (and a CI log group); ``long`` steps show progress."""
    if _in_actions():
        sys.stderr.write(f"::group::{name}\n")
    _console.print(f"[bold]==>[/bold] {name}", markup=True)
    start = time.monotonic()
    ok, word = False, "FAILED"
    try:
        with _alive(name, start) if long else contextlib.nullcontext():
            yield
        ok, word = True, "done"
    except KeyboardInterrupt:  # the operator stopped it: not the step's failure
        word = "interrupted"
        raise
    finally:
        took = time.monotonic() - start
        if _in_actions():
            sys.stderr.write("::endgroup::\n")
        _console.print(f"    {word}: {name} ({took:.1f}s)", markup=False, style=None if ok else "red")
        _record_time(name, took, word)


@dataclass(frozen=True)
class SummaryRow:
    image: str
    digest: str
    size: str
    seconds: float
    status: str


def summary(rows: list[SummaryRow]) -> None:
    from rich.table import Table

    table = Table(title="build summary")
    for col in ("image", "digest", "size", "time", "status"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.image, r.digest, r.size, f"{r.seconds:.1f}s", r.status)
    _console.print(table)
    lines = ["| image | digest | size | time | status |", "|---|---|---|---|---|"]
    lines += [f"| `{r.image}` | `{r.digest}` | {r.size} | {r.seconds:.1f}s | {r.status} |" for r in rows]
    step_summary("\n".join(lines) + "\n")


def step_summary(markdown: str) -> None:
    """Append ``markdown`` to the GitHub Actions job summary ($GITHUB_STEP_SUMMARY), when set:
    the one writer every command's Markdown goes through, redacted like every other output."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(printable(redact(markdown)))

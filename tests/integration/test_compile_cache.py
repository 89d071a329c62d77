"""The compile cache shared across builders: Debian's redis-server as sccache's remote backend.

The backend (the `redis` fixture) and the opted-in target live here. That a first build fills it,
that a build rerunning the compile step (--no-cache) hits it for every unit, and that the
backend's password never leaves the BuildKit secret are shown by the builds of
test_app_layers.py (one chain of builds for both claims); this file shows the fallback when the
backend does not answer."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.conftest import cli

PASSWORD = "k3-redis-pw-7f3a9c"


def _bridge_address() -> str:
    """An address the engine's build containers reach on this machine: the docker0 bridge."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "docker0"], capture_output=True, text=True).stdout
    found = re.search(r"inet (\d+\.\d+\.\d+\.\d+)", out)
    assert found, "no docker0 bridge address: the build cannot reach a local backend"
    return found.group(1)


@pytest.fixture()
def redis():
    server = shutil.which("redis-server")
    assert server, "redis-server is missing: ci/setup.sh installs it"
    host = _bridge_address()
    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [server, "--bind", host, "--port", str(port), "--save", "", "--appendonly", "no", "--requirepass", PASSWORD],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(50):
            with socket.socket() as s:
                if s.connect_ex((host, port)) == 0:
                    break
            time.sleep(0.1)
        yield host, port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _dbsize(host: str, port: int) -> int:
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(f"AUTH {PASSWORD}\r\nDBSIZE\r\n".encode())
        time.sleep(0.2)
        reply = s.recv(4096).decode()
    return int(re.search(r":(\d+)\r\n", reply).group(1))


def _remote_target(smoke, dest: Path, tag: str):
    """A copy of the smoke target opted into the remote cache, under its own tag."""

    def opt_in(text: str) -> str:
        text, n = re.subn(r"(\n(\s+)max_jobs: 2\n)", r"\1\2remote_cache: true\n", text)
        assert n == 1
        return text

    work = smoke.variant(dest, tag, opt_in)
    dockerfile = (work.root / "dockerfiles" / "smoke" / "Dockerfile").read_text()
    assert "HAS NETWORK ACCESS" in dockerfile and "--mount=type=secret,id=k3_compile_cache" in dockerfile
    assert "FROM build AS compile-offline\n" in dockerfile and "FROM build AS compile-remote-cache\n" in dockerfile
    assert cli("--matrix", str(work.matrix), "lock", "--target", "smoke").code == 0
    return work


def _build(work, url: str) -> tuple[dict, str]:
    r = cli(
        "--json",
        "--matrix",
        str(work.matrix),
        "--target",
        "smoke",
        "--force",
        "--no-cache",
        "--no-checks",
        "--compile-cache",
        url,
    )
    assert r.code == 0, r.err[-3000:]
    assert PASSWORD not in r.out + r.err
    return json.loads(r.out)["builds"][0], r.err


def test_an_unreachable_backend_falls_back_to_the_local_cache(built, tmp_path):
    """A cache is an accelerator: a backend that does not answer costs its start-up timeout and a
    warning, not the build."""
    smoke, _ = built
    work = _remote_target(smoke, tmp_path / "down", "ccdown")
    with socket.socket() as s:  # a port nothing listens on
        s.bind((_bridge_address(), 0))
        port = s.getsockname()[1]
    out, err = _build(work, f"redis://:{PASSWORD}@{_bridge_address()}:{port}")
    assert out["compile_cache"]["backend_unreachable"] is True
    assert out["compile_cache"]["requests"] > 0
    assert "backend unreachable: local cache only" in err

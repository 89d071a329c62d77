"""`build lock`'s OS resolution around the container (builder/deps/oslock.py: resolve, closure):
the archive is asked from the host first (a real HTTP server on 127.0.0.1 answers the HEAD), a
missing suite or an archive out of reach is refused before any container runs, and the container's
answer becomes the lock. The container is a stand-in that returns what the resolution script prints
(the script itself runs in a container of the base: tests/integration/test_os_packages.py).
"""

from __future__ import annotations

import http.server
import socket
import threading

import pytest

from builder.deps import oslock
from builder.errors import LockError, Unreachable
from tests.unit.test_oslock import _cu129, _out

WHERE = "matrix.yaml: targets.cu129.os_packages"


class _Archive(http.server.BaseHTTPRequestHandler):
    status = 200
    seen: list[tuple[str, str]] = []

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
        type(self).seen.append((self.command, self.path))
        self.send_response(type(self).status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802 - a GET would be a change of method: answered, and recorded
        self.do_HEAD()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture()
def archive():
    """(url, handler class) of an archive on 127.0.0.1 that answers ``handler.status``."""
    handler = type("Archive", (_Archive,), {"status": 200, "seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/debian", handler
    server.shutdown()
    server.server_close()


class _Containers:
    """The engine's container seam: records what it was asked to run and prints ``out``."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.runs: list[tuple[str, str]] = []
        self.platforms: list[str | None] = []

    def run_online(self, ref: str, script: str, platform: str | None = None) -> str:
        self.runs.append((ref, script))
        self.platforms.append(platform)  # the OS lock resolves in a container of the platform it locks
        return self.out


class _Engine:
    def __init__(self, out: str) -> None:
        self.containers = _Containers(out)


def _target(archive_url: str):
    t = _cu129()
    return t.model_copy(update={"os_packages": t.os_packages.model_copy(update={"archive": archive_url})})


def _answer(archive_url: str, **kwargs) -> str:
    """The script's output for the two numactl packages, served from ``archive_url``."""
    return _out(**kwargs).replace(_cu129().os_packages.archive, archive_url)


def test_a_resolution_asks_the_archive_then_the_runtime_base_and_returns_the_lock(archive):
    url, handler = archive
    t = _target(url)
    engine = _Engine(_answer(url))
    text = oslock.resolve(engine, t, "matrix.yaml: ")
    assert handler.seen == [("HEAD", f"/debian/dists/{t.os_packages.suites[0]}/InRelease")]
    assert engine.containers.runs == [(t.bases.runtime.ref, oslock.resolve_script(t.os_packages))]
    assert engine.containers.platforms == [t.platform_names()[0]]  # resolved on the platform it locks
    entries = oslock.parse_resolution(_answer(url), t.os_packages, WHERE)
    assert text == oslock.lock_text(t, entries)
    assert [e.name for e in entries] == ["libnuma1", "numactl"]


def test_the_closure_is_name_to_version(archive):
    url, _ = archive
    t = _target(url)
    engine = _Engine(_answer(url))
    got = oslock.closure(engine, "example.test/base@sha256:" + "0" * 64, t.os_packages, WHERE)
    assert got == {"libnuma1": "2.0.14-3ubuntu2", "numactl": "2.0.14-3ubuntu2"}
    assert engine.containers.runs[0][0] == "example.test/base@sha256:" + "0" * 64


def test_a_suite_the_archive_does_not_have_is_refused_before_any_container(archive):
    url, handler = archive
    handler.status = 404
    t = _target(url)
    engine = _Engine(_answer(url))
    with pytest.raises(LockError) as e:
        oslock.resolve(engine, t, "matrix.yaml: ")
    suite = t.os_packages.suites[0]
    assert e.value.message == (
        f"{WHERE}.suites: {url}/dists/{suite}/InRelease answers HTTP 404; is {suite} in that archive?"
    )
    assert engine.containers.runs == []


def test_an_archive_out_of_reach_is_unreachable_before_any_container():
    with socket.socket() as s:  # a port nothing listens on: the connection is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/debian"
    engine = _Engine(_answer(url))
    with pytest.raises(Unreachable) as e:
        oslock.resolve(engine, _target(url), "matrix.yaml: ")
    assert e.value.message == (
        f"{WHERE}.archive: {url} is not reachable from here ([Errno 111] Connection refused); the OS lock "
        "cannot be made on this machine: run `build lock` where it is, and commit the lock"
    )
    assert engine.containers.runs == []


def test_a_base_that_has_every_package_is_nothing_to_lock(archive):
    url, _ = archive
    have = tuple(p.name for p in _cu129().os_packages.packages)
    engine = _Engine(_answer(url, sim=[], pkgs=[], have=have))
    with pytest.raises(LockError) as e:
        oslock.resolve(engine, _target(url), "matrix.yaml: ")
    assert e.value.message == (
        f"{WHERE}.packages: the runtime base already has every package listed; remove os_packages (nothing to lock)"
    )


def test_without_a_file_the_message_starts_at_the_target(archive):
    url, handler = archive
    handler.status = 404
    with pytest.raises(LockError) as e:
        oslock.resolve(_Engine(""), _target(url))
    assert e.value.message.startswith("targets.cu129.os_packages.suites: ")


def test_the_script_names_each_suite_and_each_request():
    osp = _cu129().os_packages
    script = oslock.resolve_script(osp)
    for suite in osp.suites:
        assert f"deb {osp.archive} {suite} {' '.join(osp.components)}" in script
    for p in osp.packages:
        assert (f"{p.name}={p.version}" if p.version else p.name) in script

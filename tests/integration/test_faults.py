"""Faults on the real engine and registry: records stay whole, logs stay, the next run works."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.conftest import BUILD, LocalRegistry, cli
from tests.integration.enginelock import ignore_cache_hold


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture()
def ignoring_cache():
    """For a test that runs `_start`'s build (--no-cache) beside its own: held shared on the
    ignore-cache lock for the test (enginelock.py), as conftest.cli holds it for one command."""
    with ignore_cache_hold(exclusive=False):
        yield


def _start(work, *extra: str, env=None) -> subprocess.Popen:
    return subprocess.Popen(
        [BUILD, "--matrix", str(work.matrix), "--target", "smoke", "--force", "--no-cache", "--no-checks", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


# A bound against a hang, not a speed target: the build ends on its own (and then the wait fails
# at once, saying so), so the deadline only has to outlast a build's steps on a loaded machine.
# 240 s was too short: at load 19 (the suite beside other sessions' builds) the runtime stage's
# first COPY came later than that, behind a build stage that ignores the cache.
def _wait_for_log(work, pattern: str, proc: subprocess.Popen, timeout: float = 1800) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for log in (work.root / "artifacts" / "smoke").glob("*/build.log"):
            if re.search(pattern, log.read_text(errors="replace"), re.M):
                return log
        assert proc.poll() is None, f"the build ended before {pattern!r}: {proc.communicate()[1][-2000:]}"
        time.sleep(0.02)
    raise AssertionError(f"no {pattern!r} in the build log within {timeout}s")


def _buildx_of(work) -> list[int]:
    """Live buildx processes (the `docker buildx` CLI and its `docker-buildx` plugin) working for
    this test's checkout, found by command line: buildx's --metadata-file names its artifacts dir.
    Not by parent: once the tool has exited, a left-over child is re-parented and no longer ours."""
    found = []
    marker = str(work.root / "artifacts").encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state == "Z" or not argv or not argv[0]:
            continue  # exited, not yet reaped: nothing runs
        program = Path(argv[0].decode(errors="replace")).name
        if (program == "docker-buildx" or (program == "docker" and b"buildx" in argv[1:3])) and any(
            marker in arg for arg in argv
        ):
            found.append(int(entry.name))
    return found


def test_docker_daemon_not_running(pristine, tmp_path):
    smoke, _ = pristine  # "up to date" below reads the registry's tag: as the record says
    work = smoke.copy(tmp_path / "nodaemon")
    before = _tree(work.root)
    env = dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/no-such-docker.sock")
    r = cli("--matrix", str(work.matrix), "--target", "smoke", "--force", env=env)
    assert r.code == 3, r.err
    assert "Docker engine not reachable" in r.err and "ci/setup.sh" in r.err
    assert "Traceback" not in r.err
    assert _tree(work.root) == before
    # Up-to-date needs only the registry, not the engine: that answer stays right without a daemon.
    r = cli("--matrix", str(work.matrix), "--target", "smoke", env=env)
    assert r.code == 0 and "up to date" in r.err
    assert _tree(work.root) == before


@pytest.fixture()
def second_registry(tmp_path):
    """A registry of its own on 127.0.0.1:<free port>, which the test may stop and start."""
    registry = LocalRegistry(tmp_path)
    registry.start()
    yield registry.address, registry.start, registry.stop
    registry.stop()


@pytest.mark.usefixtures("ignoring_cache")
def test_registry_stopped_during_push(built, tmp_path, second_registry):
    smoke, _ = built
    address, start, stop = second_registry
    work = smoke.copy(tmp_path / "push")
    work.matrix.write_text(re.sub(r"registry: 127\.0\.0\.1:5000", f"registry: {address}", work.matrix.read_text()))
    assert cli("--matrix", str(work.matrix), "render").code == 0
    record_before = work.record.read_bytes()
    proc = _start(work)
    log = _wait_for_log(work, r"^#\d+ \[runtime \d+/\d+\] COPY", proc)
    stop()  # the registry goes away as the image is exported and pushed
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 3, err[-2000:]  # out of reach, not a failed build
    assert f"registry {address} out of reach during the build" in err and str(log) in err
    assert "Traceback" not in err
    assert "pushing" in log.read_text() or "push" in log.read_text().lower()
    assert work.record.read_bytes() == record_before
    start()
    again = cli("--matrix", str(work.matrix), "--target", "smoke", "--no-checks")
    assert again.code == 0, again.err[-2000:]
    assert address in again.out and work.record.read_bytes() != record_before


@pytest.mark.usefixtures("ignoring_cache")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_build_stops_buildx_and_keeps_records(built, tmp_path, sig):
    smoke, _ = built
    work = smoke.copy(tmp_path / f"sig{int(sig)}")
    record_before = work.record.read_bytes()
    proc = _start(work)
    log = _wait_for_log(work, r"^#\d+ \[build 2/\d+\] RUN", proc)  # the first RUN of the build stage
    deadline = time.monotonic() + 5  # the CLI may be exec-ing its plugin at the moment the line shows
    while not (running := _buildx_of(work)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running, "found no buildx process for this build: the check below would prove nothing"
    proc.send_signal(sig)  # to the tool only, as a CI runner's cancel does (not to its process group)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    assert "interrupted: stopped buildx" in log.read_text()
    deadline = time.monotonic() + 5  # the plugin may still be on its way out as the tool exits
    while _buildx_of(work) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _buildx_of(work), f"buildx still running after the tool exited: {_buildx_of(work)} (was {running})"
    assert work.record.read_bytes() == record_before
    assert not [p for p in Path("/proc").glob("[0-9]*") if str(work.root).encode() in _cmdline(p)]


def _cmdline(p: Path) -> bytes:
    try:
        return (p / "cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.usefixtures("ignoring_cache")
def test_two_builds_of_one_target_never_interleave(built, tmp_path):
    smoke, _ = built
    work = smoke.copy(tmp_path / "twice")
    first = _start(work)
    _wait_for_log(work, r"^#\d+ \[build", first)
    second = cli("--matrix", str(work.matrix), "--target", "smoke", "--force", "--no-checks")
    assert second.code == 75, second.err
    assert "another build of this target is running" in second.err
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-2000:]
    assert work.record.read_text().strip().endswith("}")
    assert len(list((work.root / "artifacts" / "smoke").glob("*/build.log"))) == 1


@pytest.mark.parametrize("what", ["locks/smoke/image.json", "locks/smoke/requirements.txt"])
def test_corrupt_records_are_named_and_never_rebuilt_over(built, tmp_path, what):
    smoke, _ = built
    work = smoke.copy(tmp_path / "corrupt")
    path = work.root / what
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])  # truncated mid-write
    damaged = path.read_bytes()
    before = _tree(work.root)
    r = cli("--matrix", str(work.matrix), "--target", "smoke")
    assert r.code == 2, r.err
    assert str(path) in r.err and "Traceback" not in r.err
    assert path.read_bytes() == damaged and _tree(work.root) == before
    shutil.rmtree(work.root)

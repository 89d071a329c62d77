"""builder/engine/containers.py through its seam (the Docker client it is given): the stale-container
sweep against containers that come and go between the list and the inspect, as other runs' do."""

from __future__ import annotations

import os
import subprocess

import pytest
from python_on_whales.exceptions import DockerException, NoSuchContainer

from builder.config import contract
from builder.engine.containers import DockerContainers
from builder.errors import BuildError, EngineUnavailable


class _Config:
    def __init__(self, labels):
        self.labels = labels


class _Container:
    """What python-on-whales lists: an id, whose config is inspected when first read."""

    def __init__(self, cid: str, pid: str | None, gone: Exception | None = None):
        self.id, self._pid, self._gone = cid, pid, gone

    @property
    def config(self):
        if self._gone is not None:
            raise self._gone
        return _Config({contract.CONTAINER_LABEL: self._pid} if self._pid is not None else None)


class _Docker:
    def __init__(self, listed):
        self.listed, self.removed = listed, []
        self.container = self

    def list(self, all, filters):  # noqa: A002 - python-on-whales' own keyword
        assert all and filters == {"label": contract.CONTAINER_LABEL}
        return self.listed

    def remove(self, cid, force, volumes):
        self.removed.append(cid)


def _dead_pid() -> str:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return str(proc.pid)  # reaped: no process has it now (until the kernel reuses it)


def _gone(cid: str) -> NoSuchContainer:
    return NoSuchContainer(["docker", "container", "inspect", cid], 1, b"", f"Error: No such container: {cid}".encode())


def test_remove_stale_skips_a_container_that_disappeared_between_list_and_inspect():
    dead = _dead_pid()
    docker = _Docker(
        [
            _Container("a-gone", None, _gone("a-gone")),  # another session's, removed after the list
            _Container("b-stale", dead),
            _Container("c-live", str(os.getpid())),
            _Container("d-unlabelled", None),
        ]
    )
    assert DockerContainers(docker).remove_stale() == 2
    assert docker.removed == ["b-stale", "d-unlabelled"]


def test_remove_stale_still_fails_on_any_other_inspect_failure():
    down = DockerException(["docker", "inspect"], 1, b"", b"Cannot connect to the Docker daemon at unix:///x")
    with pytest.raises(EngineUnavailable, match="cannot inspect a container of this tool"):
        DockerContainers(_Docker([_Container("x", None, down)])).remove_stale()
    odd = DockerException(["docker", "inspect"], 1, b"", b"Error: something else")
    with pytest.raises(BuildError, match="something else"):
        DockerContainers(_Docker([_Container("x", None, odd)])).remove_stale()


# --- the checks' container and its commands (issue 49) --------------------------------------------


def test_a_command_past_its_timeout_is_killed_and_says_so():
    from builder.engine.containers import run_capped

    ran = run_capped(["sh", "-c", "echo started; exec sleep 1000"], timeout=1)
    assert ran.timed_out and ran.rc is None and ran.stdout == "started\n"
    done = run_capped(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=60)
    assert (done.rc, done.stdout, done.stderr, done.dropped) == (3, "out\n", "err\n", 0)


class _Execs:
    """A Docker client whose ``docker exec`` is a shell command, and whose restarts are recorded."""

    def __init__(self, command: str):
        self.restarted: list[tuple[str, int]] = []
        self.container = self

        class Config:
            docker_cmd = ["sh", "-c", command, "docker"]

        self.client_config = Config()

    def restart(self, cid, time):
        self.restarted.append((cid, time))


def test_a_timed_out_exec_is_killed_in_the_container_too():
    # killing the `docker exec` client leaves the process running in the container: the engine kills it
    hung = _Execs("echo started; exec sleep 1000")
    ran = DockerContainers(hung).exec("c1", ["python", "-c", "while 1: pass"], timeout=1)  # type: ignore[arg-type]
    assert ran.timed_out and hung.restarted == [("c1", 0)]
    quick = _Execs("echo done")
    ran = DockerContainers(quick).exec("c1", ["true"], timeout=60)  # type: ignore[arg-type]
    assert ran.rc == 0 and quick.restarted == []


def test_a_flood_of_output_keeps_its_head_and_tail_only():
    from builder.engine import containers

    flood = "printf HEAD; head -c 100000000 /dev/zero | tr '\\0' x; printf '\\nK3-PROBE {}\\n'"
    ran = containers.run_capped(["sh", "-c", flood], timeout=600)
    kept = containers.OUTPUT_HEAD + containers.OUTPUT_TAIL
    assert ran.rc == 0 and ran.stdout.startswith("HEAD") and ran.stdout.endswith("\nK3-PROBE {}\n")
    assert ran.dropped > 100_000_000 - kept - (1 << 17) and len(ran.stdout) < kept + (1 << 17)
    assert f"[... {ran.dropped} bytes left out ...]" in ran.stdout


class _Runs:
    def __init__(self):
        self.kwargs = []
        self.container = self
        self.image = self  # image.inspect: an arm64 image, as the smoke's linux/arm64 manifests

    def inspect(self, ref):
        return type("Image", (), {"os": "linux", "architecture": "arm64"})()

    def exists(self, ref):
        return True

    def run(self, ref, args, **kwargs):
        self.kwargs.append(kwargs)

        class Started:
            id = "c1"

        return Started() if kwargs.get("detach") else "out"


def test_the_checks_container_drops_every_privilege_and_is_bounded():
    docker = _Runs()
    containers = DockerContainers(docker)  # type: ignore[arg-type]
    assert containers.start("img") == "c1"
    assert containers.run_capture("img", "sh", ["-c", "true"]) == "out"
    for kwargs in docker.kwargs:
        assert kwargs["networks"] == ["none"] and kwargs["cap_drop"] == ["ALL"]
        assert kwargs["security_options"] == ["no-new-privileges"]
        assert kwargs["pids_limit"] > 0 and kwargs["memory"] and kwargs["cpus"] >= 1
        assert "privileged" not in kwargs
    # A throwaway run asks for the image's own platform: Docker's foreign-platform warning, which a
    # non-detached run would print on the tool's stderr, is not printed (issue 50).
    assert docker.kwargs[1]["platform"] == "linux/arm64" and docker.kwargs[0]["platform"] is None


def test_an_image_the_engine_lacks_is_pulled_without_a_word_on_stdout(tmp_path, capfd):
    """vet --json of an image not pulled yet: python-on-whales' own pull before ``docker run`` printed
    "Unable to find image" and the pull's progress on this process's stdout, breaking the JSON. A
    stand-in docker CLI that lacks the image until it is pulled, and prints as the real one does."""
    from python_on_whales import DockerClient

    calls, pulled = tmp_path / "calls", tmp_path / "pulled"
    cli = tmp_path / "docker"
    cli.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        'case "$1 $2" in\n'
        f'  "image inspect") [ -e {pulled} ] && echo \'[{{"Id": "sha256:1"}}]\' && exit 0\n'
        '    echo "Error: No such image: $3" >&2; exit 1;;\n'
        f'  "image pull") touch {pulled}; case "$*" in *--quiet*) echo img;; *) echo "Pulling fs layer";; esac;;\n'
        '  "container run") echo probe-output;;\n'
        "esac\n"
    )
    cli.chmod(0o755)
    containers = DockerContainers(DockerClient(client_call=[str(cli)]))
    assert containers.run_capture("127.0.0.1:5000/k3/x:1", "sh", ["-c", "true"]) == "probe-output"
    out = capfd.readouterr().out
    assert out == "", f"the engine's pull reached stdout: {out!r}"
    assert any(line.startswith("image pull") for line in calls.read_text().splitlines())

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

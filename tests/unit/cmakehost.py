"""The kernel plan's sandbox for the unit tests, which have no engine: the pinned cmake run on this
machine, with the same stdin script, timeout and output cap as the container (builder/engine/sandbox.py).
Only the tests' own fixtures run here; the tool itself never runs upstream CMake on the host
(tests/integration/test_hostile_upstream.py runs the real sandbox)."""

from __future__ import annotations

import pytest

from builder.engine.containers import Ran, run_capped
from builder.source import kernelplan


class HostCMake:
    def __init__(self) -> None:
        self.scripts: list[bytes] = []

    def run(self, script: bytes, timeout: float) -> Ran:
        self.scripts.append(script)
        return run_capped([kernelplan.cmake_binary()[0], "-P", "/dev/stdin"], timeout, stdin=script)


@pytest.fixture
def host_cmake(monkeypatch) -> HostCMake:
    """``build plan`` and ``build track`` in this process run the kernel plan with HostCMake."""
    from builder.commands import plan

    sandbox = HostCMake()
    monkeypatch.setattr(plan, "cmake_sandbox", lambda: sandbox)
    return sandbox

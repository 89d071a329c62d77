"""Test layout: tests/unit runs by default (no Docker, fast); tests/integration needs the real
engine, registry, git and PyPI and runs with --integration (what .ci/run passes), the smoke's
linux/arm64 leg included wherever linux/arm64 can run."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--integration",
        action="store_true",
        default=False,
        help="also run tests/integration against the real engine and registry",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    integration_dir = REPO / "tests" / "integration"
    skip = pytest.mark.skip(reason="needs --integration (real Docker engine and registry)")
    for item in items:
        if integration_dir in Path(item.fspath).parents:
            item.add_marker(pytest.mark.integration)
            if not config.getoption("--integration"):
                item.add_marker(skip)
    # The arm64 leg (tests/integration/test_arm64.py) runs with the rest, on every CI run; only a
    # machine that cannot run linux/arm64 at all skips it, and says why (ci/check.sh prints it too).
    why = arm64_missing()
    if why:
        arm64 = pytest.mark.skip(reason=f"linux/arm64 cannot run on this machine: {why}")
        for item in items:
            if item.get_closest_marker("arm64"):
                item.add_marker(arm64)


def arm64_missing() -> str:
    """Why this machine cannot run linux/arm64 binaries, or "" when it can (natively, or with the
    qemu-aarch64 handler ci/setup.sh registers with binfmt_misc)."""
    if platform.machine() in ("aarch64", "arm64"):
        return ""
    if Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists():
        return ""
    return "qemu-aarch64 is not registered with binfmt_misc (ci/setup.sh registers it, or said why it could not)"

"""Test layout: tests/unit runs by default (no Docker, fast); tests/integration needs the real
engine, registry, git and PyPI and runs with --integration (what .ci/run passes); the smoke's
linux/arm64 leg runs with --integration --arm64."""

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
    parser.addoption(
        "--arm64",
        action="store_true",
        default=False,
        help="also run the tests marked arm64 (the smoke's linux/arm64 leg, ci/demo.sh under QEMU; with --integration)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    integration_dir = REPO / "tests" / "integration"
    skip = pytest.mark.skip(reason="needs --integration (real Docker engine and registry)")
    for item in items:
        if integration_dir in Path(item.fspath).parents:
            item.add_marker(pytest.mark.integration)
            if not config.getoption("--integration"):
                item.add_marker(skip)
    # The arm64 leg (tests/integration/test_arm64.py) runs when asked for (--arm64): on a fresh
    # machine its bases alone take longer than CI's budget has room for (CONTRIBUTING.md, "The arm64
    # leg"). Asked for where linux/arm64 cannot run, it is skipped and says why.
    why = "needs --arm64 (the linux/arm64 leg under QEMU; CONTRIBUTING.md)"
    if config.getoption("--arm64"):
        missing = arm64_missing()
        why = missing and f"linux/arm64 cannot run on this machine: {missing}"
    if why:
        for item in items:
            if item.get_closest_marker("arm64"):
                item.add_marker(pytest.mark.skip(reason=why))


def arm64_missing() -> str:
    """Why this machine cannot run linux/arm64 binaries, or "" when it can (natively, or with the
    qemu-aarch64 handler ci/setup.sh registers with binfmt_misc)."""
    if platform.machine() in ("aarch64", "arm64"):
        return ""
    if Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists():
        return ""
    return "qemu-aarch64 is not registered with binfmt_misc (ci/setup.sh registers it, or said why it could not)"

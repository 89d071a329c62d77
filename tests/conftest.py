"""Test layout: tests/unit runs by default (no Docker, fast); tests/integration needs the real
engine, registry, git and PyPI and runs with --integration (what .ci/run passes), the smoke's
linux/arm64 leg included (under QEMU off arm64: skipped, saying why, where it cannot run; under CI
that is a failure)."""

from __future__ import annotations

import os
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


def require_arm64() -> None:
    """Skip, saying why, where linux/arm64 cannot run; under CI fail instead: ci/setup.sh registers
    qemu-aarch64 there, and a CI run without the arm64 leg must not pass as if it had run it."""
    missing = arm64_missing()
    if missing and in_ci():
        pytest.fail(f"CI must run the linux/arm64 leg, and this machine cannot: {missing}")
    if missing:
        pytest.skip(f"linux/arm64 cannot run on this machine: {missing}")


def in_ci() -> bool:
    """CI sets CI=true (as GitHub Actions and .ci/run's callers do)."""
    return os.environ.get("CI", "").lower() in ("true", "1")


def arm64_missing() -> str:
    """Why this machine cannot run linux/arm64 binaries, or "" when it can (natively, or with the
    qemu-aarch64 handler ci/setup.sh registers with binfmt_misc)."""
    if platform.machine() in ("aarch64", "arm64"):
        return ""
    if Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists():
        return ""
    return "qemu-aarch64 is not registered with binfmt_misc (ci/setup.sh registers it, or said why it could not)"

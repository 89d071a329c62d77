"""Test layout: tests/unit runs by default (no Docker, fast); tests/integration needs the real
engine, registry, git and PyPI and runs with --integration (what .ci/run passes)."""

from __future__ import annotations

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
        help="also run the tests marked arm64 (the smoke's linux/arm64 leg under QEMU: minutes; with --integration)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    integration_dir = REPO / "tests" / "integration"
    skip = pytest.mark.skip(reason="needs --integration (real Docker engine and registry)")
    for item in items:
        if integration_dir in Path(item.fspath).parents:
            item.add_marker(pytest.mark.integration)
            if not config.getoption("--integration"):
                item.add_marker(skip)
    # The arm64 leg (tests/integration/test_arm64.py) builds under QEMU for many minutes: only on request.
    arm64 = pytest.mark.skip(reason="needs --arm64 (the linux/arm64 leg under QEMU; CONTRIBUTING.md)")
    for item in items:
        if item.get_closest_marker("arm64") and not config.getoption("--arm64"):
            item.add_marker(arm64)

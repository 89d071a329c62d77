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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    integration_dir = REPO / "tests" / "integration"
    skip = pytest.mark.skip(reason="needs --integration (real Docker engine and registry)")
    for item in items:
        if integration_dir in Path(item.fspath).parents:
            item.add_marker(pytest.mark.integration)
            if not config.getoption("--integration"):
                item.add_marker(skip)

"""Unit-test isolation for process-wide state."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from builder import log
from builder.checks import layercache
from builder.config import contract


@pytest.fixture(autouse=True)
def _no_registered_secrets(monkeypatch):
    """Every unit test starts with no secret registered for redaction: log's registry is process-wide,
    so a value one test registers (a netrc line, a word such as "vllm") would otherwise be redacted
    out of every later test's messages, depending on the order the tests run in."""
    monkeypatch.setattr(log, "_secrets", set())


@pytest.fixture()
def old_set(tmp_path) -> Path:
    """A record set on disk (SBOM, provenance, record), each file "old <name>\\n": what the
    journal tests (test_journal_order.py, test_store_journal.py) write a new set over."""
    directory = tmp_path / "locks"
    directory.mkdir()
    for name in (contract.SBOM_NAME, contract.PROVENANCE_NAME, contract.RECORD_NAME):
        (directory / name).write_text(f"old {name}\n")
    return directory


@pytest.fixture(scope="session")
def bare_python(tmp_path_factory) -> str:
    """The interpreter of an empty venv (no pip, no console scripts): what the `starts` probe sees
    when a test runs it on the host, instead of the host venv's dozens of scripts, each imported."""
    venv = tmp_path_factory.mktemp("bare-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    return str(venv / "bin" / "python")


@pytest.fixture(scope="session", autouse=True)
def _layer_cache(tmp_path_factory):
    """The layer cache (builder/checks/layercache.py) of the unit tests' own: every test that reads a
    made `docker save` stream would otherwise keep its readings in the machine's cache directory."""
    directory = tmp_path_factory.mktemp("layer-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(layercache, "cache_dir", lambda: directory)
        yield directory

"""Unit-test isolation for process-wide state."""

from __future__ import annotations

import pytest

from builder import log


@pytest.fixture(autouse=True)
def _no_registered_secrets(monkeypatch):
    """Every unit test starts with no secret registered for redaction: log's registry is process-wide,
    so a value one test registers (a netrc line, a word such as "vllm") would otherwise be redacted
    out of every later test's messages, depending on the order the tests run in."""
    monkeypatch.setattr(log, "_secrets", set())

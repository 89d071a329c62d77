"""A readers-writer lock across the integration suite's processes (ci/check.sh runs pytest-xdist):
a test holds the engine shared, or exclusively when it empties the build cache. A plain flock
pair with a turnstile, so a queued exclusive holder is not starved by an endless stream of shared
ones: once it queues at the turnstile, new shared holders queue behind it."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def engine_hold(root: Path, exclusive: bool) -> Iterator[None]:
    """A readers-writer lock across the test processes (flock on files under ``root``)."""
    with open(root / "engine.turnstile", "a+") as turnstile, open(root / "engine.lock", "a+") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(turnstile, fcntl.LOCK_UN)

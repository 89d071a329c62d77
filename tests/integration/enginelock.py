"""A readers-writer lock across the integration suite's processes (ci/check.sh runs pytest-xdist):
a test holds the engine shared, or exclusively when it empties the build cache. A plain flock
pair with a turnstile, so a queued exclusive holder is not starved by an endless stream of shared
ones: once it queues at the turnstile, new shared holders queue behind it."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

# How many holds this process has open: a hold taken inside another (a session fixture that holds
# the engine itself, first set up within a file's hold by request.getfixturevalue) is the outer
# one's, not a second flock. A second flock would deadlock
# once an exclusive holder waits at the turnstile: it waits for this process's outer hold, and
# this process waits at the turnstile for it.
_held = {"count": 0, "exclusive": False}


@contextlib.contextmanager
def engine_hold(root: Path, exclusive: bool) -> Iterator[None]:
    """A readers-writer lock across the test processes (flock on files under ``root``); re-entrant
    within a process: inside a hold, a shared hold is the outer one (an exclusive one inside a
    shared one cannot be had without letting go, so it is refused)."""
    if _held["count"]:
        if exclusive and not _held["exclusive"]:
            raise RuntimeError("engine_hold: an exclusive hold asked for inside a shared one")
        _held["count"] += 1
        try:
            yield
        finally:
            _held["count"] -= 1
        return
    with open(root / "engine.turnstile", "a+") as turnstile, open(root / "engine.lock", "a+") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        _held.update(count=1, exclusive=exclusive)
        try:
            yield
        finally:
            _held.update(count=0, exclusive=False)
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(turnstile, fcntl.LOCK_UN)

"""Readers-writer locks across the integration suite's processes (ci/check.sh runs pytest-xdist):
a test holds the engine shared, or exclusively when it empties its build cache; and a build that
ignores the cache (--no-cache, `build reproduce`) holds the ignore-cache lock shared while a test
that counts cache hits holds it exclusively (why: docs/fast-rebuilds.md, "Concurrent builds and the
cache"). Each is a plain flock pair with a turnstile, so a queued exclusive holder is not starved
by an endless stream of shared ones: once it queues at the turnstile, new shared holders queue
behind it."""

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
    with _flock_pair(root, "engine", exclusive):
        _held.update(count=1, exclusive=exclusive)
        try:
            yield
        finally:
            _held.update(count=0, exclusive=False)


@contextlib.contextmanager
def _flock_pair(root: Path, name: str, exclusive: bool) -> Iterator[None]:
    """The readers-writer lock ``name`` under ``root``: a turnstile, then the lock itself."""
    with open(root / f"{name}.turnstile", "a+") as turnstile, open(root / f"{name}.lock", "a+") as lock:
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


# BuildKit shares a step in flight between builds on one engine, and a build that may use the cache
# joins a step another build runs with the cache ignored: its steps then run instead of coming from
# the cache, and their lines appear in its log (docs/fast-rebuilds.md). So a build that ignores the
# cache and a test that counts cache hits never overlap. The directory is the run's (set by
# conftest's engine_locks fixture); outside a run there is no other process to wait for.
_ignore_cache_root: list[Path] = []


def share_root(root: Path) -> None:
    """Where this run's ignore-cache lock lives (every process of the run passes the same)."""
    _ignore_cache_root[:] = [root]


def ignores_cache(args: tuple[str, ...] | list[str]) -> bool:
    """Whether a `build` command line builds with the cache ignored."""
    return "--no-cache" in args or "reproduce" in args


@contextlib.contextmanager
def ignore_cache_hold(exclusive: bool) -> Iterator[None]:
    """Shared: a build that ignores the cache runs inside. Exclusive: a build whose cache hits a test
    counts runs inside, while no build that ignores the cache is under way (or starts). Not
    re-entrant: a second hold inside one would wait at the turnstile behind a queued exclusive
    holder that waits for the first, so hold it around one command (or one test's builds) only."""
    if not _ignore_cache_root:
        yield
        return
    with _flock_pair(_ignore_cache_root[0], "ignore-cache", exclusive):
        yield


def build_hold(args: tuple[str, ...] | list[str]) -> contextlib.AbstractContextManager[None]:
    """The hold a `build` command line needs: shared on the ignore-cache lock when it ignores the cache."""
    return ignore_cache_hold(exclusive=False) if ignores_cache(args) else contextlib.nullcontext()

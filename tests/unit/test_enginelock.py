"""The integration suite's engine lock (tests/integration/enginelock.py), with real processes: shared
holders overlap, the exclusive one runs alone, and a queued exclusive holder is not overtaken."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from tests.integration.enginelock import engine_hold

CTX = multiprocessing.get_context("fork")


# Each event carries when it happened (CLOCK_MONOTONIC is one clock for every process): a queue
# fed by several processes delivers in the order their feeder threads flush, which under load is
# not the order the events happened in ("in" is stamped once the hold is taken, "out" before it is
# released, so the times order what the lock ordered).
def _put(events, name: str, kind: str) -> None:
    events.put((time.monotonic(), name, kind))


def _hold(root: Path, exclusive: bool, name: str, seconds: float, events, release=None) -> None:
    with engine_hold(root, exclusive):
        _put(events, name, "in")
        if release is not None:  # held until the test says so
            assert release.wait(30)
        time.sleep(seconds)
        _put(events, name, "out")


def _start(root: Path, exclusive: bool, name: str, seconds: float, events, release=None):
    proc = CTX.Process(target=_hold, args=(root, exclusive, name, seconds, events, release))
    proc.start()
    return proc


def _wait_in(events, name: str, seen: list, kind: str = "in") -> None:
    while not any(event[1:] == (name, kind) for event in seen):
        seen.append(events.get(timeout=30))


def _wait_blocked(proc) -> None:
    """Until ``proc`` waits on a lock: the kernel lists a waiter as "->" in /proc/locks (a fixed
    sleep was too short once under load: the later process came first)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if len(fields) > 5 and fields[1] == "->" and fields[5] == str(proc.pid):
                return
        time.sleep(0.02)
    raise AssertionError(f"process {proc.pid} never waited on a lock")


def _sequence(procs, events, seen: list) -> list:
    """(name, kind) of every event, in the order they happened."""
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    while not events.empty():
        seen.append(events.get(timeout=5))
    return [event[1:] for event in sorted(seen)]


def test_shared_holders_overlap(tmp_path):
    events, seen, release = CTX.Queue(), [], CTX.Event()
    a = _start(tmp_path, False, "a", 0.0, events, release)
    _wait_in(events, "a", seen)
    b = _start(tmp_path, False, "b", 0.0, events)
    _wait_in(events, "b", seen, "out")  # b waiting for a's hold would time out here
    release.set()
    order = _sequence([a, b], events, seen)
    assert order.index(("b", "out")) < order.index(("a", "out"))  # b came and went while a held


def test_the_exclusive_holder_waits_for_shared_ones_and_a_later_shared_one_waits_for_it(tmp_path):
    events, seen, release = CTX.Queue(), [], CTX.Event()
    a = _start(tmp_path, False, "a", 0.0, events, release)
    _wait_in(events, "a", seen)
    x = _start(tmp_path, True, "x", 0.3, events)
    _wait_blocked(x)  # x queues behind a's shared hold
    c = _start(tmp_path, False, "c", 0.0, events)
    _wait_blocked(c)  # c, at the turnstile x holds
    release.set()
    order = _sequence([a, x, c], events, seen)
    assert order == [("a", "in"), ("a", "out"), ("x", "in"), ("x", "out"), ("c", "in"), ("c", "out")]


def _nested(root: Path, events, release) -> None:
    with engine_hold(root, False):
        _put(events, "a", "in")
        assert release.wait(30)  # meanwhile x queues at the turnstile
        with engine_hold(root, False):  # a fixture that holds the engine, set up inside a test's hold
            _put(events, "a", "nested")
        _put(events, "a", "out")


def test_a_hold_inside_a_hold_is_the_outer_one_and_does_not_wait_behind_a_queued_exclusive(tmp_path):
    # A second flock here would wait at the turnstile x holds while x waits for a: a deadlock.
    events, seen, release = CTX.Queue(), [], CTX.Event()
    a = CTX.Process(target=_nested, args=(tmp_path, events, release))
    a.start()
    _wait_in(events, "a", seen)
    x = _start(tmp_path, True, "x", 0.0, events)
    _wait_blocked(x)
    release.set()
    order = _sequence([a, x], events, seen)
    assert order == [("a", "in"), ("a", "nested"), ("a", "out"), ("x", "in"), ("x", "out")]


def test_an_exclusive_hold_inside_a_shared_one_is_refused(tmp_path):
    with engine_hold(tmp_path, False), pytest.raises(RuntimeError, match="inside a shared one"):
        with engine_hold(tmp_path, True):
            pass
    with engine_hold(tmp_path, True), engine_hold(tmp_path, False):  # shared inside exclusive: the outer one
        pass

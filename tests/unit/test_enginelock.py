"""The integration suite's engine lock (tests/integration/enginelock.py), with real processes: shared
holders overlap, the exclusive one runs alone, and a queued exclusive holder is not overtaken."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from tests.integration.enginelock import engine_hold

CTX = multiprocessing.get_context("fork")


def _hold(root: Path, exclusive: bool, name: str, seconds: float, events) -> None:
    with engine_hold(root, exclusive):
        events.put((name, "in"))
        time.sleep(seconds)
        events.put((name, "out"))


def _start(root: Path, exclusive: bool, name: str, seconds: float, events):
    proc = CTX.Process(target=_hold, args=(root, exclusive, name, seconds, events))
    proc.start()
    return proc


def _wait_in(events, name: str, seen: list) -> None:
    while (name, "in") not in seen:
        seen.append(events.get(timeout=30))


def _sequence(procs, events, seen: list) -> list:
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    while not events.empty():
        seen.append(events.get(timeout=5))
    return seen


def test_shared_holders_overlap(tmp_path):
    events, seen = CTX.Queue(), []
    a = _start(tmp_path, False, "a", 1.0, events)
    _wait_in(events, "a", seen)
    b = _start(tmp_path, False, "b", 0.0, events)
    order = _sequence([a, b], events, seen)
    assert order.index(("b", "out")) < order.index(("a", "out"))  # b came and went while a held


def test_the_exclusive_holder_waits_for_shared_ones_and_a_later_shared_one_waits_for_it(tmp_path):
    events, seen = CTX.Queue(), []
    a = _start(tmp_path, False, "a", 1.0, events)
    _wait_in(events, "a", seen)
    x = _start(tmp_path, True, "x", 0.3, events)
    time.sleep(0.3)  # x queues at the turnstile behind a's shared hold
    c = _start(tmp_path, False, "c", 0.0, events)
    order = _sequence([a, x, c], events, seen)
    assert order == [("a", "in"), ("a", "out"), ("x", "in"), ("x", "out"), ("c", "in"), ("c", "out")]


def _nested(root: Path, events) -> None:
    with engine_hold(root, False):
        events.put(("a", "in"))
        time.sleep(0.6)  # meanwhile x queues at the turnstile
        with engine_hold(root, False):  # a fixture that holds the engine, set up inside a test's hold
            events.put(("a", "nested"))
        events.put(("a", "out"))


def test_a_hold_inside_a_hold_is_the_outer_one_and_does_not_wait_behind_a_queued_exclusive(tmp_path):
    # A second flock here would wait at the turnstile x holds while x waits for a: a deadlock.
    events, seen = CTX.Queue(), []
    a = CTX.Process(target=_nested, args=(tmp_path, events))
    a.start()
    _wait_in(events, "a", seen)
    x = _start(tmp_path, True, "x", 0.0, events)
    order = _sequence([a, x], events, seen)
    assert order == [("a", "in"), ("a", "nested"), ("a", "out"), ("x", "in"), ("x", "out")]


def test_an_exclusive_hold_inside_a_shared_one_is_refused(tmp_path):
    with engine_hold(tmp_path, False), pytest.raises(RuntimeError, match="inside a shared one"):
        with engine_hold(tmp_path, True):
            pass
    with engine_hold(tmp_path, True), engine_hold(tmp_path, False):  # shared inside exclusive: the outer one
        pass

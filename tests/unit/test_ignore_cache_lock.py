"""The integration suite's ignore-cache lock (tests/integration/enginelock.py), with real processes:
builds that ignore the cache share it, and a test that counts cache hits holds it alone, waiting for
one under way (BuildKit would otherwise run the counted build's steps; docs/fast-rebuilds.md)."""

from __future__ import annotations

import contextlib
import multiprocessing
import time

import pytest

from tests.integration import enginelock

CTX = multiprocessing.get_context("fork")


@pytest.mark.parametrize(
    ("args", "ignores"),
    [
        (("--matrix", "m.yaml", "--target", "smoke", "--no-cache"), True),
        (("--matrix", "m.yaml", "reproduce", "--target", "smoke"), True),
        (("--matrix", "m.yaml", "--target", "smoke", "--force", "--no-checks"), False),
        (("--matrix", "/tmp/test_reproduce0/m.yaml", "render"), False),  # a path is not the command
    ],
)
def test_which_command_lines_ignore_the_cache(args, ignores):
    assert enginelock.ignores_cache(args) is ignores
    assert isinstance(enginelock.build_hold(args), contextlib.nullcontext) is not ignores


def _shared(root, held, release) -> None:
    enginelock.share_root(root)
    with enginelock.ignore_cache_hold(exclusive=False):
        held.set()
        assert release.wait(30)


def test_the_counting_build_waits_for_a_build_that_ignores_the_cache(tmp_path):
    held, release, events = CTX.Event(), CTX.Event(), CTX.Queue()
    first = CTX.Process(target=_shared, args=(tmp_path, held, release))
    first.start()
    assert held.wait(30)
    # A second shared holder gets in beside the first.
    beside, go = CTX.Event(), CTX.Event()
    go.set()
    second = CTX.Process(target=_shared, args=(tmp_path, beside, go))
    second.start()
    assert beside.wait(30)
    second.join(30)

    def exclusive() -> None:
        enginelock.share_root(tmp_path)
        with enginelock.ignore_cache_hold(exclusive=True):
            events.put((time.monotonic(), "exclusive in"))

    counting = CTX.Process(target=exclusive)
    counting.start()
    counting.join(2)
    assert counting.is_alive(), "the exclusive hold was had while a shared one was held"
    events.put((time.monotonic(), "shared out"))  # stamped: a queue two processes feed may reorder
    release.set()
    first.join(30)
    counting.join(30)
    assert [name for _, name in sorted([events.get(timeout=5), events.get(timeout=5)])] == [
        "shared out",
        "exclusive in",
    ]


def test_without_a_run_directory_nothing_is_held():
    enginelock._ignore_cache_root.clear()
    with enginelock.ignore_cache_hold(exclusive=True), enginelock.ignore_cache_hold(exclusive=True):
        pass  # no lock files, no waiting: outside a suite run there is no other process

"""smokecache.made_once: two smoke-init processes on one machine make the bases once, one at a
time, and a holder that dies does not wedge the next run. Real processes, real files, real flock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from builder.smoke import smokecache

# One process of the test: made_once with a make() that logs when it starts and ends (and
# sleeps between, so a second process has time to collide) and a usable() that logs when the
# state was read; prints what made_once returned.
CHILD = r"""
import json, os, sys, time
from builder.smoke import smokecache
events, me, mode = sys.argv[1], sys.argv[2], sys.argv[3]

def note(what):
    with open(events, "a") as fh:
        fh.write(json.dumps({"who": me, "what": what, "t": time.monotonic()}) + "\n")

def someone_waits():
    # Another process is blocked on this state's lock: /proc/locks lists it with '->'.
    ino = os.stat(os.path.join(os.environ["K3_CACHE_DIR"], "smoke-bases-test.yaml.lock")).st_ino
    with open("/proc/locks") as fh:
        return any("->" in line and f":{ino} " in line for line in fh)

def make():
    note("make-start")
    if mode == "die":
        os.kill(os.getpid(), 9)  # dies holding the lock, state unwritten
    if mode == "hold":  # until the other process is blocked on the lock (however slow the machine)
        deadline = time.monotonic() + 60
        while not someone_waits() and time.monotonic() < deadline:
            time.sleep(0.05)
    note("make-end")
    return {"runtime": f"reg/base:tag@sha256:{me}"}

def usable(refs):
    note("checked")
    return True

print(json.dumps(smokecache.made_once("smoke-bases-test.yaml", "reg", "recipe-1", usable, make)))
"""


def _start(tmp_path: Path, who: str, mode: str = "make") -> subprocess.Popen:
    env = {**os.environ, "K3_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path / "events"), who, mode],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _events(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "events").read_text().splitlines()]


def _wait_for(tmp_path: Path, what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if (tmp_path / "events").exists() and any(e["what"] == what for e in _events(tmp_path)):
            return
        time.sleep(0.02)
    raise AssertionError(f"no {what} within 30 s")


def test_two_processes_make_once_and_the_second_reuses(tmp_path):
    first = _start(tmp_path, "a", mode="hold")
    _wait_for(tmp_path, "make-start")  # a holds the lock, inside make(), until b waits for it
    second = _start(tmp_path, "b")
    out_a, err_a = first.communicate(timeout=60)
    out_b, err_b = second.communicate(timeout=60)
    assert first.returncode == 0, err_a
    assert second.returncode == 0, err_b
    events = _events(tmp_path)
    assert [e["what"] for e in events if e["what"].startswith("make")] == ["make-start", "make-end"]
    assert {e["who"] for e in events if e["what"].startswith("make")} == {"a"}
    # b read the state only after a wrote it: it waited, then reused a's bases.
    made_end = next(e["t"] for e in events if e["what"] == "make-end")
    checked = [e for e in events if e["what"] == "checked"]
    assert [e["who"] for e in checked] == ["b"] and checked[0]["t"] > made_end
    assert json.loads(out_a) == json.loads(out_b) == {"runtime": "reg/base:tag@sha256:a"}
    assert "waiting for it" in err_b
    state = yaml.safe_load((tmp_path / "cache" / "smoke-bases-test.yaml").read_text())
    assert state == {"reg": {"recipe": "recipe-1", "refs": {"runtime": "reg/base:tag@sha256:a"}}}


def test_a_holder_that_dies_does_not_wedge_the_next_run(tmp_path):
    dead = _start(tmp_path, "a", mode="die")
    _wait_for(tmp_path, "make-start")
    waiting = _start(tmp_path, "b")  # blocks on a's lock until a dies
    dead.communicate(timeout=30)
    assert dead.returncode == -signal.SIGKILL
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, err
    # a wrote no state, so b made the bases itself rather than trusting a half-made run.
    assert json.loads(out) == {"runtime": "reg/base:tag@sha256:b"}
    assert [(e["who"], e["what"]) for e in _events(tmp_path)] == [
        ("a", "make-start"),
        ("b", "make-start"),
        ("b", "make-end"),
    ]


def test_a_recorded_recipe_that_changed_or_refs_no_longer_usable_are_made_again(tmp_path, monkeypatch):
    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path))
    made: list[str] = []

    def make(tag: str):
        def run() -> dict[str, str]:
            made.append(tag)
            return {"runtime": tag}

        return run

    assert smokecache.made_once("s.yaml", "reg", "r1", lambda refs: True, make("one")) == {"runtime": "one"}
    assert smokecache.made_once("s.yaml", "reg", "r1", lambda refs: True, make("two")) == {"runtime": "one"}
    assert smokecache.made_once("s.yaml", "reg", "r1", lambda refs: False, make("three")) == {"runtime": "three"}
    assert smokecache.made_once("s.yaml", "reg", "r2", lambda refs: True, make("four")) == {"runtime": "four"}
    # Another registry's entry is kept beside it.
    assert smokecache.made_once("s.yaml", "other", "r2", lambda refs: True, make("five")) == {"runtime": "five"}
    assert made == ["one", "three", "four", "five"]
    assert set(yaml.safe_load((tmp_path / "s.yaml").read_text())) == {"reg", "other"}

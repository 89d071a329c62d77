"""`build prune` (issue 21, defect 8): under the target's lock, never the build image.json names,
ordered by when each build last wrote, not by its wall-clock name."""

from __future__ import annotations

import dataclasses
import fcntl
import os

import pytest

from builder.config import contract
from builder.errors import Busy
from builder.pipeline import build as pipeline
from tests.unit.test_records import _record


def _builds(root, names_and_times):
    out = {}
    for name, when in names_and_times:
        d = root / contract.ARTIFACTS_DIR / "smoke" / name
        d.mkdir(parents=True)
        (d / "build.log").write_text(name)
        os.utime(d / "build.log", (when, when))
        out[name] = d
    return out


def _recorded(root, build_id):
    path = contract.record_path(root, "smoke")
    path.parent.mkdir(parents=True, exist_ok=True)
    record = _record()
    record = dataclasses.replace(record, target="smoke", build={**record.build, "id": build_id})
    path.write_text(record.to_json())


def test_keep_0_never_removes_the_recorded_build(tmp_path):
    _builds(tmp_path, [("20260101T000000Z-aaaaaa", 100), ("20260102T000000Z-bbbbbb", 200)])
    _recorded(tmp_path, "20260101T000000Z-aaaaaa")
    removed = pipeline.prune(tmp_path, ["smoke"], keep=0)
    assert [p.name for p in removed] == ["20260102T000000Z-bbbbbb"]
    assert (tmp_path / "artifacts" / "smoke" / "20260101T000000Z-aaaaaa").is_dir()


def test_under_a_skewed_clock_the_order_is_by_what_was_written_last(tmp_path):
    # The recorded build ran with the clock behind: its name sorts first, it wrote last.
    _builds(
        tmp_path, [("20300101T000000Z-failed", 100), ("20200101T000000Z-record", 300), ("20250101T000000Z-newer", 200)]
    )
    _recorded(tmp_path, "20200101T000000Z-record")
    removed = pipeline.prune(tmp_path, ["smoke"], keep=2)
    assert [p.name for p in removed] == ["20300101T000000Z-failed"]


def test_prune_waits_for_a_build_of_the_target(tmp_path):
    builds = _builds(tmp_path, [("20260101T000000Z-live", 100)])
    (tmp_path / "locks" / "smoke").mkdir(parents=True)
    fd = os.open(tmp_path / "locks" / "smoke", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a live build
    try:
        with pytest.raises(Busy):
            pipeline.prune(tmp_path, ["smoke"], keep=0)
    finally:
        os.close(fd)
    assert builds["20260101T000000Z-live"].is_dir()

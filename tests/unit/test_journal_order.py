"""The record journal's order (builder/records/store.py ``write_set`` and ``recover``), observed on
the filesystem between its steps rather than only after recovery.

Every rename the journal makes goes through ``os.replace`` (builder/fsutil.py's atomic write, then
the roll forward). The tests wrap it: each call first photographs the directory (names and
bytes), so one write yields the state a kill -9 would leave before each of its renames, and
before the directory fsync and the marker's removal. Each photograph is put back in a fresh
directory and recovered as the next start would: the set is then the old one or the new one,
never a mix, and old exactly when the kill came before the commit marker was in place. Then a
real failure (OSError) at each rename: before the commit point the old set stands with no journal
file left; after it, the next start finishes the new set.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from builder.config import contract
from builder.errors import HostResources
from builder.records import store

NAMES = (contract.SBOM_NAME, contract.PROVENANCE_NAME, contract.RECORD_NAME)
OLD = {n: f"old {n}\n" for n in NAMES}  # what the old_set fixture (conftest.py) holds
NEW = {n: f"new {n}\n" for n in NAMES}
# What write_set renames, in order: each pending file into place (the record's last), the
# marker into place (the commit point), then each pending file over its final name, record last.
RENAMES = 2 * len(NAMES) + 1
COMMIT = len(NAMES) + 1  # the marker's rename is this call (1-based)


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def restore(files: dict[str, bytes], directory: Path) -> Path:
    directory.mkdir()
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return directory


def visible(directory: Path) -> dict[str, str]:
    return {n: (directory / n).read_text() for n in NAMES if (directory / n).exists()}


class Journal:
    """os.replace and the directory fsync, watched: a photograph before each, and (src, dst) names."""

    def __init__(self, monkeypatch, fail_at: int | None = None) -> None:
        self.photos: list[tuple[str, dict[str, bytes]]] = []
        self.renames: list[tuple[str, str]] = []
        self.fail_at = fail_at
        real_replace, real_fsync = os.replace, store._fsync_dir

        def replace(src, dst, *args, **kwargs):
            self.photos.append((f"before rename {len(self.renames) + 1}", snapshot(Path(dst).parent)))
            self.renames.append((Path(src).name, Path(dst).name))
            if len(self.renames) == self.fail_at:
                raise OSError(28, "No space left on device")
            return real_replace(src, dst, *args, **kwargs)

        def fsync_dir(directory):
            self.photos.append(("before the directory fsync", snapshot(directory)))
            return real_fsync(directory)

        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(store, "_fsync_dir", fsync_dir)


def test_the_renames_in_order_record_last_and_the_marker_between(old_set, monkeypatch):
    journal = Journal(monkeypatch)
    store.write_set(old_set, NEW)
    dsts = [dst for _, dst in journal.renames]
    pending = [n + store.PENDING for n in NAMES]
    assert dsts == [*pending, store.COMMIT_MARKER, *NAMES]  # the record's pending last, its final last
    assert all(src.startswith(f".{dst}.") and src.endswith(".tmp") for src, dst in journal.renames[:COMMIT])
    assert [src for src, _ in journal.renames[COMMIT:]] == pending
    assert visible(old_set) == NEW and snapshot(old_set).keys() == set(NAMES)


def test_the_marker_lists_the_set_record_last_and_is_written_after_every_pending_file(old_set, monkeypatch):
    journal = Journal(monkeypatch)
    store.write_set(old_set, {contract.RECORD_NAME: NEW[contract.RECORD_NAME], **NEW})
    _, before_marker = journal.photos[COMMIT - 1]
    assert store.COMMIT_MARKER not in before_marker
    assert {n + store.PENDING for n in NAMES} <= before_marker.keys()
    assert all(before_marker[n + store.PENDING] == NEW[n].encode() for n in NAMES)  # complete, not partial
    _, after_marker = journal.photos[COMMIT]
    assert after_marker[store.COMMIT_MARKER].decode().split() == list(NAMES)


def test_between_steps_the_visible_record_is_new_only_once_its_files_are(old_set, monkeypatch):
    journal = Journal(monkeypatch)
    store.write_set(old_set, NEW)
    for _when, files in [*journal.photos, ("after", snapshot(old_set))]:
        shown = {n: files[n].decode() for n in NAMES if n in files}
        if shown[contract.RECORD_NAME] == NEW[contract.RECORD_NAME]:
            assert shown == NEW, _when
        else:  # the old record, and each audit file old or new (its sha256 in the record tells which)
            assert all(shown[n] in (OLD[n], NEW[n]) for n in NAMES), _when


@pytest.mark.parametrize("first", [False, True], ids=["over an old set", "first set"])
def test_a_kill_before_any_step_recovers_to_the_old_set_or_the_new_one(old_set, monkeypatch, tmp_path, first):
    if first:
        for name in NAMES:
            (old_set / name).unlink()
    journal = Journal(monkeypatch)
    store.write_set(old_set, NEW)
    monkeypatch.undo()
    assert len(journal.photos) == RENAMES + 1  # each rename, and the fsync before the marker goes
    for i, (when, files) in enumerate(journal.photos):
        directory = restore(files, tmp_path / f"after-kill-{i}")
        done = store.recover(directory)
        committed = store.COMMIT_MARKER in files
        assert visible(directory) == (NEW if committed else ({} if first else OLD)), when
        assert snapshot(directory).keys() == (set(NAMES) if committed or not first else set()), when
        assert ("completed an interrupted record write" in done) == committed, when
        assert committed == (i >= COMMIT), when  # the marker's rename is the commit point


def test_a_kill_between_the_renames_and_the_marker_s_removal_recovers_to_the_new_set(old_set, tmp_path):
    for name, text in NEW.items():
        (old_set / name).write_text(text)
    (old_set / store.COMMIT_MARKER).write_text("\n".join(NAMES) + "\n")  # every rename done, marker still there
    assert store.recover(old_set) == ["completed an interrupted record write"]
    assert visible(old_set) == NEW and snapshot(old_set).keys() == set(NAMES)


@pytest.mark.parametrize("fail_at", range(1, COMMIT + 1))
def test_a_failed_rename_before_the_commit_point_leaves_the_old_set_and_no_journal(old_set, monkeypatch, fail_at):
    Journal(monkeypatch, fail_at=fail_at)
    with pytest.raises(
        HostResources, match=r"the record set could not be written \(No space left on device\); the old record stands"
    ):
        store.write_set(old_set, NEW)
    monkeypatch.undo()
    assert snapshot(old_set).keys() == set(NAMES)  # no .pending, no marker, no temp file
    assert visible(old_set) == OLD
    assert store.recover(old_set) == []


@pytest.mark.parametrize("fail_at", range(COMMIT + 1, RENAMES + 1))
def test_a_failed_rename_after_the_commit_point_is_finished_at_the_next_start(old_set, monkeypatch, fail_at):
    Journal(monkeypatch, fail_at=fail_at)
    with pytest.raises(OSError, match="No space left on device"):
        store.write_set(old_set, NEW)
    monkeypatch.undo()
    assert store.COMMIT_MARKER in snapshot(old_set)  # committed: the journal stays for the next start
    assert visible(old_set)[contract.RECORD_NAME] == OLD[contract.RECORD_NAME]  # the record never went first
    assert store.recover(old_set)[0] == "completed an interrupted record write"
    assert visible(old_set) == NEW and snapshot(old_set).keys() == set(NAMES)


def test_recover_removes_pending_files_without_a_marker_and_a_killed_writer_s_temp_files(old_set):
    (old_set / (contract.SBOM_NAME + store.PENDING)).write_text("half a set\n")
    (old_set / f".{contract.RECORD_NAME}.abc123.tmp").write_text("half a file")
    (old_set / "keep.tmp").write_text("not a writer's temp file\n")
    done = store.recover(old_set)
    assert done == [f"removed {contract.SBOM_NAME}{store.PENDING}", f"removed .{contract.RECORD_NAME}.abc123.tmp"]
    assert visible(old_set) == OLD and "keep.tmp" in snapshot(old_set)


def test_recover_of_a_directory_that_is_not_there(tmp_path):
    assert store.recover(tmp_path / "never-built") == []

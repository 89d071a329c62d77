"""The record journal (builder/records/store.py), pinned step by step: the exact sequence of the
filesystem calls ``write_set`` makes (each file's fsync, its rename to ``<name>.pending``, the commit
marker, the renames into place with the record last, the directory fsync, the marker's removal), a
kill injected before each of those steps and what the next start makes of it (old set or new set,
never a mix, and exactly what ``recover`` reports), and the record's own bytes: ``to_json``'s key
order and indentation, ``read``'s size limit on both sides of it and its messages, exactly.

test_journal_order.py photographs the directory before each rename; these tests pin the calls
themselves, so a step that is skipped, repeated or moved (a file renamed into place before the
marker, the marker removed before the renames, no directory fsync) fails by name.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from builder.config import contract
from builder.errors import HostResources, RecordError
from builder.records import store

SBOM, PROV, RECORD = contract.SBOM_NAME, contract.PROVENANCE_NAME, contract.RECORD_NAME
NAMES = (SBOM, PROV, RECORD)
OLD = {n: f"old {n}\n" for n in NAMES}  # what the old_set fixture (conftest.py) holds
NEW = {n: f"new {n}\n" for n in NAMES}
MARKER = store.COMMIT_MARKER
P = store.PENDING

# Every step of write_set over an existing set, in order. A file written by fsutil.atomic_write is
# fsynced as ".<name>.<random>.tmp" and then renamed over <name>; "tmp(<name>)" stands for that temp.
STEPS = [
    ("fsync", f"tmp({SBOM}{P})"),
    ("replace", f"tmp({SBOM}{P})", f"{SBOM}{P}"),
    ("fsync", f"tmp({PROV}{P})"),
    ("replace", f"tmp({PROV}{P})", f"{PROV}{P}"),
    ("fsync", f"tmp({RECORD}{P})"),
    ("replace", f"tmp({RECORD}{P})", f"{RECORD}{P}"),
    ("fsync", f"tmp({MARKER})"),
    ("replace", f"tmp({MARKER})", MARKER),  # the commit point
    ("replace", f"{SBOM}{P}", SBOM),
    ("replace", f"{PROV}{P}", PROV),
    ("replace", f"{RECORD}{P}", RECORD),  # the record last
    ("fsync_dir", "."),
    ("unlink", MARKER),
]
COMMIT_STEP = STEPS.index(("replace", f"tmp({MARKER})", MARKER))


def _name(path) -> str:
    """A journal file's name; a writer's temp file as tmp(<the name it will get>)."""
    name = Path(path).name
    m = re.fullmatch(r"\.(.+)\.[^.]+\.tmp", name)
    return f"tmp({m.group(1)})" if m else name


class Kill(BaseException):
    """A kill -9 between two steps: nothing after it runs, no except clause of the writer sees it
    (write_set catches OSError only)."""


class Steps:
    """os.fsync, os.replace, os.unlink and store._fsync_dir, recorded in call order; with ``kill_at``
    (0-based), that step raises Kill instead of happening."""

    def __init__(self, monkeypatch, directory: Path, kill_at: int | None = None) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.kill_at = kill_at
        real_fsync, real_replace, real_unlink = os.fsync, os.replace, os.unlink
        real_fsync_dir = store._fsync_dir

        def step(call: tuple[str, ...]) -> None:
            if len(self.calls) == self.kill_at:
                self.calls.append(("KILLED", *call))
                raise Kill
            self.calls.append(call)

        def fsync(fd):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if Path(target).parent == directory:
                step(("fsync", _name(target)))
            return real_fsync(fd)

        def replace(src, dst, *args, **kwargs):
            step(("replace", _name(src), _name(dst)))
            return real_replace(src, dst, *args, **kwargs)

        def unlink(path, *args, **kwargs):
            if not self.killed:  # atomic_write's cleanup of its temp file after a kill is no step
                step(("unlink", _name(path)))
            return real_unlink(path, *args, **kwargs)

        def fsync_dir(d):
            step(("fsync_dir", os.path.relpath(d, directory)))
            return real_fsync_dir(d)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(os, "unlink", unlink)
        monkeypatch.setattr(store, "_fsync_dir", fsync_dir)

    @property
    def killed(self) -> bool:
        return any(c[0] == "KILLED" for c in self.calls)


def files(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(directory.iterdir())}


def test_write_set_makes_exactly_these_steps_in_this_order(old_set, monkeypatch):
    steps = Steps(monkeypatch, old_set)
    store.write_set(old_set, {RECORD: NEW[RECORD], SBOM: NEW[SBOM], PROV: NEW[PROV]})  # the record given first
    monkeypatch.undo()
    assert steps.calls == STEPS
    assert files(old_set) == NEW  # no pending file, no marker, no temp file


def test_the_marker_names_the_set_record_last_and_other_files_in_the_order_given(tmp_path):
    seen = {}
    real = store._roll_forward

    def spy(directory):
        seen["marker"] = (directory / MARKER).read_text()
        real(directory)

    files_in = {PROV: "p\n", RECORD: "r\n", SBOM: "s\n", "extra.txt": "e\n"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(store, "_roll_forward", spy)
        store.write_set(tmp_path, files_in)
    assert seen["marker"] == f"{PROV}\n{SBOM}\nextra.txt\n{RECORD}\n"
    assert files(tmp_path) == files_in


@pytest.mark.parametrize("kill_at", range(len(STEPS)), ids=[" ".join(s) for s in STEPS])
def test_a_kill_before_each_step_leaves_a_set_the_next_start_makes_whole(old_set, monkeypatch, kill_at):
    steps = Steps(monkeypatch, old_set, kill_at=kill_at)
    with pytest.raises(Kill):
        store.write_set(old_set, {RECORD: NEW[RECORD], SBOM: NEW[SBOM], PROV: NEW[PROV]})
    monkeypatch.undo()
    assert steps.calls == [*STEPS[:kill_at], ("KILLED", *STEPS[kill_at])]  # nothing ran after the kill
    on_disk = files(old_set)
    committed = MARKER in on_disk
    assert committed == (kill_at > COMMIT_STEP)  # the marker's rename is the commit point
    if committed:
        assert on_disk[MARKER] == f"{SBOM}\n{PROV}\n{RECORD}\n"
    # before the record's own rename, image.json is the old one whatever else moved
    assert on_disk[RECORD] == (NEW if kill_at > STEPS.index(("replace", f"{RECORD}{P}", RECORD)) else OLD)[RECORD]

    done = store.recover(old_set)
    pending = sorted(n for n in on_disk if n.endswith(P))
    if committed:
        assert done == ["completed an interrupted record write"]
        assert files(old_set) == NEW
    else:
        assert done == [f"removed {n}" for n in pending]
        assert files(old_set) == OLD
    assert store.recover(old_set) == []  # nothing left for a second start


def test_a_kill_during_the_roll_forward_of_a_recovery_is_finished_by_the_next(old_set, monkeypatch):
    """recover() is itself a journal step: killed after one of its renames, the marker still lists
    the set, the renamed file's pending copy is gone, and the next start finishes the rest."""
    for name in NAMES:
        (old_set / (name + P)).write_text(NEW[name])
    (old_set / MARKER).write_text(f"{SBOM}\n{PROV}\n{RECORD}\n")
    steps = Steps(monkeypatch, old_set, kill_at=1)
    with pytest.raises(Kill):
        store.recover(old_set)
    monkeypatch.undo()
    assert steps.calls == [("replace", f"{SBOM}{P}", SBOM), ("KILLED", "replace", f"{PROV}{P}", PROV)]
    assert store.recover(old_set) == ["completed an interrupted record write"]
    assert files(old_set) == NEW


def test_recover_rolls_forward_then_removes_leftovers_in_name_order(old_set, monkeypatch):
    (old_set / (SBOM + P)).write_text(NEW[SBOM])
    (old_set / MARKER).write_text(f"{SBOM}\n{RECORD}\n")  # the record was already renamed into place
    (old_set / ("zz" + P)).write_text("a pending file the marker does not name\n")
    (old_set / ("aa" + P)).write_text("another\n")
    (old_set / f".{RECORD}.x1y2.tmp").write_text("a killed writer's temp file\n")
    (old_set / "visible.tmp").write_text("not a writer's temp file (not hidden)\n")
    (old_set / ".hidden.txt").write_text("hidden, but no .tmp\n")
    steps = Steps(monkeypatch, old_set)
    done = store.recover(old_set)
    monkeypatch.undo()
    assert done == [
        "completed an interrupted record write",
        f"removed aa{P}",
        f"removed zz{P}",
        f"removed .{RECORD}.x1y2.tmp",
    ]
    assert steps.calls == [
        ("replace", f"{SBOM}{P}", SBOM),
        ("fsync_dir", "."),
        ("unlink", MARKER),
        ("unlink", f"aa{P}"),
        ("unlink", f"zz{P}"),
        ("unlink", f"tmp({RECORD})"),
    ]
    assert files(old_set) == {
        ".hidden.txt": "hidden, but no .tmp\n",
        PROV: OLD[PROV],
        RECORD: OLD[RECORD],
        SBOM: NEW[SBOM],
        "visible.tmp": "not a writer's temp file (not hidden)\n",
    }


def test_recover_without_a_marker_renames_nothing(old_set, monkeypatch):
    (old_set / (RECORD + P)).write_text(NEW[RECORD])
    steps = Steps(monkeypatch, old_set)
    assert store.recover(old_set) == [f"removed {RECORD}{P}"]
    monkeypatch.undo()
    assert steps.calls == [("unlink", f"{RECORD}{P}")]
    assert files(old_set) == OLD


def test_recover_of_a_clean_set_or_a_file_or_nothing_does_nothing(old_set, monkeypatch, tmp_path):
    steps = Steps(monkeypatch, old_set)
    assert store.recover(old_set) == []
    assert store.recover(old_set / RECORD) == []  # a file is no record directory
    assert store.recover(tmp_path / "never-built") == []
    monkeypatch.undo()
    assert steps.calls == []
    assert files(old_set) == OLD


FULL_MESSAGE = (
    "{d}: the record set could not be written (No space left on device); the old record stands. "
    "Free space (or make it writable) and run the build again: it puts the registry back in line "
    "with the record, no --force needed"
)


@pytest.mark.parametrize("fail_at", range(COMMIT_STEP + 1), ids=[" ".join(s) for s in STEPS[: COMMIT_STEP + 1]])
def test_a_failure_before_the_commit_point_removes_every_pending_file_and_says_so_exactly(
    old_set, monkeypatch, fail_at
):
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def failing(real, kind):
        def call(*args, **kwargs):
            calls.append(kind)
            if len(calls) - 1 == fail_at:
                raise OSError(28, "No space left on device")
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(os, "fsync", failing(real_fsync, "fsync"))
    monkeypatch.setattr(os, "replace", failing(real_replace, "replace"))
    with pytest.raises(HostResources) as err:
        store.write_set(old_set, NEW)
    monkeypatch.undo()
    assert err.value.message == FULL_MESSAGE.format(d=old_set)
    assert files(old_set) == OLD  # no pending file, no marker, no temp file
    assert store.recover(old_set) == []


# --- the record's bytes ----------------------------------------------------------------------------


def _full_record() -> store.Record:
    return store.Record(
        target="t",
        image="r/x@sha256:" + "a" * 64,
        digest="sha256:" + "a" * 64,
        bases={"build": {"name": "b", "digest": "sha256:" + "b" * 64}},
        source={"commit": "c", "url": "u"},
        lock_sha256="l",
        build_lock_sha256="bl",
        dockerfile_sha256="d",
        source_date_epoch=7,
        input_key="k",
        tool_version="0.1",
        checks="passed",
        build={"id": "1"},
        os_lock_sha256="o",
        gpu={"driver_floor": "575"},
        wheel_records={"torch": {"version": "2.13.0", "sha256": "w"}},
    )


def test_to_json_is_exactly_the_contract_order_with_the_optional_fields_in_place():
    r = _full_record()
    want = (
        "{\n"
        '  "schema": 2,\n'
        '  "target": "t",\n'
        f'  "image": "r/x@sha256:{"a" * 64}",\n'
        f'  "digest": "sha256:{"a" * 64}",\n'
        '  "bases": {\n'
        '    "build": {\n'
        '      "name": "b",\n'
        f'      "digest": "sha256:{"b" * 64}"\n'
        "    }\n"
        "  },\n"
        '  "source": {\n'
        '    "commit": "c",\n'
        '    "url": "u"\n'
        "  },\n"
        '  "lock_sha256": "l",\n'
        '  "build_lock_sha256": "bl",\n'
        '  "os_lock_sha256": "o",\n'
        '  "dockerfile_sha256": "d",\n'
        '  "source_date_epoch": 7,\n'
        '  "input_key": "k",\n'
        '  "tool_version": "0.1",\n'
        '  "checks": "passed",\n'
        '  "gpu": {\n'
        '    "driver_floor": "575"\n'
        "  },\n"
        '  "wheel_records": {\n'
        '    "torch": {\n'
        '      "version": "2.13.0",\n'
        '      "sha256": "w"\n'
        "    }\n"
        "  },\n"
        '  "build": {\n'
        '    "id": "1"\n'
        "  }\n"
        "}\n"
    )
    assert r.to_json() == want


def test_to_json_leaves_absent_optional_fields_out_and_keeps_insertion_order_inside_values():
    r = _full_record()
    bare = store.Record(
        **{k: getattr(r, k) for k in contract.RECORD_FIELDS if k != "schema"} | {"source": {"z": 1, "a": 2}}
    )
    text = bare.to_json()
    assert list(json.loads(text)) == list(contract.RECORD_FIELDS)
    assert '"source": {\n    "z": 1,\n    "a": 2\n  },' in text  # not sorted


def test_a_record_reads_back_every_optional_field(tmp_path):
    path = tmp_path / RECORD
    path.write_text(_full_record().to_json())
    assert store.read(path) == _full_record()
    bare = {k: v for k, v in json.loads(_full_record().to_json()).items() if k not in ("gpu", "wheel_records")}
    path.write_text(json.dumps(bare))
    got = store.read(path)
    assert got is not None and got.gpu is None and got.wheel_records is None and got.os_lock_sha256 == "o"


def test_the_wheel_records_digest_is_of_the_compact_sorted_json():
    wheels = {"b": {"version": "1", "entries": 2}, "a": {"sha256": "x", "version": "0"}}
    canonical = '{"a":{"sha256":"x","version":"0"},"b":{"entries":2,"version":"1"}}'
    assert store.wheel_records_sha256(wheels) == hashlib.sha256(canonical.encode()).hexdigest()
    assert store.wheel_records_sha256({}) == hashlib.sha256(b"{}").hexdigest()


SIZE_LIMIT = 1 << 20
CORRUPT = "{path}: corrupt record ({kind}: {why}); restore it with `git checkout -- <file>` before building (it is never rebuilt over)"


def _padded(size: int) -> str:
    text = _full_record().to_json()
    return text[:-2] + " " * (size - len(text.encode())) + "}\n"


def test_a_record_of_exactly_the_size_limit_is_read_and_one_byte_more_is_corrupt(tmp_path):
    path = tmp_path / RECORD
    path.write_text(_padded(SIZE_LIMIT))
    assert path.stat().st_size == SIZE_LIMIT
    assert store.read(path) == _full_record()
    path.write_text(_padded(SIZE_LIMIT + 1))
    assert path.stat().st_size == SIZE_LIMIT + 1
    with pytest.raises(RecordError) as err:
        store.read(path)
    assert err.value.message == CORRUPT.format(
        path=path, kind="ValueError", why="not a regular file of a record's size"
    )


def test_a_directory_in_the_record_s_place_is_corrupt_not_read(tmp_path):
    path = tmp_path / RECORD
    path.mkdir()
    with pytest.raises(RecordError) as err:
        store.read(path)
    assert err.value.message == CORRUPT.format(
        path=path, kind="ValueError", why="not a regular file of a record's size"
    )


def test_the_reason_a_record_is_corrupt_is_cut_to_eighty_characters(tmp_path):
    path = tmp_path / RECORD
    data = b" " * 1_000_000 + b"\xc3("  # an invalid continuation byte, far in: a long message
    path.write_bytes(data)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        why = str(exc)
    assert len(why) > 80
    with pytest.raises(RecordError) as err:
        store.read(path)
    assert err.value.message == CORRUPT.format(path=path, kind="UnicodeDecodeError", why=why[:80])

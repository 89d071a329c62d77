"""Records are written atomically and read strictly."""

from __future__ import annotations

import json
import os

import pytest

from builder import contract, records
from builder.errors import RecordError
from builder.fsutil import atomic_write


def _record(digest="sha256:" + "a" * 64):
    return records.Record(
        target="t", image=f"r/x@{digest}", digest=digest, bases={}, source={"commit": "c"},
        lock_sha256="l", build_lock_sha256="b", dockerfile_sha256="d", source_date_epoch=1, input_key="k",
        tool_version="0", build={"id": "1"},
    )


def test_round_trip_in_contract_order(tmp_path):
    path = tmp_path / "image.json"
    records.write(path, _record())
    assert list(json.loads(path.read_text())) == list(contract.RECORD_FIELDS)
    assert records.read(path) == _record()


def test_failed_write_leaves_the_previous_record_and_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "image.json"
    records.write(path, _record())
    before = path.read_bytes()

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        records.write(path, _record("sha256:" + "b" * 64))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["image.json"]


@pytest.mark.parametrize("content", ['{"schema": 1, "target": "t"', "", "[]", '{"schema": 99}', '{"schema": 1}'])
def test_corrupt_record_is_an_error_naming_it(tmp_path, content):
    path = tmp_path / "image.json"
    atomic_write(path, content)
    with pytest.raises(RecordError) as info:
        records.read(path)
    assert str(path) in info.value.message and info.value.exit_code == 2


def test_no_record_is_none(tmp_path):
    assert records.read(tmp_path / "image.json") is None

"""Records are written atomically and read strictly."""

from __future__ import annotations

import json
import os

import pytest

from builder.config import contract
from builder.errors import RecordError
from builder.fsutil import atomic_write
from builder.records import store as records


def _record(digest="sha256:" + "a" * 64):
    return records.Record(
        target="t",
        image=f"r/x@{digest}",
        digest=digest,
        bases={},
        source={"commit": "c"},
        lock_sha256="l",
        build_lock_sha256="b",
        dockerfile_sha256="d",
        source_date_epoch=1,
        input_key="k",
        tool_version="0",
        checks="passed",
        build={"id": "1", "sbom_sha256": "s", "provenance_sha256": "p"},
    )


def _set(record) -> dict[str, str]:
    return {
        contract.SBOM_NAME: f"sbom of {record.digest}\n",
        contract.PROVENANCE_NAME: f"prov of {record.digest}\n",
        contract.RECORD_NAME: record.to_json(),
    }


def test_round_trip_in_contract_order(tmp_path):
    records.write_set(tmp_path, _set(_record()))
    path = tmp_path / contract.RECORD_NAME
    assert list(json.loads(path.read_text())) == list(contract.RECORD_FIELDS)
    assert records.read(path) == _record()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(_set(_record()))  # no journal left


@pytest.mark.parametrize("crash_at", [1, 2, 3, 4])
def test_a_crash_anywhere_leaves_the_old_set_or_the_new_one(tmp_path, monkeypatch, crash_at):
    old, new = _record(), _record("sha256:" + "b" * 64)
    records.write_set(tmp_path, _set(old))
    calls = {"n": 0}
    real_replace = os.replace

    def crashing_replace(src, dst):
        calls["n"] += 1
        if calls["n"] == crash_at:
            raise KeyboardInterrupt  # killed between two renames
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crashing_replace)
    with pytest.raises(KeyboardInterrupt):
        records.write_set(tmp_path, _set(new))
    monkeypatch.setattr(os, "replace", real_replace)
    records.recover(tmp_path)  # what the next build does first, under the target's lock
    files = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert files in (_set(old), _set(new)), sorted(files)


def test_record_fields_of_the_wrong_type_are_refused(tmp_path):
    doc = json.loads(_record().to_json())
    doc["digest"] = 5
    (tmp_path / "image.json").write_text(json.dumps(doc))
    with pytest.raises(RecordError, match="wrong type: digest"):
        records.read(tmp_path / "image.json")


@pytest.mark.parametrize("content", ['{"schema": 2, "target": "t"', "", "[]", '{"schema": 99}', '{"schema": 2}'])
def test_corrupt_record_is_an_error_naming_it(tmp_path, content):
    path = tmp_path / "image.json"
    atomic_write(path, content)
    with pytest.raises(RecordError) as info:
        records.read(path)
    assert str(path) in info.value.message and info.value.exit_code == 2


def test_no_record_is_none(tmp_path):
    assert records.read(tmp_path / "image.json") is None


# --- a full or read-only record directory (issue 21, defect 4) ----------------------------------


def test_a_record_write_that_fails_leaves_the_old_set_and_no_pending_file(tmp_path, monkeypatch):
    import errno

    from builder.errors import HostResources

    old = _record()
    records.write_set(tmp_path, _set(old))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real = records.atomic_write

    def full(path, data):
        if path.name.startswith(contract.RECORD_NAME):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(records, "atomic_write", full)
    with pytest.raises(HostResources, match="could not be written .No space left on device.; the old record stands"):
        records.write_set(tmp_path, _set(_record("sha256:" + "b" * 64)))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no .pending left behind
    assert records.recover(tmp_path) == []


def test_the_record_directory_is_checked_for_writes_and_room(tmp_path, monkeypatch):
    import errno
    import os
    import tempfile

    from builder.errors import HostResources

    records.check_writable(tmp_path / "locks" / "smoke", "the record set")  # fine: made, probed, removed
    assert list((tmp_path / "locks" / "smoke").iterdir()) == []

    class Tiny:
        f_bavail, f_frsize = 10, 4096

    monkeypatch.setattr(os, "statvfs", lambda path: Tiny())
    with pytest.raises(HostResources, match=r"0 MiB free, the record set needs 32 MiB") as err:
        records.check_writable(tmp_path, "the record set")
    assert err.value.exit_code == 74

    def read_only(**kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    with pytest.raises(HostResources, match="cannot write the record set here .Read-only file system."):
        records.check_writable(tmp_path, "the record set")


GPU = {
    "driver_floor": "575.51.03",
    "derived_floor": "575.51.03",
    "derived_cuda": "12.9",
    "derived_from": "PTX ISA 8.8 (PTX compute_80) in /opt/k3/x.so",
    "families": ["9.0", "10.0", "10.3"],
    "waived": [],
    "toolkit_unknown": {},
    "coverage": {"vllm._C": {"9.0": "SASS sm_90a", "10.0": "SASS sm_100f", "10.3": "SASS sm_100f"}},
}


def test_the_gpu_block_is_written_after_checks_and_read_back(tmp_path):
    import dataclasses

    record = dataclasses.replace(_record(), gpu=GPU)
    records.write_set(tmp_path, _set(record))
    path = tmp_path / contract.RECORD_NAME
    keys = list(json.loads(path.read_text()))
    assert keys[keys.index("checks") + 1] == contract.RECORD_GPU and records.read(path) == record
    assert "gpu" not in json.loads(_record().to_json())  # targets without gpu keep their bytes
    doc = json.loads(record.to_json())
    doc["gpu"] = "575"
    path.write_text(json.dumps(doc))
    with pytest.raises(RecordError, match="wrong type: gpu"):
        records.read(path)

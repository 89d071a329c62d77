"""The record's fields (builder/records/store.py): every field read strictly by type (a bool is not a
number), the OS lock's hash where the contract puts it, files that are not a record's, and the
problems between a record and the audit files it names, each named.
"""

from __future__ import annotations

import base64
import json

import pytest

from builder.config import contract
from builder.errors import RecordError
from builder.fsutil import sha256_bytes
from builder.records import store
from tests.unit.test_records import _record

WRONG = {
    "target": 5,
    "image": None,
    "digest": ["sha256:x"],
    "bases": [],
    "source": "url",
    "lock_sha256": 1,
    "build_lock_sha256": {},
    "dockerfile_sha256": 2.5,
    "source_date_epoch": "1",
    "input_key": 0,
    "tool_version": 0,
    "checks": True,
    "build": "x",
}


@pytest.mark.parametrize("field", sorted(WRONG))
def test_each_field_of_the_wrong_type_is_named(tmp_path, field):
    doc = json.loads(_record().to_json())
    doc[field] = WRONG[field]
    path = tmp_path / contract.RECORD_NAME
    path.write_text(json.dumps(doc))
    with pytest.raises(RecordError) as err:
        store.read(path)
    assert err.value.message == (f"{path}: record fields of the wrong type: {field}; restore it from git")


def test_a_bool_is_not_a_number_and_several_wrong_fields_are_all_named(tmp_path):
    doc = json.loads(_record().to_json())
    doc["source_date_epoch"] = True
    doc["digest"] = 5
    path = tmp_path / contract.RECORD_NAME
    path.write_text(json.dumps(doc))
    with pytest.raises(RecordError, match=r"wrong type: digest, source_date_epoch; restore it from git$"):
        store.read(path)


def test_missing_fields_are_all_named(tmp_path):
    doc = json.loads(_record().to_json())
    del doc["digest"], doc["checks"]
    path = tmp_path / contract.RECORD_NAME
    path.write_text(json.dumps(doc))
    with pytest.raises(RecordError) as err:
        store.read(path)
    assert err.value.message == f"{path}: record lacks digest, checks; restore it from git"


def test_the_os_lock_hash_follows_the_build_lock_s_and_is_read_back(tmp_path):
    rec = store.Record(**{**_record().__dict__, "os_lock_sha256": "o" * 64})
    doc = json.loads(rec.to_json())
    keys = list(doc)
    assert keys[keys.index("build_lock_sha256") + 1] == "os_lock_sha256"
    assert [k for k in keys if k != "os_lock_sha256"] == list(contract.RECORD_FIELDS)
    path = tmp_path / contract.RECORD_NAME
    path.write_text(rec.to_json())
    assert store.read(path) == rec
    assert "os_lock_sha256" not in json.loads(_record().to_json())  # absent: the bytes of older records
    doc["os_lock_sha256"] = 5
    path.write_text(json.dumps(doc))
    with pytest.raises(RecordError, match="wrong type: os_lock_sha256"):
        store.read(path)


def test_what_is_not_a_record_s_file_is_corrupt(tmp_path):
    big = tmp_path / "big.json"
    big.write_text(" " * ((1 << 20) + 1))
    directory = tmp_path / "dir.json"
    directory.mkdir()
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"schema": "\xe9"}')
    for path in (big, directory, latin):
        with pytest.raises(RecordError, match=rf"^{path}: corrupt record \("):
            store.read(path)
    exact = tmp_path / "exact.json"
    exact.write_text(_record().to_json().ljust(1 << 20))  # at the limit: still read
    assert store.read(exact) == _record()


# --- the record and the audit files it names -------------------------------------------------------


def _envelope(digest: str) -> str:
    statement = {"subject": [{"digest": {"sha256": digest.removeprefix("sha256:")}}]}
    return json.dumps({"payload": base64.b64encode(json.dumps(statement).encode()).decode(), "signatures": []})


def _files(tmp_path, digest: str, sbom_digest: str | None = None, prov_digest: str | None = None):
    sbom = json.dumps({"metadata": {"component": {"version": sbom_digest or digest}}})
    prov = _envelope(prov_digest or digest)
    (tmp_path / contract.SBOM_NAME).write_text(sbom)
    (tmp_path / contract.PROVENANCE_NAME).write_text(prov)
    rec = _record(digest)
    build = {**rec.build, **store.audit_hashes(sbom, prov)}
    return store.Record(**{**rec.__dict__, "build": build})


def test_a_set_that_belongs_together_has_no_problem(tmp_path):
    digest = "sha256:" + "a" * 64
    assert store.set_problems(tmp_path.parent, tmp_path.name, _files(_locks(tmp_path), digest)) == []


def _locks(tmp_path):
    path = contract.record_path(tmp_path.parent, tmp_path.name).parent
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_each_audit_file_describing_another_digest_is_named(tmp_path):
    digest, other = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    locks = _locks(tmp_path)
    rec = _files(locks, digest, sbom_digest=other, prov_digest=other)
    assert store.set_problems(tmp_path.parent, tmp_path.name, rec) == [
        f"{contract.SBOM_NAME} describes {other}, image.json names {digest}",
        f"{contract.PROVENANCE_NAME} describes {other}, image.json names {digest}",
    ]


def test_an_audit_file_that_describes_nothing_readable(tmp_path):
    digest = "sha256:" + "a" * 64
    locks = _locks(tmp_path)
    rec = _files(locks, digest)
    prov = json.dumps({"payload": "not base64!", "signatures": []})
    (locks / contract.PROVENANCE_NAME).write_text(prov)
    rec = store.Record(**{**rec.__dict__, "build": {**rec.build, "provenance_sha256": sha256_bytes(prov.encode())}})
    assert store.set_problems(tmp_path.parent, tmp_path.name, rec) == [
        f"{contract.PROVENANCE_NAME} describes None, image.json names {digest}"
    ]


def test_a_missing_and_a_changed_audit_file_are_told_apart(tmp_path):
    digest = "sha256:" + "a" * 64
    locks = _locks(tmp_path)
    rec = _files(locks, digest)
    (locks / contract.SBOM_NAME).unlink()
    (locks / contract.PROVENANCE_NAME).write_text(_envelope(digest) + " ")
    assert store.set_problems(tmp_path.parent, tmp_path.name, rec) == [
        f"{contract.SBOM_NAME} is missing",
        f"{contract.PROVENANCE_NAME} differs from what image.json names",
    ]


def test_a_write_probe_a_killed_check_leaves_is_one_recover_removes(tmp_path, monkeypatch):
    """check_writable's probe file, left behind as a check killed before its unlink leaves it: it is
    in the record directory (the directory under test), hidden, and the next start's recover()
    removes it, so no stray file is ever committed beside the record set."""
    import os

    directory = tmp_path / "locks" / "smoke"
    monkeypatch.setattr(os, "unlink", lambda path: None)  # the check dies between create and unlink
    store.check_writable(directory, "the record set")
    monkeypatch.undo()
    (left,) = directory.iterdir()
    assert left.name.startswith(".") and left.name.endswith(".tmp"), left.name
    assert store.recover(directory) == [f"removed {left.name}"]
    assert list(directory.iterdir()) == []


def test_a_full_disk_is_refused_naming_free_and_needed_room(tmp_path, monkeypatch):
    import os

    from builder.errors import HostResources

    class Small:
        f_bavail, f_frsize = 3 << 20, 4  # 12 MiB

    monkeypatch.setattr(os, "statvfs", lambda path: Small())
    with pytest.raises(HostResources) as err:
        store.check_writable(tmp_path, "the record set")
    assert err.value.message == (
        f"{tmp_path}: 12 MiB free, the record set needs 32 MiB; free space and run again (nothing was built)"
    )


def test_exactly_the_room_a_record_set_needs_is_enough(tmp_path, monkeypatch):
    import os

    class Exact:
        f_bavail, f_frsize = store.RECORD_ROOM, 1

    monkeypatch.setattr(os, "statvfs", lambda path: Exact())
    store.check_writable(tmp_path, "the record set")  # no exception: 32 MiB free holds 32 MiB


def test_a_read_only_directory_is_refused_naming_the_fix(tmp_path, monkeypatch):
    import errno
    import tempfile

    from builder.errors import HostResources

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    with pytest.raises(HostResources) as err:
        store.check_writable(tmp_path, "the record set")
    assert err.value.message == (
        f"{tmp_path}: cannot write the record set here (Read-only file system); make it writable and run "
        "again (nothing was built)"
    )


def test_a_payload_with_a_character_outside_base64_is_not_read_around_it(tmp_path):
    """A lenient decoder would skip the stray character and read the Statement under it; the record
    set reads the payload strictly, so an envelope edited that way describes nothing."""
    digest = "sha256:" + "a" * 64
    locks = _locks(tmp_path)
    rec = _files(locks, digest)
    good = json.loads(_envelope(digest))
    prov = json.dumps({**good, "payload": good["payload"][:8] + "!" + good["payload"][8:]})
    (locks / contract.PROVENANCE_NAME).write_text(prov)
    rec = store.Record(**{**rec.__dict__, "build": {**rec.build, "provenance_sha256": sha256_bytes(prov.encode())}})
    assert store.set_problems(tmp_path.parent, tmp_path.name, rec) == [
        f"{contract.PROVENANCE_NAME} describes None, image.json names {digest}"
    ]

"""``locks/<target>/``: the record set of the last checked image, written as one unit.

The set is ``image.json`` (what was built from what) plus the SBOM and the provenance (a DSSE
envelope, builder/records/provsign.py).
``image.json`` carries the sha256 of the SBOM and provenance it belongs to, so any mix of old and
new files is detected offline (`build verify`, and every build before it trusts the record).

Writing is a small journal: every new file is written and fsynced under a pending name, then a
commit marker is written; only then are the files renamed into place, the record last. A crash
before the marker leaves the old set (the pending files are removed at the next start); a crash
after it is rolled forward at the next start. Either way the set on disk is old or new, never
mixed.

Schema (``contract.RECORD_FIELDS`` order): everything but ``build`` is a pure function of the
inputs and the pushed digest, so rebuilding unchanged inputs changes only ``build``.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.config import contract
from builder.errors import HostResources, RecordError
from builder.fsutil import atomic_write, sha256_bytes, sha256_file

PENDING = ".pending"  # suffix of a journal file: <name>.pending
COMMIT_MARKER = ".record-set.commit"  # present once every pending file of a set is on disk


@dataclass(frozen=True)
class Record:
    target: str
    image: str  # registry/repository@sha256:...
    digest: str
    bases: dict[str, dict[str, str]]  # role -> {name, digest}
    source: dict[str, Any]  # url, branch, commit (+ third_party)
    lock_sha256: str
    build_lock_sha256: str
    dockerfile_sha256: str
    source_date_epoch: int
    input_key: str  # sha256 of every input (plan.input_key): unchanged key, unchanged image
    tool_version: str
    checks: str  # "passed", or "skipped" (--no-checks: the image was never checked)
    # The volatile part: id, finished (UTC ISO), duration_seconds, engine, buildx, driver, and the
    # sha256 of the SBOM and provenance this build wrote (sbom_sha256, provenance_sha256).
    build: dict[str, Any]
    # sha256 of locks/<target>/os-packages.txt, for targets with os_packages (absent otherwise,
    # so records of targets without OS packages keep their bytes).
    os_lock_sha256: str | None = None
    # What the GPU-code checks proved (targets with a matrix ``gpu`` block whose checks ran; absent
    # otherwise): driver_floor (the claim, = the label), derived_floor and derived_cuda (from the
    # binaries), derived_from, families, coverage (required extension -> cc -> what serves it),
    # waived, toolkit_unknown. docs/auditor.md describes each field.
    gpu: dict[str, Any] | None = None
    # contract.RECORD_WHEELS: each locked wheel's RECORD digest (absent in records made before it).
    wheel_records: dict[str, Any] | None = None
    # The platform ("linux/arm64") of one manifest of an image index (absent for a one-platform target).
    platform: str | None = None

    def to_json(self) -> str:
        doc: dict[str, Any] = {"schema": contract.RECORD_SCHEMA}
        for k in contract.RECORD_FIELDS[1:]:
            doc[k] = getattr(self, k)
            if k == "target" and self.platform is not None:
                doc["platform"] = self.platform
            if k == "build_lock_sha256" and self.os_lock_sha256 is not None:
                doc["os_lock_sha256"] = self.os_lock_sha256
            if k == "checks" and self.gpu is not None:
                doc[contract.RECORD_GPU] = self.gpu
            if k == "checks" and self.wheel_records is not None:
                doc[contract.RECORD_WHEELS] = self.wheel_records
        return json.dumps(doc, indent=2, sort_keys=False) + "\n"


# Field -> type a readable record must have (a record with "digest": 5 is damaged, not a digest).
_TYPES = {
    "target": str,
    "image": str,
    "digest": str,
    "bases": dict,
    "source": dict,
    "lock_sha256": str,
    "build_lock_sha256": str,
    "dockerfile_sha256": str,
    "source_date_epoch": int,
    "input_key": str,
    "tool_version": str,
    "checks": str,
    "build": dict,
}


def read(path: Path) -> Record | None:
    """The committed record, None when there is none; RecordError when it is damaged."""
    if not path.exists():
        return None
    try:
        if not path.is_file() or path.stat().st_size > 1 << 20:
            raise ValueError("not a regular file of a record's size")
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise RecordError(
            f"{path}: corrupt record ({exc.__class__.__name__}: {str(exc)[:80]}); "
            "restore it with `git checkout -- <file>` before building (it is never rebuilt over)"
        ) from None
    if not isinstance(doc, dict) or doc.get("schema") != contract.RECORD_SCHEMA:
        raise RecordError(f"{path}: not a schema-{contract.RECORD_SCHEMA} record; restore it from git")
    missing = [k for k in contract.RECORD_FIELDS if k not in doc]
    if missing:
        raise RecordError(f"{path}: record lacks {', '.join(missing)}; restore it from git")
    wrong = [k for k, kind in _TYPES.items() if not isinstance(doc[k], kind) or isinstance(doc[k], bool)]
    if wrong:
        raise RecordError(f"{path}: record fields of the wrong type: {', '.join(wrong)}; restore it from git")
    if doc.get("kind") == contract.INDEX_KIND:
        raise RecordError(f"{path}: the record of an image index, not of one image (builder/records/index.py reads it)")
    for key in ("os_lock_sha256", "platform"):
        if not isinstance(doc.get(key, ""), str):
            raise RecordError(f"{path}: record fields of the wrong type: {key}; restore it from git")
    for key in (contract.RECORD_GPU, contract.RECORD_WHEELS):
        if not isinstance(doc.get(key, {}), dict):
            raise RecordError(f"{path}: record fields of the wrong type: {key}; restore it from git")
    return Record(
        **{k: doc[k] for k in contract.RECORD_FIELDS if k != "schema"},
        os_lock_sha256=doc.get("os_lock_sha256"),
        gpu=doc.get(contract.RECORD_GPU),
        wheel_records=doc.get(contract.RECORD_WHEELS),
        platform=doc.get("platform"),
    )


def write_set(directory: Path, files: dict[str, str]) -> None:
    """Write a record set as one unit (see the module docstring); the record name goes last.

    A write that fails before the commit point (a full or read-only disk) leaves the old set and
    no ``.pending`` file; HostResources says so. Past the commit point the next start rolls forward."""
    order = sorted(files, key=lambda name: name == contract.RECORD_NAME)
    try:
        for name in order:
            atomic_write(directory / (name + PENDING), files[name])
        atomic_write(directory / COMMIT_MARKER, "\n".join(order) + "\n")  # the commit point
    except OSError as exc:
        for name in order:
            (directory / (name + PENDING)).unlink(missing_ok=True)
        raise HostResources(
            f"{directory}: the record set could not be written ({exc.strerror}); the old record "
            "stands. Free space (or make it writable) and run the build again: it puts the "
            "registry back in line with the record, no --force needed"
        ) from None
    _roll_forward(directory)


RECORD_ROOM = 32 << 20  # a record set (SBOM, provenance, image.json) and the build's logs fit in this


def check_writable(directory: Path, what: str) -> None:
    """Before the engine runs: ``directory`` takes a file and has room, so a record write after the
    push cannot fail on a read-only or full disk (HostResources, exit 74, nothing written)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".k3-write-check.", suffix=".tmp", dir=directory)
        os.close(fd)
        os.unlink(probe)
        stat = os.statvfs(directory)
    except OSError as exc:
        raise HostResources(
            f"{directory}: cannot write {what} here ({exc.strerror}); make it writable and run "
            "again (nothing was built)"
        ) from None
    free = stat.f_bavail * stat.f_frsize
    if free < RECORD_ROOM:
        raise HostResources(
            f"{directory}: {free // (1 << 20)} MiB free, {what} needs {RECORD_ROOM >> 20} MiB; "
            "free space and run again (nothing was built)"
        )


def _roll_forward(directory: Path) -> None:
    names = (directory / COMMIT_MARKER).read_text().split()
    for name in names:
        pending = directory / (name + PENDING)
        if pending.exists():
            os.replace(pending, directory / name)
    _fsync_dir(directory)
    (directory / COMMIT_MARKER).unlink()


def recover(directory: Path) -> list[str]:
    """At the start of a build (under the target's lock): finish or discard an interrupted write,
    and remove temp files a killed writer left. Returns what was done, for the log."""
    if not directory.is_dir():
        return []
    done = []
    if (directory / COMMIT_MARKER).exists():
        _roll_forward(directory)
        done.append("completed an interrupted record write")
    for leftover in sorted(directory.glob(f"*{PENDING}")) + sorted(directory.glob(".*.tmp")):
        leftover.unlink()
        done.append(f"removed {leftover.name}")
    return done


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def wheel_records_sha256(wheel_records: dict[str, Any]) -> str:
    """The digest the provenance names for image.json's wheel_records (canonical JSON)."""
    return sha256_bytes(json.dumps(wheel_records, sort_keys=True, separators=(",", ":")).encode())


def audit_hashes(sbom_text: str, provenance_text: str) -> dict[str, str]:
    return {
        "sbom_sha256": sha256_bytes(sbom_text.encode()),
        "provenance_sha256": sha256_bytes(provenance_text.encode()),
    }


def _described_digest(path: Path, kind: str) -> str | None:
    """The image digest an SBOM (metadata.component.version) or provenance (the subject of the
    Statement its DSSE envelope carries) describes."""
    try:
        doc = json.loads(path.read_text())
        if kind == "sbom":
            return doc["metadata"]["component"]["version"]
        statement = json.loads(base64.b64decode(doc["payload"], validate=True))  # a DSSE envelope
        return "sha256:" + statement["subject"][0]["digest"]["sha256"]
    except (OSError, ValueError, KeyError, IndexError, TypeError, binascii.Error):
        return None


def set_problems(root: Path, target: str, record: Record, directory: Path | None = None) -> list[str]:
    """What does not hold between the record and the SBOM/provenance files it names (offline):
    their sha256 (any edit, a mix of old and new, a deletion) and the digest they describe (an
    edited digest in image.json). ``directory``: the record set's, if not locks/<target>/ (one
    platform's of an image index)."""
    problems = []
    where = directory or contract.record_path(root, target).parent
    for key, kind, path in (
        ("sbom_sha256", "sbom", where / contract.SBOM_NAME),
        ("provenance_sha256", "provenance", where / contract.PROVENANCE_NAME),
    ):
        got = sha256_file(path) if path.is_file() else None
        if got != record.build.get(key):
            problems.append(f"{path.name} {'is missing' if got is None else 'differs from what image.json names'}")
        elif _described_digest(path, kind) != record.digest:
            problems.append(f"{path.name} describes {_described_digest(path, kind)}, image.json names {record.digest}")
    return problems

"""``locks/<target>/image.json``: what was built from what, written atomically.

Schema (``contract.RECORD_FIELDS`` order): everything but ``build`` is a pure function of the
inputs and the pushed digest, so rebuilding unchanged inputs changes only ``build``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder import contract
from builder.errors import RecordError
from builder.fsutil import atomic_write


@dataclass(frozen=True)
class Record:
    target: str
    image: str  # registry/repository@sha256:...
    digest: str
    bases: dict[str, dict[str, str]]  # role -> {name, digest}
    source: dict[str, Any]  # url, branch, commit
    lock_sha256: str
    build_lock_sha256: str
    dockerfile_sha256: str
    source_date_epoch: int
    input_key: str  # sha256 of every input (pipeline.input_key): unchanged key, unchanged image
    tool_version: str
    build: dict[str, Any]  # id, finished (UTC ISO), duration_seconds, engine, buildx, driver

    def to_json(self) -> str:
        doc = {"schema": contract.RECORD_SCHEMA}
        doc.update({k: getattr(self, k) for k in contract.RECORD_FIELDS if k != "schema"})
        return json.dumps(doc, indent=2, sort_keys=False) + "\n"


def read(path: Path) -> Record | None:
    """The committed record, None when there is none; RecordError when it is damaged."""
    if not path.exists():
        return None
    try:
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
    return Record(**{k: doc[k] for k in contract.RECORD_FIELDS if k != "schema"})


def write(path: Path, record: Record) -> None:
    atomic_write(path, record.to_json())

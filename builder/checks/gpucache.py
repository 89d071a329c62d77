"""What the host's GPU-code reader found in one file, kept per file content (builder/checks/gpuread.py).

Keyed by the file's sha256 and the reader's version (``gpuread.READER``), under the tool's cache
directory (``~/.cache/k3-builder/gpucode``): a second ``build test`` of the same image, and the
linux/amd64 and linux/arm64 copies of an identical library, cost a hash instead of a decoding.

An entry is untrusted input when read back (anyone who can write the cache wrote it): it is used
only when it names the sha256 of the bytes just hashed and the reader's version, and every field
has the shape the reader writes (kinds, types, sizes); anything else is ignored and the file is
read again. It binds the answer to the bytes, not to a writer: someone who can write the
operator's cache can still write a false answer for given bytes (docs/checks.md says so).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from builder.fsutil import atomic_write, cache_dir, read_regular

SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_ENTRY = 4 << 20  # bytes of one cache file: NCCL's summary is a few KiB
MAX_OBJECTS = 20_000
SHAPES = ("elf", "cubin", "fatbin", "ptx")
# the fields of one summarized code object (probes/_fatbin.py, gpuread.py) and their types
FIELDS: dict[str, tuple[type, ...]] = {
    "kind": (str,),
    "sm": (int,),
    "variant": (str,),
    "compressed": (bool,),
    "arch": (str,),
    "count": (int,),
    "isa": (str,),
    "header_isa": (str,),
    "abi": (int,),
    "toolkit": (str,),
    "toolkit_from": (str,),
    "unread": (str,),
    "outside": (bool,),
}
REQUIRED = ("kind", "sm", "variant", "compressed", "arch", "count")


def directory() -> Path:
    path = cache_dir() / "gpucode"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def _path(sha256: str, reader: str) -> Path:
    return directory() / f"{sha256}.{reader}.json"


def load(sha256: str, reader: str) -> tuple[dict | None] | None:
    """``(facts,)`` kept for these bytes (facts None: no GPU code), or None when nothing valid is kept."""
    if not SHA256.match(sha256):
        return None
    try:
        raw = read_regular(_path(sha256, reader), MAX_ENTRY, "a GPU-code cache entry")
        doc = json.loads(raw)
    except Exception:  # noqa: BLE001 - any unreadable entry is a miss: the file is read again
        return None
    if not isinstance(doc, dict) or doc.get("sha256") != sha256 or doc.get("reader") != reader:
        return None
    facts = doc.get("gpu")
    return (facts,) if facts is None or valid(facts) else None


def store(sha256: str, reader: str, facts: dict | None) -> None:
    """Keep ``facts`` for these bytes; a cache that cannot be written is skipped (it only saves time)."""
    if not SHA256.match(sha256):
        return
    doc = {"reader": reader, "sha256": sha256, "gpu": facts}
    try:
        atomic_write(_path(sha256, reader), json.dumps(doc, sort_keys=True), mode=0o600)
    except OSError:
        pass


def valid(facts: object) -> bool:
    """Is ``facts`` what the reader writes for one file: {"shape", "objects": [object, ...]}?"""
    if not isinstance(facts, dict) or set(facts) != {"shape", "objects"} or facts["shape"] not in SHAPES:
        return False
    objects = facts["objects"]
    if not isinstance(objects, list) or not 0 < len(objects) <= MAX_OBJECTS:
        return False
    return all(_valid_object(o) for o in objects)


def _valid_object(obj: object) -> bool:
    if not isinstance(obj, dict) or not set(REQUIRED) <= set(obj) or not set(obj) <= set(FIELDS):
        return False
    for key, value in obj.items():
        if value is None and key == "toolkit":
            continue
        # bool is an int: a count or an SM must not be one, a flag must be one
        if not isinstance(value, FIELDS[key]) or (isinstance(value, bool) and bool not in FIELDS[key]):
            return False
        if isinstance(value, str) and len(value) > 400:
            return False
    return obj["count"] >= 1 and 0 <= obj["sm"] < 1 << 32

"""What the host's reading of one image layer found (builder/checks/layers.py), kept per layer digest.

`build test` reads every layer of the image it checks from ``docker save``; an image shares most of
its layers with the one before it (a rebuild after a source bump, a variant, the other platform's
run of the same target), and parsing a layer tar in Python costs seconds per hundred MB. The engine
names each saved layer blob by the sha256 of its bytes; the reading of those bytes is kept under
the tool's cache directory (``~/.cache/k3-builder/layers``), keyed by that digest and by the
reader's own version (``READER``: an edit to layers.py or imagefiles.py, or another Python, reads
every layer again).

An entry is used only when the bytes just streamed past hash to the digest it names (layers.py
hashes every blob, read or not), or, with no stream at all, when the engine lists the image's layer
by that digest (its diff_id, which the engine holds the layer's bytes to: layers.kept), and it is
untrusted input when read back: every field must have
the shape layers.py writes, else the entry is ignored (a miss). Like the GPU-code cache it binds
the answer to the bytes, not to a writer: someone who can write the operator's cache can write a
false answer for given bytes (docs/checks.md says so).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

from builder.fsutil import atomic_write, cache_dir, read_regular

SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_ENTRY = 64 << 20  # bytes of one entry: cu129's torch layer lists about 30,000 paths
# What a reading depends on besides the blob's bytes: the reader (layers.py), what it takes from
# imagefiles.py (the members' bounds, the forms a file capability takes) and the interpreter's
# tarfile. An edit to either file, or another Python, reads every layer again.
_SOURCES = ("layers.py", "imagefiles.py")
READER = hashlib.sha256(
    b"\0".join([sys.version.encode(), *((Path(__file__).parent / name).read_bytes() for name in _SOURCES)])
).hexdigest()[:16]
_LISTS = ("paths", "removed", "opaque")
_MAPS = ("capabilities", "packages", "links")


def _path(digest: str) -> Path:
    directory = cache_dir() / "layers"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return directory / f"{digest}.{READER}.json"


def load(digest: str) -> dict | None:
    """The fields layers.Layer keeps for the blob ``digest`` (hex), or None when nothing valid is kept."""
    if not SHA256.match(digest):
        return None
    try:
        doc = json.loads(read_regular(_path(digest), MAX_ENTRY, "a layer cache entry"))
    except Exception:  # noqa: BLE001 - any unreadable entry is a miss: the layer is read again
        return None
    if not isinstance(doc, dict) or doc.get("digest") != digest or doc.get("reader") != READER:
        return None
    fields = doc.get("layer")
    return fields if _valid(fields) else None


def _valid(fields: object) -> bool:
    if not isinstance(fields, dict) or set(fields) != set(_LISTS + _MAPS):
        return False
    lists_ok = all(isinstance(fields[k], list) and all(isinstance(v, str) for v in fields[k]) for k in _LISTS)
    maps_ok = all(
        isinstance(fields[k], dict) and all(isinstance(a, str) and isinstance(b, str) for a, b in fields[k].items())
        for k in _MAPS
    )
    hexes_ok = maps_ok and all(re.fullmatch(r"(?:[0-9a-f]{2})*", v) for v in fields["capabilities"].values())
    return lists_ok and maps_ok and bool(hexes_ok)


def store(digest: str, fields: dict) -> None:
    """Keep ``fields`` for the blob ``digest``; a cache that cannot be written is skipped (it only saves time)."""
    if not SHA256.match(digest) or not _valid(fields):
        return
    text = json.dumps({"reader": READER, "digest": digest, "layer": fields})
    if len(text) > MAX_ENTRY:  # load() would never read it: a layer of untrusted names fills no disk
        return
    try:
        atomic_write(_path(digest), text, mode=0o600)
    except OSError:
        pass

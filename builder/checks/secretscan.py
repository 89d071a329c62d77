"""The built image, searched for the build's secrets before it leaves the host.

A BuildKit secret never lands in a layer by itself, but a hostile build step (an upstream
``setup.py``) can copy it into a file it installs, or use it as a name. Redaction cannot help there,
so the image is built into the local image store and every layer the build added (the runtime
base's own layers are skipped: the pin names them) and the image config are searched for each
registered secret value in every form it was written in (``log.secret_values``), before the push.
What is searched, in the exported image (``docker save``: an OCI layout tar whose blobs are the
config, the manifests and the layers, each a plain or gzipped tar):

- every regular file's bytes;
- every member's name (so a file name, a directory name anywhere in the path, a long path carried
  in a PAX or GNU long-name record), its link target (symlinks and hard links) and every PAX
  record (key and value: extended attributes too);
- a layer's bytes after its end-of-archive blocks (no member holds them, but they are pushed);
- every blob that is not a layer (the image config: env, labels, history) as bytes.

A hit names the blob and the file; the caller refuses the image before anything is pushed.

What this cannot see: a value the step transformed first (base64, split, reversed, encrypted, or
compressed inside a file: a zip, a wheel, a gzip). The threat model (docs/guarantees.md) says so.
Not searched: a member's padding up to its 512-byte block and the header bytes no field names.
BuildKit writes a layer's tar from the filesystem a step left, so a build step chooses files,
names, links, modes, owners and extended attributes (all searched above), never those bytes; a
raw search of every byte would also match a short all-digit value in the headers' octal fields.
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass
from typing import IO

from builder import log

MIN_SCANNED = 8  # shorter registered words would match by chance in gigabytes of binaries
_CHUNK = 1 << 20
_BLOBS = "blobs/sha256/"


@dataclass(frozen=True)
class Hit:
    """Where a secret was found: the blob (``sha256:...``), and in a layer the member and how."""

    blob: str
    path: str  # the member's path in the layer; "" for a blob that is not a layer (the config) or past a layer's end
    where: str  # "content", "name", "link target", "PAX record" or "blob"

    def describe(self) -> str:
        if self.where == "blob":
            return f"blob {self.blob[:19]} (the image config: env, labels or history)"
        if not self.path:  # a layer's bytes after its end-of-archive: no file holds them
            return f"layer {self.blob[:19]}, {self.where} (bytes no file holds)"
        shown = "/" + self.path.removeprefix("./").lstrip("/")
        return f"layer {self.blob[:19]}, file {log.shown(shown, 200)} ({self.where})"


def needles() -> list[bytes]:
    return sorted({v.encode() for v in log.secret_values() if len(v) >= MIN_SCANNED}, key=len, reverse=True)


def find_in_stream(stream, wanted: list[bytes]) -> bytes | None:
    """The first of ``wanted`` in a binary stream, read in chunks that overlap by the longest."""
    keep = max(len(w) for w in wanted) - 1
    tail = b""
    for chunk in iter(lambda: stream.read(_CHUNK), b""):
        window = tail + chunk
        for w in wanted:
            if w in window:
                return w
        tail = window[-keep:] if keep else b""
    return None


def _raw(text: str) -> bytes:
    """A name as the tar stored it (tarfile decodes with surrogateescape, so this is lossless)."""
    return text.encode("utf-8", "surrogateescape")


def _in_header(member: tarfile.TarInfo, wanted: list[bytes]) -> str | None:
    """What of a member's header holds a secret: its name, its link target, or a PAX record."""
    if any(w in _raw(member.name) for w in wanted):
        return "name"
    if (member.issym() or member.islnk()) and any(w in _raw(member.linkname) for w in wanted):
        return "link target"
    for key, value in member.pax_headers.items():
        if any(w in _raw(key) or w in _raw(value) for w in wanted):
            return "PAX record"
    return None


def find_in_layer(fileobj: IO[bytes], wanted: list[bytes]) -> tuple[str, str] | None:
    """(member path, where) of the first secret in a (gzip or plain) layer tar read as a stream."""
    with tarfile.open(fileobj=fileobj, mode="r|*") as tar:
        for member in tar:
            where = _in_header(member, wanted)
            if where:
                return member.name, where
            if member.isfile():
                data = tar.extractfile(member)
                if data is not None and find_in_stream(data, wanted) is not None:
                    return member.name, "content"
        # Bytes after the end-of-archive blocks belong to no member, yet they are pushed with the
        # layer: a tar writer could hide a secret there (tar.fileobj is the decompressed stream).
        if find_in_stream(tar.fileobj, wanted) is not None:
            return "", "after the end of the archive"
    return None


def _is_tar(head: bytes) -> bool:
    """A layer: a tar (ustar magic at 257, or an empty archive's zero blocks) or a gzip stream."""
    return head[:2] == b"\x1f\x8b" or head[257:262] == b"ustar" or (len(head) >= 512 and not head.strip(b"\0"))


def find_in_archive(stream: IO[bytes], wanted: list[bytes], skip: frozenset[str] = frozenset()) -> Hit | None:
    """The first secret in an exported image (an OCI layout or `docker save` tar, read once as a
    stream). Blobs whose digest is in ``skip`` (the base's layers, by diff_id) are not read."""
    with tarfile.open(fileobj=stream, mode="r|") as outer:
        for member in outer:
            if not member.isfile():
                continue
            digest = "sha256:" + member.name.removeprefix(_BLOBS) if member.name.startswith(_BLOBS) else member.name
            if digest in skip:
                continue
            blob = outer.extractfile(member)
            if blob is None:
                continue
            head = blob.peek(512)[:512] if hasattr(blob, "peek") else b""
            if len(head) >= 512 and _is_tar(head) or head[:2] == b"\x1f\x8b":
                found = find_in_layer(blob, wanted)
                if found:
                    return Hit(digest, found[0], found[1])
            elif find_in_stream(blob, wanted) is not None:
                return Hit(digest, "", "blob")
    return None

"""The built image, searched for the build's secrets before it is checked and recorded.

A BuildKit secret never lands in a layer by itself, but a hostile build step (an upstream
``setup.py``) can copy it into a file it installs. Redaction cannot help there, so every layer
the build added (the runtime base's own layers are skipped: the pin names them) and the image
config are searched for each registered secret value in every form it was written in
(``log.secret_values``). A hit fails the build naming the layer and the file; the image is not
recorded, and the tool deletes the pushed manifest where the registry allows it.

What this cannot see: a value the step transformed first (base64, split, encrypted). The threat model
(docs/guarantees.md) says so.
"""

from __future__ import annotations

import tarfile
import tempfile
from pathlib import Path

from builder import log
from builder.errors import BuildError

MIN_SCANNED = 8  # shorter registered words would match by chance in gigabytes of binaries
_CHUNK = 1 << 20


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


def find_in_layer(path: Path, wanted: list[bytes]) -> str | None:
    """The path of the first file in a (gzip or plain) layer tar holding one of ``wanted``."""
    with tarfile.open(path, mode="r|*") as tar:
        for member in tar:
            if member.isfile():
                data = tar.extractfile(member)
                if data is not None and find_in_stream(data, wanted) is not None:
                    return member.name
            elif member.issym() or member.islnk():
                if any(w in member.linkname.encode() for w in wanted):
                    return member.name
    return None


def scan(registry, name: str, digest: str, skip: frozenset[str] = frozenset()) -> None:
    """Raise BuildError naming the layer and file when a registered secret is in the image."""
    wanted = needles()
    if not wanted:
        return  # nothing registered: nothing to look for
    manifest = registry.raw_manifest(name, registry.platform_digest(name, digest))
    doc = manifest.doc if manifest else {}
    config = registry.blob(name, doc["config"]["digest"]) if isinstance(doc.get("config"), dict) else b""
    if any(w in config for w in wanted):
        raise BuildError(
            f"{name}@{digest}: a build secret is in the image config (env, labels or history); not recorded"
        )
    with tempfile.TemporaryDirectory(prefix="k3-scan-") as tmp:
        for index, layer in enumerate(doc.get("layers") or []):
            if layer.get("digest") in skip:
                continue
            blob = Path(tmp) / "layer"
            registry.blob_to(name, layer["digest"], blob)
            try:
                found = find_in_layer(blob, wanted)
            except (tarfile.TarError, EOFError, OSError) as exc:
                raise BuildError(
                    f"{name}@{digest}: layer {index} ({layer['digest'][:19]}) cannot be read to scan "
                    f"it for secrets ({exc.__class__.__name__}); not recorded"
                ) from None
            if found:
                raise BuildError(
                    f"{name}@{digest}: a build secret is in layer {index} ({layer['digest'][:19]}), "
                    f"file /{found.removeprefix('./').lstrip('/')}: a build step copied it into the image; not recorded"
                )
            blob.unlink()

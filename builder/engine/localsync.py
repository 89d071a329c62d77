"""The copy of a build's local inputs that BuildKit reuses, and why the tool names it by content.

buildx gives a build's session the shared key ``<base name of the default context directory>:<its
node id>`` (docker/buildx v0.13.1, build/build.go), and BuildKit keeps one synced copy of each local
input under ``<input name>:<hint>:<that key>``, reusing any copy no build is using (moby/buildkit
v0.13, source/local/source.go, ``snapshot``). The sync then sends only the files whose metadata
differ from the copy's (size, mtime, mode, owner: fsutil's metadata diff); it never compares bytes.
The tool sets every mtime of its inputs to SOURCE_DATE_EPOCH, so two trees of one epoch that differ
only by same-size edits (``.git_archival.txt``'s commit id, a path of the same length, a changed
hash in a lock) look unchanged, and the build would mount the other tree's bytes; its RUN steps,
keyed on the content checksum of what they mount, would then run on, or hit the cache of, another
build's inputs. Seen on this project's suite: a compile step run twice in a row on one commit, and
another commit's compile taken from the cache (docs/fast-rebuilds.md).

So the default context goes to buildx through a link named for a digest of every local input's
bytes: identical inputs share a copy (the same bytes, whatever the sync skips), different inputs
never do. Every engine build goes through ``keyed_context``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from builder.engine.seam import BuildRequest
from builder.errors import BuildError

PREFIX = "context-"  # the link's name: PREFIX + the digest's first 32 hex digits


def _field(h, data: bytes) -> None:
    h.update(len(data).to_bytes(8, "big") + data)  # length-prefixed: no name can forge a boundary


def _entry(h, path: Path, rel: str) -> None:
    st = path.lstat()
    _field(h, os.fsencode(rel))
    _field(h, f"{stat.S_IFMT(st.st_mode):o} {stat.S_IMODE(st.st_mode):o}".encode())
    if stat.S_ISLNK(st.st_mode):
        _field(h, os.fsencode(os.readlink(path)))
    elif stat.S_ISREG(st.st_mode):
        content = hashlib.sha256()
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                content.update(chunk)
        _field(h, content.digest())


def _input_digest(root: Path) -> bytes:
    """sha256 over one input (a file, or a directory walked without following links): every entry's
    relative path, type, mode, link target and bytes, in a fixed order. An entry that cannot be read
    raises OSError (the sync could not send it either)."""
    h = hashlib.sha256()
    if not root.is_dir():
        _entry(h, root, ".")
        return h.digest()

    def unreadable(exc: OSError) -> None:
        raise exc

    for dirpath, dirnames, filenames in os.walk(root, onerror=unreadable):
        dirnames.sort()
        for entry in sorted([*dirnames, *filenames]):
            path = Path(dirpath, entry)
            _entry(h, path, path.relative_to(root).as_posix())
    return h.digest()


def inputs_digest(inputs: Iterable[tuple[str, Path]]) -> str:
    """sha256 over each named input's own digest (``_input_digest``), by name: one input's entries
    cannot run on into the next input's name."""
    h = hashlib.sha256()
    for name, root in sorted(inputs):
        _field(h, name.encode())
        _field(h, _input_digest(root))
    return h.hexdigest()


@contextmanager
def keyed_context(req: BuildRequest) -> Iterator[Path]:
    """The path to give buildx as the default context: a link to ``req.context`` whose name carries
    the digest of every local input of ``req`` (the Dockerfile, the default and the named contexts),
    in a directory of its own beside the context, removed afterwards (the link, never its target)."""
    try:
        digest = inputs_digest([("context", req.context), ("dockerfile", req.dockerfile), *req.build_contexts.items()])
    except OSError as exc:
        raise BuildError(f"cannot read the build's inputs to key them: {exc}") from None
    holder = Path(tempfile.mkdtemp(prefix=".k3-session-", dir=req.context.resolve().parent))
    try:
        link = holder / f"{PREFIX}{digest[:32]}"
        link.symlink_to(req.context.resolve(), target_is_directory=True)
        yield link
    finally:
        shutil.rmtree(holder, ignore_errors=True)

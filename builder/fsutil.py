"""Atomic file writes and hashing: a record is either the old file or the new one, never half;
small files read as untrusted input; a write whose path fails reported as bad input."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def atomic_write(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write to a temp file in the same directory, fsync, then rename over ``path``. The temp file
    is 0600 from its creation (mkstemp) until it is given ``mode``: a private ``mode`` (a key, an
    evidence bundle) is never readable by others, not even for a moment."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def reserve_stem(directory: Path, stem: str, suffixes: tuple[str, ...]) -> str:
    """A stem no file in ``directory`` has with any of ``suffixes`` (``stem``, then ``stem-2``...),
    its files created empty and exclusively (O_EXCL): two runs within the same second, even at
    once, never write the same name, and the caller's atomic_write replaces its own placeholders."""
    for n in range(1, 1000):
        candidate = stem if n == 1 else f"{stem}-{n}"
        made: list[Path] = []
        try:
            for suffix in suffixes:
                path = directory / f"{candidate}{suffix}"
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
                made.append(path)
        except FileExistsError:
            for path in made:
                path.unlink()
            continue
        return candidate
    raise FileExistsError(f"{directory / stem}: 999 files of that name already")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def clamp_mtimes(root: Path, epoch: int) -> None:
    """Set every mtime under ``root`` (root included) to ``epoch``, without following links."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:
            os.utime(os.path.join(dirpath, name), (epoch, epoch), follow_symlinks=False)
    os.utime(root, (epoch, epoch))


# A run that must not read the machine's cache (a rebuild from the escrow) names its own for the
# code it calls: every cache_dir() inside ``cache_scope`` is that directory. A sealed one is
# complete: what is not in it is never downloaded (``cache_sealed``, asked before each download).
_SCOPED_CACHE: contextvars.ContextVar[tuple[Path, bool] | None] = contextvars.ContextVar("k3_cache", default=None)


@contextlib.contextmanager
def cache_scope(path: Path, sealed: bool = False) -> Iterator[Path]:
    """``cache_dir()`` is ``path`` inside the block (this thread and what it calls), then as before."""
    token = _SCOPED_CACHE.set((path, sealed))
    try:
        yield path
    finally:
        _SCOPED_CACHE.reset(token)


def cache_sealed() -> bool:
    """Inside a sealed ``cache_scope``: nothing may be downloaded into the cache."""
    scoped = _SCOPED_CACHE.get()
    return scoped is not None and scoped[1]


def cache_dir() -> Path:
    """Downloads and git mirrors shared by every checkout on this machine (or a run's own, see
    ``cache_scope``)."""
    scoped = _SCOPED_CACHE.get()
    base = (
        (scoped and scoped[0])
        or os.environ.get("K3_CACHE_DIR")
        or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "k3-builder")
    )
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def read_regular(path: Path, limit: int, what: str) -> bytes:
    """A small regular file's bytes, refused before reading when it is not one: a FIFO would block
    forever and /dev/zero never ends. Raises ConfigError (bad input, exit 2) naming ``what``."""
    from builder.errors import ConfigError

    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file ({what})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{path}: not a regular file ({what})")
    if info.st_size > limit:
        raise ConfigError(f"{path}: larger than {limit} bytes; is it really {what}?")
    try:
        with open(path, "rb") as fh:
            return fh.read(limit + 1)[:limit]
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror}") from None


def written(write: Callable[[], T], what: str) -> T:
    """``write()``, with a path that fails between the check and the write (removed, made
    unwritable) as one line, exit 2; a full or read-only disk stays exit 74 (cli's mapping)."""
    from builder.errors import RESOURCE_ERRNOS, ConfigError

    try:
        return write()
    except OSError as exc:
        if exc.errno in RESOURCE_ERRNOS:
            raise
        raise ConfigError(f"{what}: cannot write {exc.filename or 'the record'}: {exc.strerror}") from None

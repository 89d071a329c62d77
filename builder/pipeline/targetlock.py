"""One build, `build lock` or `prune` of a target at a time on a checkout: flock(2) on the target's
locks/ directory, under which an interrupted record write is finished or discarded first; and
`build prune`, which removes old build directories under that lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from builder import log
from builder.config import contract
from builder.errors import Busy
from builder.pipeline.plan import Plan
from builder.records import store as records


@contextlib.contextmanager
def target_lock(plan: Plan) -> Iterator[None]:
    """One build of a target at a time on this checkout: a second one is refused, not interleaved.

    The lock is flock(2) on the target's locks/ directory itself, so taking it writes nothing, and
    the kernel drops it when the process dies however it dies. Under it, an interrupted record
    write is finished or discarded first.
    """
    with _directory_lock(plan.lock_paths.runtime.parent, plan.target.name):
        yield


@contextlib.contextmanager
def _directory_lock(directory: Path, name: str) -> Iterator[None]:
    """flock(2) on locks/<target>/ (build, lock and prune share it); Busy (75) when held."""
    if not directory.is_dir():
        yield  # no locks directory: the offline checks refuse this build before it writes anything
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(
                f"{name}: another build of this target is running in this checkout (or its `build lock` "
                "or `prune`); wait for it to finish, then run again"
            ) from None
        for done in records.recover(directory):
            log.info(f"    {directory}: {done}")
        yield
    finally:
        os.close(fd)


def prune(root: Path, names: list[str], keep: int) -> list[Path]:
    """`build prune`: per target, under its lock (never beside a live build), all but the newest
    ``keep`` build directories and ``keep`` test directories under artifacts/ are removed. The
    build image.json names is never removed; the rest are ordered by when they last wrote (not by
    their wall-clock names, which a skewed clock makes lie). Returns what was removed."""
    removed = []
    for name in names:
        with _directory_lock(contract.record_path(root, name).parent, name):
            removed += _prune_target(root, name, keep)
    return removed


def _prune_target(root: Path, name: str, keep: int) -> list[Path]:
    recorded = _recorded_builds(root, name)  # a damaged record: refused, nothing removed

    def last_written(p: Path) -> tuple[float, str]:
        return max((f.stat().st_mtime for f in p.iterdir() if f.is_file()), default=p.stat().st_mtime), p.name

    dirs = sorted((p for p in (root / contract.ARTIFACTS_DIR / name).glob("*") if p.is_dir()), key=last_written)
    removed = []
    for kind in (lambda p: p.name.startswith("test-"), lambda p: not p.name.startswith("test-")):
        chosen = [p for p in dirs if kind(p) and p.name != "rehearsal" and p.name not in recorded]
        room = keep - sum(1 for p in dirs if kind(p) and p.name in recorded)
        for old in chosen[: max(0, len(chosen) - max(room, 0))]:
            shutil.rmtree(old)
            removed.append(old)
    return removed


def _recorded_builds(root: Path, name: str) -> set[str]:
    """The build ids the records name: the one image's, or every platform's of an image index."""
    from builder.records import index

    path = contract.record_path(root, name)
    paths = [path]
    if index.kind_of(path) == contract.INDEX_KIND:
        found = index.read(path)
        paths = [path.parent / e["record"] for e in found.platforms.values()] if found else []
    ids = set()
    for p in paths:
        record = records.read(p)
        if record is not None and (record.build or {}).get("id"):
            ids.add(str(record.build["id"]))
    return ids

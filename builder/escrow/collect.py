"""Where each input's bytes are on this machine, as files the escrow uploads: the pinned commits
as git bundles made from the local mirrors, the wheels, .debs and CPython tarball from the tool's
hash-checked caches (downloaded again, and checked again, when the cache lost them), the recipe
files from the repository. Base images are copied registry to registry (builder/escrow/push.py).

Every file is hashed here, as it will be pushed: a wheel whose sha256 is not one of its lock
entry's is refused (LockError, exit 2) before anything is pushed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from builder.config import contract
from builder.deps import buildcontext
from builder.errors import LockError, SourceError
from builder.escrow.inputs import (
    DebInput,
    Input,
    Inventory,
    Kind,
    PythonInput,
    RecipeInput,
    SourceInput,
    WheelInput,
    platform_files,
)
from builder.fsutil import sha256_file
from builder.source import pinned


@dataclass(frozen=True)
class LocalBlob:
    path: Path
    sha256: str  # hex
    size: int
    title: str  # the file name an auditor's `oras pull` writes (org.opencontainers.image.title)
    shallow: bool = False  # a git bundle whose history stops at the pinned commit (see ``bundle``)


def collect(root: Path, target, inventory: Inventory, work: Path) -> dict[str, LocalBlob]:
    """Input key -> its bytes on disk, for every input but the bases."""
    wheels = _wheel_files(root, target)
    out: dict[str, LocalBlob] = {}
    for item in inventory.inputs:
        if item.kind is Kind.BASE:
            continue
        out[item.key] = _local(root, target, item, wheels, work)
    return out


def _local(root: Path, target, item: Input, wheels: dict[str, dict[str, Path]], work: Path) -> LocalBlob:
    if isinstance(item, SourceInput):
        made = bundle(item, work)
        blob = _blob(made, f"{item.name.replace('/', '_')}-{item.commit[:12]}.bundle")
        return LocalBlob(blob.path, blob.sha256, blob.size, blob.title, shallow=is_shallow(made))
    if isinstance(item, WheelInput):
        own = wheels.get(item.lock, {})  # its own lock's wheelhouse: another platform's has another file
        path = next((own[h] for h in item.hashes if h in own), None)
        if path is None:
            raise LockError(f"{item.lock}: {item.name}=={item.version}: no cached wheel has one of its sha256")
        return _blob(path, path.name)
    if isinstance(item, DebInput):
        return _blob(buildcontext.fetch_deb(item.entry), item.entry.filename)
    if isinstance(item, PythonInput):
        path = buildcontext.standalone_python(target.for_platform(item.platform))
        return _blob(path, item.url.rsplit("/", 1)[-1] or path.name)
    assert isinstance(item, RecipeInput)
    path = root / item.path
    blob = _blob(path, item.path.replace("/", "_"))
    if blob.sha256 != item.sha256:
        raise LockError(f"{item.path}: changed while the escrow read it; run again")
    return blob


def _blob(path: Path, title: str) -> LocalBlob:
    return LocalBlob(path, sha256_file(path), path.stat().st_size, title)


def _wheel_files(root: Path, target) -> dict[str, dict[str, Path]]:
    """Lock path (as inputs.py names it) -> sha256 (hex) -> the wheel its build installed, for every
    lock of every platform. Per lock: a lock entry names every platform's wheel by hash, and only
    its own platform's wheelhouse says which one that platform's build read."""
    found: dict[str, dict[str, Path]] = {}
    for files in platform_files(root, target):
        for name in (contract.LOCK_NAME, contract.BUILD_LOCK_NAME):
            lock_file = files.locks / name
            if not lock_file.exists():
                continue
            house = buildcontext.wheelhouse(target.for_platform(files.platform), lock_file)
            rel = lock_file.resolve().relative_to(root.resolve()).as_posix()
            found[rel] = {sha256_file(w): w for w in sorted(house.iterdir()) if not w.name.startswith(".")}
    return found


GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}


def bundle(item: SourceInput, work: Path) -> Path:
    """A git bundle of ``item.commit`` and its history, made in a scratch repository that borrows
    the mirror's objects (alternates): the shared mirror gets no ref and no write. One pack thread,
    so the same commit bundles to the same bytes with one git version (the escrow then finds it
    already there); another git version may pack differently: a new blob, same commit.

    A third-party tree fetched by id is fetched at depth 1 (builder/source/pinned.py): its mirror
    is shallow, so its bundle holds the pinned commit and its tree but not its parents. Unbundle
    it into a repository whose ``shallow`` file names the commit (docs/auditor.md)."""
    # The mirror the build fetched the commit into (fetched by id when the cache lost it); its
    # module is at its line limit, so its private helper is called from here.
    mirror = Path(pinned._commit_repo(item.url, item.commit).git_dir)
    name = hashlib.sha256(f"{item.url}@{item.commit}".encode()).hexdigest()[:24]
    out = work / f"{name}.bundle"
    with tempfile.TemporaryDirectory(dir=work) as scratch:
        _git(["init", "--quiet", "--bare", scratch])
        Path(scratch, "objects", "info", "alternates").write_text(str(Path(mirror, "objects").resolve()) + "\n")
        if Path(mirror, "shallow").exists():  # a tree fetched by id at depth 1: its history stops here
            shutil.copyfile(Path(mirror, "shallow"), Path(scratch, "shallow"))
        _git(["-C", scratch, "update-ref", "refs/heads/pinned", item.commit])
        _git(["-C", scratch, "-c", "pack.threads=1", "bundle", "create", "--quiet", str(out), "refs/heads/pinned"])
    return out


def is_shallow(path: Path) -> bool:
    """Whether the bundle's pinned commit names a parent the bundle does not hold (no prerequisite
    is listed: git's bundle format cannot say "shallow", so it is recorded in the escrow manifest)."""
    with tempfile.TemporaryDirectory() as scratch:
        _git(["init", "--quiet", "--bare", scratch])
        proc = subprocess.run(
            ["git", "-C", scratch, "fetch", "--quiet", str(path), "refs/heads/pinned:refs/heads/pinned"],
            capture_output=True,
            env={**os.environ, **GIT_ENV},
        )
        return proc.returncode != 0


def _git(args: list[str]) -> None:
    proc = subprocess.run(["git", *args], capture_output=True, text=True, env={**os.environ, **GIT_ENV})
    if proc.returncode != 0:
        raise SourceError(f"git {args[-2] if len(args) > 1 else args[0]}: {proc.stderr.strip()[:200]}")

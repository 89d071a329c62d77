"""A new git mirror in the shared cache, made whole beside its path and renamed into place: a build
sharing the cache sees no mirror or a whole one. Made in place (``git.Repo.init(path, mkdir=True)``),
it was a directory without HEAD for a moment, and another build's GitPython refused it as not a
repository (seen in the suite's two checkouts sharing an empty cache, 2026-12-07). A rename onto a
mirror another build finished first fails, and theirs is kept. builder/source/pinned.py sets its
configuration and fetches into it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path


def mirror_at(path: Path) -> Path:
    """``path``, made an empty bare repository first when there is nothing there yet."""
    if not path.exists():
        init_mirror(path)
    return path


def init_mirror(path: Path) -> None:
    """An empty bare repository at ``path``, unless another build's is there first."""
    import git

    path.parent.mkdir(parents=True, exist_ok=True)
    made = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        git.Repo.init(made, bare=True)
        try:
            made.rename(path)
        except OSError:
            if not path.exists():
                raise
    finally:
        shutil.rmtree(made, ignore_errors=True)  # gone already once renamed

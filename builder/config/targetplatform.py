"""One platform of one target, and what follows from which platform it is: where its committed
files are (its Dockerfile and locks), where its record set is, the tag its manifest is pushed
under, its BuildKit cache ids, and which manifest of an image index is its own. The pipeline's
plan, `build verify`, the provenance, the escrow and the Dockerfile's renderer ask this module;
none of them writes the first-platform rule again. (What a platform is built from, its bases and
CPython, is builder/config/platforms.py's; whether the builder runs it natively is
``platforms.native_platforms`` and ``pipeline.context.emulated_refused``; the largest page size
of its machine is ``contract.LARGEST_PAGE``, read against the image's own machine.)

The rule: a target's first platform keeps its Dockerfile, locks and cache ids where a
one-platform target keeps them (naming a second platform moves no committed file, and keeps the
caches warm); each further platform's sit in a directory of its own, named by its slug
(linux/arm64 -> linux-arm64). The record set and the tag of every platform of an image index,
the first's included, are the platform's own (locks/<target>/<os>-<arch>/, <tag>-<os>-<arch>):
locks/<target>/image.json and the tag are then the index's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.config import contract

if TYPE_CHECKING:
    from builder.config.schema import Target


@dataclass(frozen=True)
class LockPaths:
    """Where a target's committed locks are: the runtime and build locks, and the OS package lock
    for a target with os_packages (None otherwise)."""

    runtime: Path
    build: Path
    os: Path | None = None

    def named(self) -> list[tuple[str, Path]]:
        """(kind, path) of each lock the target has, in the order `build plan` shows them."""
        return [("runtime", self.runtime), ("build", self.build), *([("os", self.os)] if self.os else [])]


@dataclass(frozen=True)
class TargetPlatform:
    """One platform of a target as its files, record and tag see it. ``name`` None: the target as
    a whole (a one-platform target's image, or an image index's own record and tag)."""

    target: str  # the target's name
    tag: str  # the target's image tag (the index's, for a target that names platforms)
    name: str | None  # os/arch
    first: bool  # the target's first platform (or the target as a whole): its files in place
    os_lock: bool  # the target has os_packages, so an OS lock

    @classmethod
    def of(cls, target: Target, platform: str | None) -> TargetPlatform:
        """``platform`` of ``target``: the whole target, or one platform's view of it
        (``Target.for_platform``), which knows whether it is a later platform."""
        first = platform is None or (platform == target.platform_names()[0] and not target.later_platform)
        return cls(target.name, target.image.tag, platform, first, target.os_packages is not None)

    @property
    def slug(self) -> str | None:
        return contract.platform_slug(self.name) if self.name else None

    def _placed(self, path: Path) -> Path:
        """``path`` (a one-platform target's) for this platform: in place for the first."""
        return path if self.first or self.slug is None else path.parent / self.slug / path.name

    def dockerfile(self, root: Path) -> Path:
        return self._placed(contract.dockerfile_path(root, self.target))

    def lock_dir(self, root: Path) -> Path:
        return self._placed(contract.lock_path(root, self.target)).parent

    def lock_paths(self, root: Path) -> LockPaths:
        return LockPaths(
            runtime=self._placed(contract.lock_path(root, self.target)),
            build=self._placed(contract.build_lock_path(root, self.target)),
            os=self._placed(contract.os_lock_path(root, self.target)) if self.os_lock else None,
        )

    def record_dir(self, root: Path) -> Path:
        """locks/<target>/, or locks/<target>/<os>-<arch>/ for one platform of an image index."""
        if self.name is None:
            return contract.record_path(root, self.target).parent
        return contract.platform_record_dir(root, self.target, self.name)

    @property
    def image_tag(self) -> str:
        """The tag this platform's build pushes: the target's, or <tag>-<os>-<arch>."""
        return contract.platform_tag(self.tag, self.name) if self.name else self.tag

    @property
    def cache_id(self) -> str:
        """The Dockerfile's BuildKit cache mount ids' suffix: an arm64 apt/pip/sccache cache is not
        amd64's; the first platform's stay the target's, the ids its caches had before platforms."""
        return self.target if self.first or self.slug is None else f"{self.target}-{self.slug}"


def index_manifests(doc: Mapping[str, Any]) -> dict[str, str | None]:
    """os/arch -> the manifest digest an image index names for it (each entry's ``platform``):
    the manifest a platform selects, for `build test --image` and `build verify --registry` alike.
    The index may come from anywhere: an entry that is no object, or names no platform, is still
    named ("None/None"), so that a comparison with a record sees it; a digest that is not
    sha256:<64 hex> is None, no manifest to check."""
    named: dict[str, str | None] = {}
    for m in doc.get("manifests") or []:
        entry = m if isinstance(m, dict) else {}
        platform = entry.get("platform")
        platform = platform if isinstance(platform, dict) else {}
        digest = entry.get("digest")
        ok = isinstance(digest, str) and re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
        # A platform named twice: the first entry, the one a pull picks (containerd and Docker alike).
        named.setdefault(f"{platform.get('os')}/{platform.get('architecture')}", digest if ok else None)
    return named

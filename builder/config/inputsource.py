"""Where a build's inputs come from: upstream (the source's git host, PyPI, the OS archive, the
bases' registry, through the machine's caches), or a build's escrow (builder/escrow/), read back
with nothing but the escrow registry. The one seam between the two: the per-build context carries
an ``InputSource`` and the steps that fetch ask its ``origin``; every check after the fetch (the
pinned commits, the lock's and the matrix's sha256, the untrusted-tree rules) is the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path


class Origin(str, Enum):
    UPSTREAM = "upstream"
    ESCROW = "escrow"


@dataclass(frozen=True)
class InputSource:
    """``cache``: the cache directory the run reads (None: the machine's); for the escrow a fresh
    one, its git mirrors made from the escrowed bundles and its wheels, .debs and CPython tarball
    the escrowed files, so nothing the machine cached before is read. ``bases``: the repository
    (REGISTRY/REPO) serving every base by its pinned digest (None: the Dockerfile's own references)."""

    origin: Origin
    cache: Path | None = None
    bases: str | None = None
    reference: str | None = None  # the escrow reference the run was given, for the log

    @property
    def escrowed(self) -> bool:
        return self.origin is Origin.ESCROW

    def base_ref(self, digest: str) -> str | None:
        """The reference the build pulls a base of ``digest`` by: the escrow's, or None (the pin's)."""
        return f"{self.bases}@{digest}" if self.bases else None


UPSTREAM = InputSource(Origin.UPSTREAM)

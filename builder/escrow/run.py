"""`build escrow` for one target, start to end: the inventory, the bytes, the pushes, the signed
manifest, and locks/<target>/escrow.json written through the record set's writer."""

from __future__ import annotations

import tempfile
from pathlib import Path

from builder.config import contract
from builder.engine.registry import RegistryClient
from builder.errors import ConfigError
from builder.escrow import manifest as em
from builder.escrow.collect import collect
from builder.escrow.inputs import inventory
from builder.escrow.push import Pushed, default_repository, escrow
from builder.records import store


def repository(to: str | None, image: str) -> str:
    if to is None:
        return default_repository(image)
    if not em.REPOSITORY.fullmatch(to):
        raise ConfigError(f"--to {to[:80]!r}: not REGISTRY/REPOSITORY (a registry host, a lowercase path, no tag)")
    return to


def escrow_target(matrix, name: str, to: str | None = None, client: RegistryClient | None = None) -> Pushed:
    """Escrow the recorded build of ``name``; escrow.json is written only after every push held."""
    root = matrix.path.resolve().parent
    target = matrix.target(name)
    inv = inventory(root, target)
    dest = repository(to, inv.image)
    with tempfile.TemporaryDirectory(prefix="k3-escrow.") as tmp:
        work = Path(tmp)
        blobs = collect(root, target, inv, work)
        pushed = escrow(
            client or RegistryClient(), inv, blobs, dest, work, lambda m: em.envelope(m, target.signing, root)
        )
    store.write_set(contract.record_path(root, name).parent, {em.ESCROW_NAME: pushed.envelope})
    return pushed

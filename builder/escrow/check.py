"""`build verify --registry`'s escrow row: locks/<target>/escrow.json is signed like the
provenance (the same three questions, offline), it escrows the recorded digest, it holds every
input the record set names (the inventory, builder/escrow/inputs.py), and the registry serves
each one: a HEAD of every input's blob and artifact manifest, and of every manifest and blob of
each escrowed base. A blob deleted from the escrow fails the row, naming the input."""

from __future__ import annotations

from pathlib import Path

from builder.config import contract
from builder.engine.blobcopy import BlobCopier
from builder.engine.registry import RegistryClient
from builder.errors import BuilderError
from builder.escrow import manifest as em
from builder.escrow.inputs import Kind, inventory
from builder.records.verify import Row

ROW = "registry: escrow"
HOLDS_WHEN = (
    "(a target with `locks/<target>/escrow.json`) the escrow manifest is signed like the provenance "
    "(the three provenance questions, offline), escrows the recorded digest, names every input the record set "
    "names, and the escrow registry serves each one (HEAD of every blob and manifest); without escrow.json it "
    "holds and says the build is not escrowed"
)


class _Fail(Exception):
    pass


def escrow_row(root: Path, target, client: RegistryClient | None = None) -> Row:
    path = contract.record_path(root, target.name).parent / em.ESCROW_NAME
    if not path.exists():
        return Row(
            ROW, True, f"not escrowed (no {em.ESCROW_NAME}): `build escrow --target {target.name}` keeps its inputs"
        )
    try:
        return Row(ROW, True, _check(root, target, path, client or RegistryClient()))
    except _Fail as exc:
        return Row(ROW, False, str(exc))
    except BuilderError as exc:  # a damaged record, the registry out of reach
        return Row(ROW, False, exc.message)


def _check(root: Path, target, path: Path, client: RegistryClient) -> str:
    try:
        env, escrowed = em.parse(path.read_text(encoding="utf-8"), path.name)
    except (OSError, UnicodeDecodeError) as exc:
        raise _Fail(f"{path.name}: {exc}") from None
    except ValueError as exc:  # em.parse names the file
        raise _Fail(str(exc)) from None
    bad = [a.detail for a in em.signature_answers(env, target.signing, root) if not a.ok]
    if bad:
        raise _Fail(f"{path.name}: " + "; ".join(bad))
    inv = inventory(root, target)
    if escrowed.digest != inv.digest:
        raise _Fail(
            f"{path.name} escrows {escrowed.digest[:19]}, the record names {inv.digest[:19]}: run `build escrow`"
        )
    missing = sorted(set(inv.by_key()) - set(escrowed.entries))
    if missing:
        raise _Fail(f"the escrow lacks {len(missing)} input(s) the record names: {_names(missing)}")
    copier = BlobCopier(client)
    gone = [
        key for key, entry in sorted(escrowed.entries.items()) if not _served(client, copier, escrowed.escrow, entry)
    ]
    if gone:
        raise _Fail(f"{escrowed.escrow} does not serve {len(gone)} escrowed input(s): {_names(gone)}")
    return (
        f"{len(escrowed.entries)} inputs, each served by {escrowed.escrow} (signed: {env.signatures and 'yes' or 'no'})"
    )


def _served(client: RegistryClient, copier: BlobCopier, repo: str, entry: em.Entry) -> bool:
    if entry.kind is Kind.BASE:
        return _image_served(client, copier, repo, entry.digest)
    return copier.has_manifest(repo, entry.artifact) and copier.has_blob(repo, entry.digest)


def _image_served(client: RegistryClient, copier: BlobCopier, repo: str, digest: str) -> bool:
    got = client.raw_manifest(repo, digest)
    if got is None:
        return False
    doc = got.doc
    if not all(_image_served(client, copier, repo, m["digest"]) for m in doc.get("manifests", [])):
        return False
    blobs = [doc["config"], *doc.get("layers", [])] if "config" in doc else []
    return all(copier.has_blob(repo, d["digest"]) for d in blobs)


def _names(keys: list[str], limit: int = 5) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")

"""The first step of `build reproduce --from-escrow REF`: the escrow read back with nothing but
the escrow registry. The escrow manifest is found in the index REF names, its signature checked
offline against the matrix's key (the provenance's three questions), then every input it names is
downloaded and its digest checked, into a directory written as one unit:

    escrow.json                    the signed escrow manifest
    source/ wheel/ deb/ python/ recipe/   each input under the file name its artifact gives it
    bases/                         an OCI image layout (index.json, blobs/sha256/): every base,
                                   every platform, each named by its input key

A blob whose bytes are not the digest the manifest names is refused (RecordError, exit 2); a
missing one is named with every other missing one (exit 2); either way nothing is written.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

from builder.engine.blobcopy import BlobCopier
from builder.engine.registry import OCI_INDEX, RegistryClient, split_reference
from builder.errors import RecordError
from builder.escrow import manifest as em
from builder.escrow.inputs import Kind
from builder.fsutil import sha256_file

_TITLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+%=-]{0,200}")  # a plain file name: no path, no dot-file


class _Missing(Exception):
    pass


def download(ref: str, target, root: Path, dest: Path, client: RegistryClient | None = None) -> em.EscrowManifest:
    """Every input of the escrow ``ref`` ("registry/repo@sha256:..." or ":tag") into ``dest``."""
    client = client or RegistryClient()
    name, reference = split_reference(ref)
    envelope = _envelope(client, name, reference, ref)
    try:
        env, escrowed = em.parse(envelope, f"{ref}: the escrow manifest")
    except ValueError as exc:  # not an envelope, not our predicate: what the registry served is refused
        raise RecordError(str(exc)) from None
    bad = [a.detail for a in em.signature_answers(env, target.signing, root) if not a.ok]
    if bad:
        raise RecordError(f"{ref}: the escrow manifest: " + "; ".join(bad))
    if escrowed.target != target.name:
        raise RecordError(f"{ref}: escrows target {escrowed.target!r}, not {target.name!r}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".escrow.", dir=dest.parent) as tmp:
        staging = Path(tmp) / "escrow"
        staging.mkdir()
        (staging / em.ESCROW_NAME).write_text(envelope)
        _inputs(BlobCopier(client), name, escrowed, staging)
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
    return escrowed


def _envelope(client: RegistryClient, name: str, reference: str, ref: str) -> str:
    index = client.raw_manifest(name, reference)
    if index is None or index.doc.get("artifactType") != em.INDEX_TYPE:
        raise RecordError(
            f"{ref}: {'not served' if index is None else 'not an escrow index'} (`build escrow` prints one)"
        )
    found = [m for m in index.doc.get("manifests", []) if m.get("artifactType") == em.MANIFEST_TYPE]
    digests = [m.get("digest") for m in found]
    artifact = client.raw_manifest(name, digests[0]) if digests and isinstance(digests[0], str) else None
    layers = artifact.doc.get("layers", []) if artifact is not None else []
    layer = layers[0].get("digest") if len(digests) == 1 and len(layers) == 1 else None
    if not isinstance(layer, str):  # the index is anyone's bytes until the envelope's signature holds
        raise RecordError(f"{ref}: the escrow index names no single escrow manifest")
    return client.blob(name, layer).decode("utf-8", "replace")


def _inputs(copier: BlobCopier, name: str, escrowed: em.EscrowManifest, out: Path) -> None:
    missing: list[str] = []
    layout = _Layout(copier, name, out / "bases")
    for key, entry in sorted(escrowed.entries.items()):
        try:
            if entry.kind is Kind.BASE:
                layout.image(key, entry.digest)
            else:
                _file(copier, name, key, entry, out)
        except _Missing as exc:
            missing.append(f"{key} ({exc})")
    if missing:
        raise RecordError(f"{name}: the escrow lacks {len(missing)} input(s): " + "; ".join(missing[:10]))
    layout.finish()


def _file(copier: BlobCopier, name: str, key: str, entry: em.Entry, out: Path) -> None:
    if not _TITLE.fullmatch(entry.title) or entry.title.startswith("."):
        raise RecordError(f"{key}: its file name {entry.title[:60]!r} is not a plain file name; refused")
    art = copier.client.raw_manifest(name, entry.artifact)
    if art is None:
        raise _Missing(f"artifact {entry.artifact[:19]} not served")
    layers = art.doc.get("layers", [])
    if [layer.get("digest") for layer in layers] != [entry.digest]:
        raise RecordError(f"{key}: its artifact {entry.artifact[:19]} holds other bytes than the escrow manifest's")
    where = out / entry.kind.value / entry.title
    where.parent.mkdir(exist_ok=True)
    if where.exists():  # the same bytes under two keys (one wheel in two locks): written once
        if "sha256:" + sha256_file(where) != entry.digest:
            raise RecordError(f"{key}: its file name {entry.title!r} is another input's, with other bytes; refused")
        return
    _blob(copier, name, key, entry.digest, where)


def _blob(copier: BlobCopier, name: str, key: str, digest: str, where: Path) -> None:
    got = copier.download(name, digest, where)
    if got is None:
        raise _Missing(f"blob {digest[:19]} not served")
    if got != digest:
        raise RecordError(
            f"{key}: the escrow served bytes with digest {got[:19]}, the escrow manifest says {digest[:19]}"
        )


class _Layout:
    """An OCI image layout of the escrowed bases (each manifest and blob once)."""

    def __init__(self, copier: BlobCopier, name: str, out: Path) -> None:
        self.copier, self.name, self.out = copier, name, out
        self.refs: list[dict] = []

    def image(self, key: str, digest: str) -> None:
        top = self._manifest(key, digest)
        self.refs.append({**top, "annotations": {"org.opencontainers.image.ref.name": key.replace(" ", "_")}})

    def _manifest(self, key: str, digest: str) -> dict:
        got = self.copier.client.raw_manifest(self.name, digest)
        if got is None:
            raise _Missing(f"manifest {digest[:19]} not served")
        self._write(digest, got.raw)
        for child in got.doc.get("manifests", []):
            self._manifest(key, child["digest"])
        for desc in [got.doc["config"], *got.doc.get("layers", [])] if "config" in got.doc else []:
            path = self._path(desc["digest"])
            if not path.exists():
                _blob(self.copier, self.name, key, desc["digest"], path)
        return {"mediaType": got.media_type, "digest": digest, "size": len(got.raw)}

    def _path(self, digest: str) -> Path:
        algo, _, hexa = digest.partition(":")
        if algo != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", hexa):
            raise RecordError(f"{self.name}: {digest[:80]!r} is not a sha256 digest")
        (self.out / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        return self.out / "blobs" / "sha256" / hexa

    def _write(self, digest: str, raw: bytes) -> None:
        self._path(digest).write_bytes(raw)

    def finish(self) -> None:
        if not self.refs:
            return
        (self.out / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}\n')
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": self.refs}
        (self.out / "index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")

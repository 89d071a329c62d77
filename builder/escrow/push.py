"""`build escrow`'s pushes: each input as a content-addressed OCI 1.1 artifact (an image manifest
with an ``artifactType``, the empty config and one layer: the input's bytes), each base image
copied by digest with every platform it carries (its index, platform manifests and blobs: a
cross-repository mount on the same registry, else pulled and pushed through the client), the
signed escrow manifest as an artifact, and one index tagged ``escrow-<image digest hex>`` that
names them all, so the registry keeps every part reachable from a tag (a garbage collection
that drops untagged manifests keeps them).

Idempotent: every blob and manifest is looked for first (HEAD) and pushed only when it is not
there; what was pushed, mounted or already there is counted in bytes per input kind.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from builder.engine.blobcopy import BlobCopier
from builder.engine.registry import EMPTY_JSON, OCI_EMPTY, OCI_INDEX, OCI_MANIFEST, RegistryClient, split_reference
from builder.errors import RegistryUnavailable
from builder.escrow import manifest as em
from builder.escrow.collect import LocalBlob
from builder.escrow.inputs import BaseInput, Inventory, Kind


def default_repository(image: str) -> str:
    """Beside the image, in its registry: the same credentials, lifetime and place an auditor
    already reads; a repository of its own (``<repository>-escrow``), so the image repository's
    tags and retention rules are not the escrow's (an escrow is kept for the bridge's life)."""
    return image.split("@", 1)[0] + "-escrow"


def tag_for(digest: str) -> str:
    return "escrow-" + digest.removeprefix("sha256:")


@dataclass
class Tally:
    """Bytes per kind: pushed (uploaded), mounted (same registry, no upload), already there."""

    pushed: dict[Kind, int] = field(default_factory=lambda: defaultdict(int))
    mounted: dict[Kind, int] = field(default_factory=lambda: defaultdict(int))
    already: dict[Kind, int] = field(default_factory=lambda: defaultdict(int))

    def rows(self) -> list[dict[str, int | str]]:
        kinds = [k for k in Kind if k in self.pushed or k in self.mounted or k in self.already]
        return [
            {"kind": k.value, "pushed": self.pushed[k], "mounted": self.mounted[k], "already": self.already[k]}
            for k in kinds
        ]


@dataclass(frozen=True)
class Pushed:
    repository: str
    tag: str
    index: str  # the escrow index's digest: what `reproduce --from-escrow` is given
    manifest: em.EscrowManifest
    envelope: str
    tally: Tally


class Escrow:
    def __init__(self, client: RegistryClient, repository: str, work: Path) -> None:
        self.client, self.dest, self.work = client, repository, work
        self.copier = BlobCopier(client)
        self.tally = Tally()

    def blob(self, kind: Kind, path: Path, digest: str, size: int) -> None:
        if self.copier.has_blob(self.dest, digest):
            self.tally.already[kind] += size
            return
        self.copier.push_file(self.dest, path, digest)
        self.tally.pushed[kind] += size

    def manifest(self, raw: bytes, media_type: str) -> str:
        digest = em_digest(raw)
        if not self.copier.has_manifest(self.dest, digest):
            self.copier.push_manifest(self.dest, raw, media_type)
        return digest

    def artifact(self, kind: Kind, key: str, blob: LocalBlob) -> str:
        """The input's artifact manifest (pushed unless there); returns its digest."""
        self.blob(kind, blob.path, "sha256:" + blob.sha256, blob.size)
        artifact_type, layer_type = em.MEDIA[kind]
        return self.manifest(
            _artifact(artifact_type, layer_type, blob.sha256, blob.size, blob.title, key), OCI_MANIFEST
        )

    def base(self, item: BaseInput) -> int:
        """Copy ``item`` (index or image) by digest; returns the size of its top manifest."""
        return self._image(split_reference(item.name.split("@", 1)[0])[0], item.digest)

    def _image(self, source: str, digest: str) -> int:
        # Read from the escrow when it has it (the upstream may be gone), else from the source.
        got = self.client.raw_manifest(self.dest, digest) or self.client.raw_manifest(source, digest)
        if got is None:
            raise RegistryUnavailable(f"registry: base {source}@{digest}: served by neither the escrow nor {source}")
        doc = got.doc
        for child in doc.get("manifests", []):
            self._image(source, child["digest"])
        for desc in [doc["config"], *doc.get("layers", [])] if "config" in doc else []:
            self._base_blob(source, desc["digest"], int(desc["size"]))
        self.manifest(got.raw, got.media_type)
        return len(got.raw)

    def _base_blob(self, source: str, digest: str, size: int) -> None:
        if self.copier.has_blob(self.dest, digest):
            self.tally.already[Kind.BASE] += size
        elif self.copier.mount(self.dest, digest, source):
            self.tally.mounted[Kind.BASE] += size
        else:
            tmp = self.work / ("base-" + digest.removeprefix("sha256:"))
            try:
                self.client.blob_to(source, digest, tmp)
                self.copier.push_file(self.dest, tmp, digest)
            finally:
                tmp.unlink(missing_ok=True)
            self.tally.pushed[Kind.BASE] += size


def em_digest(raw: bytes) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(raw).hexdigest()


def _canonical(doc: dict) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _artifact(artifact_type: str, layer_type: str, sha256: str, size: int, title: str, key: str) -> bytes:
    return _canonical(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "artifactType": artifact_type,
            "config": {"mediaType": OCI_EMPTY, "digest": em_digest(EMPTY_JSON), "size": len(EMPTY_JSON)},
            "layers": [
                {"mediaType": layer_type, "digest": "sha256:" + sha256, "size": size, "annotations": {em.TITLE: title}}
            ],
            "annotations": {em.KEY: key},
        }
    )


def push_all(esc: Escrow, inventory: Inventory, blobs: dict[str, LocalBlob]) -> dict[str, em.Entry]:
    """Every input into the escrow; input key -> its entry."""
    esc.copier.push_bytes(esc.dest, EMPTY_JSON)
    entries: dict[str, em.Entry] = {}
    for item in inventory.inputs:
        if isinstance(item, BaseInput):
            size = esc.base(item)
            pin = {"name": item.name, "platform": item.platform}
            entries[item.key] = em.Entry(Kind.BASE, item.digest, size, item.digest, item.name, pin)
            continue
        blob = blobs[item.key]
        artifact = esc.artifact(item.kind, item.key, blob)
        pin = _pin(item) | ({"history": "shallow"} if blob.shallow else {})
        entries[item.key] = em.Entry(item.kind, "sha256:" + blob.sha256, blob.size, artifact, blob.title, pin)
    return entries


def _pin(item) -> dict[str, str]:
    if item.kind is Kind.SOURCE:
        return {"url": item.url, "commit": item.commit}
    if item.kind is Kind.WHEEL:
        return {"lock": item.lock, "name": item.name, "version": item.version}
    if item.kind is Kind.DEB:
        return {"lock": item.lock, "url": item.entry.url, "sha256": item.entry.sha256}
    if item.kind is Kind.PYTHON:
        return {"url": item.url, "sha256": item.sha256}
    return {"path": item.path, "sha256": item.sha256}


def seal(esc: Escrow, manifest: em.EscrowManifest, envelope: str, tag: str) -> str:
    """The signed manifest as an artifact, then the index naming every part, tagged; its digest."""
    raw_env = envelope.encode()
    digest = esc.copier.push_bytes(esc.dest, raw_env)
    statement = _artifact(
        em.MANIFEST_TYPE, em.DSSE_MEDIA, digest.removeprefix("sha256:"), len(raw_env), em.ESCROW_NAME, ""
    )
    parts = [(esc.manifest(statement, OCI_MANIFEST), len(statement), OCI_MANIFEST, em.MANIFEST_TYPE, "escrow manifest")]
    seen = {parts[0][0]}
    for key, entry in sorted(manifest.entries.items()):
        if entry.artifact in seen:
            continue
        seen.add(entry.artifact)
        got = esc.client.raw_manifest(esc.dest, entry.artifact)
        if got is None:
            raise RegistryUnavailable(f"registry: {esc.dest}@{entry.artifact}: pushed, then not served ({key})")
        parts.append((entry.artifact, len(got.raw), got.media_type, got.doc.get("artifactType", ""), key))
    index = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "artifactType": em.INDEX_TYPE,
        "manifests": [  # a base keeps its own manifest: no artifactType there
            {"mediaType": m, "digest": d, "size": s, **({"artifactType": t} if t else {}), "annotations": {em.KEY: k}}
            for d, s, m, t, k in parts
        ],
        "annotations": {"dev.k3-builder.escrow.subject": manifest.digest},
    }
    raw = _canonical(index)
    return esc.copier.push_manifest(esc.dest, raw, OCI_INDEX, tag=tag)


def escrow(client: RegistryClient, inventory: Inventory, blobs, repository: str, work: Path, sign) -> Pushed:
    """Push every input, the signed escrow manifest and the index; ``sign(manifest) -> envelope``."""
    esc = Escrow(client, repository, work)
    entries = push_all(esc, inventory, blobs)
    manifest = em.EscrowManifest(inventory.target, inventory.image, inventory.digest, repository, entries)
    envelope = sign(manifest)
    tag = tag_for(inventory.digest)
    index = seal(esc, manifest, envelope, tag)
    return Pushed(repository, tag, index, manifest, envelope, esc.tally)

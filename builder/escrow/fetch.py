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

import contextlib
import hashlib
import json
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from builder.engine.blobcopy import BlobCopier
from builder.engine.registry import OCI_INDEX, Manifest, RegistryClient, split_reference
from builder.errors import ConfigError, RecordError
from builder.escrow import manifest as em
from builder.escrow.inputs import Kind
from builder.fsutil import sha256_file

_TITLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+%=-]{0,200}")  # a plain file name: no path, no dot-file


class _Missing(Exception):
    pass


def download(
    ref: str,
    target,
    root: Path,
    dest: Path,
    client: RegistryClient | None = None,
    check: Callable[[em.EscrowManifest], object] | None = None,
) -> em.EscrowManifest:
    """Every input of the escrow ``ref`` ("registry/repo@sha256:..." or ":tag") into ``dest``.
    ``check``: asked of the signed escrow manifest before any input is downloaded (its refusal, like
    any other, leaves nothing written)."""
    if not em.REFERENCE.fullmatch(ref):  # asked of no registry (a bare name would be Docker Hub's)
        raise ConfigError(
            f"--from-escrow {ref[:100]!r}: not REGISTRY/REPO@sha256:<digest> or REGISTRY/REPO:<tag> "
            "(`build escrow` prints it)"
        )
    copier = BlobCopier(client or RegistryClient())
    name, reference = split_reference(ref)
    made = [p for p in (dest.parent, *dest.parent.parents) if not p.exists()]
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(prefix=".escrow.", dir=dest.parent) as tmp:
            staging = Path(tmp) / "escrow"
            staging.mkdir()
            escrowed = _signed(copier, name, reference, ref, staging / em.ESCROW_NAME, target, root)
            if check is not None:
                check(escrowed)
            _inputs(copier, name, escrowed, staging)
            if dest.exists():
                shutil.rmtree(dest)
            staging.rename(dest)
    except BaseException:
        for path in made:  # the directories made for it, innermost first: a refusal writes nothing
            with contextlib.suppress(OSError):
                path.rmdir()
        raise
    return escrowed


def _signed(copier: BlobCopier, name: str, reference: str, ref: str, path: Path, target, root: Path):
    """The escrow manifest ``ref``'s index names, downloaded into ``path``: refused unless its
    signature holds (the matrix's key, offline) and it escrows ``target``."""
    try:
        _blob(copier, name, "the escrow manifest", _envelope(copier, name, reference, ref), path)
    except _Missing as exc:
        raise RecordError(f"{ref}: the escrow manifest: {exc}") from None
    try:
        env, escrowed = em.parse(path.read_text(encoding="utf-8", errors="replace"), f"{ref}: the escrow manifest")
    except ValueError as exc:  # not an envelope, not our predicate: what the registry served is refused
        raise RecordError(str(exc)) from None
    bad = [a.detail for a in em.signature_answers(env, target.signing, root) if not a.ok]
    if bad:
        raise RecordError(f"{ref}: the escrow manifest: " + "; ".join(bad))
    if escrowed.target != target.name:
        raise RecordError(f"{ref}: escrows target {escrowed.target!r}, not {target.name!r}")
    return escrowed


def _envelope(copier: BlobCopier, name: str, reference: str, ref: str) -> str:
    """The digest of the escrow manifest's blob, as the escrow index names it (unsigned: anyone's
    bytes until the envelope's signature holds)."""
    try:
        index = _manifest(copier, name, "the escrow index", reference)
    except _Missing:
        raise RecordError(f"{ref}: not served (`build escrow` prints the reference)") from None
    if index.doc.get("artifactType") != em.INDEX_TYPE:
        raise RecordError(f"{ref}: not an escrow index (`build escrow` prints one)")
    found = [m for m in index.doc.get("manifests", []) if m.get("artifactType") == em.MANIFEST_TYPE]
    digests = [m.get("digest") for m in found]
    if len(digests) == 1 and isinstance(digests[0], str):
        layers = _manifest(copier, name, "the escrow manifest", digests[0]).doc.get("layers", [])
        if len(layers) == 1 and isinstance(layers[0].get("digest"), str):
            return layers[0]["digest"]
    raise RecordError(f"{ref}: the escrow index names no single escrow manifest")


def _manifest(copier: BlobCopier, name: str, key: str, reference: str) -> Manifest:
    """The manifest ``reference`` names: missing (named), or refused when its bytes are not its
    digest (or not a JSON object)."""
    got = copier.manifest_bytes(name, reference)
    if got is None:
        raise _Missing(f"manifest {reference[:19]} not served")
    media, raw = got
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    if reference.startswith("sha256:") and digest != reference:
        raise RecordError(
            f"{key}: the escrow served a manifest with digest {digest[:19]}, asked for {reference[:19]}; refused"
        )
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise RecordError(f"{key}: the escrow's manifest {reference[:19]} is not a JSON object; refused")
    return Manifest(media or str(doc.get("mediaType", "")), digest, raw)


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
    layers = _manifest(copier, name, key, entry.artifact).doc.get("layers", [])
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
        got = _manifest(self.copier, self.name, key, digest)
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

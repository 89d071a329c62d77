"""The escrow manifest: an in-toto Statement whose subject is the recorded image and whose
predicate maps every input (by the key builder/escrow/inputs.py gives it) to its escrow digest,
wrapped in a DSSE envelope signed the way the provenance is (builder/records/provsign.py, the
matrix's ``signing`` key; unsigned, and said so, when the matrix names none). It is pushed as an
artifact and written beside the record set as locks/<target>/escrow.json, through the record
set's writer (builder/records/store.py ``write_set``).

Why a file of its own, not a field of image.json or the provenance: image.json's sha256 is named
by the provenance and, for an image index, by the index record (its ``record_sha256``), and the
provenance is signed; naming the escrow there would change the records `build verify` checks
against each other after they were made (and the escrow digest is only known after the push,
which follows the record). escrow.json names the recorded digest instead, so a stale escrow (of
an earlier build) is detected the other way round.

The media types are this tool's (docs/auditor.md lists them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.escrow.inputs import Kind
from builder.records import provsign

ESCROW_NAME = "escrow.json"
PREDICATE_TYPE = "https://github.com/k3-builder/escrow/v1"  # names this predicate's shape (docs/auditor.md)
INDEX_TYPE = "application/vnd.k3-builder.escrow.v1"  # the artifactType of the escrow's index
MANIFEST_TYPE = "application/vnd.k3-builder.escrow.manifest.v1"  # the signed escrow manifest's
DSSE_MEDIA = "application/vnd.dsse.envelope.v1+json"  # in-toto's media type for a DSSE envelope
TITLE = "org.opencontainers.image.title"  # `oras pull` names the file it writes after this
KEY = "dev.k3-builder.escrow.input"  # the input key, on each input's artifact manifest

# REGISTRY/REPO: a host (with a dot, a port or localhost) and a lowercase repository path, no tag.
REPOSITORY = re.compile(
    r"(?:localhost|[A-Za-z0-9.-]+\.[A-Za-z0-9-]+|[A-Za-z0-9.-]+:\d+)(?::\d+)?"
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)+"
)
# What `build escrow` prints (REGISTRY/REPO@sha256:<index>), or its tag (REGISTRY/REPO:<tag>).
REFERENCE = re.compile(
    rf"(?P<name>{REPOSITORY.pattern})(?:@sha256:[0-9a-f]{{64}}|:[A-Za-z0-9_][A-Za-z0-9._-]{{0,127}})"
)

# Kind -> (artifactType of its manifest, mediaType of its one layer).
MEDIA: dict[Kind, tuple[str, str]] = {
    Kind.SOURCE: ("application/vnd.k3-builder.escrow.source.v1", "application/vnd.k3-builder.git-bundle.v1"),
    Kind.WHEEL: ("application/vnd.k3-builder.escrow.wheel.v1", "application/vnd.k3-builder.wheel.v1+zip"),
    Kind.DEB: ("application/vnd.k3-builder.escrow.deb.v1", "application/vnd.debian.binary-package"),
    Kind.PYTHON: ("application/vnd.k3-builder.escrow.python.v1", "application/vnd.k3-builder.python.v1.tar+gzip"),
    Kind.RECIPE: ("application/vnd.k3-builder.escrow.recipe.v1", "application/vnd.k3-builder.recipe.v1"),
}


@dataclass(frozen=True)
class Entry:
    """One input in the escrow: ``digest`` is its bytes' (a blob, or a base image's manifest),
    ``artifact`` the manifest that holds it (a base: its own digest)."""

    kind: Kind
    digest: str
    size: int
    artifact: str
    title: str
    pin: dict[str, str]  # what the record pins it by (url and commit, name and version, ...)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "digest": self.digest,
            "size": self.size,
            "artifact": self.artifact,
            "title": self.title,
            "pin": dict(sorted(self.pin.items())),
        }


@dataclass(frozen=True)
class EscrowManifest:
    target: str
    image: str
    digest: str  # the recorded image's
    escrow: str  # registry/repository holding it
    entries: dict[str, Entry]

    def statement(self) -> str:
        import json

        name = self.image.split("@", 1)[0]
        doc = {
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [{"name": name, "digest": {"sha256": self.digest.removeprefix("sha256:")}}],
            "predicateType": PREDICATE_TYPE,
            "predicate": {
                "target": self.target,
                "escrow": self.escrow,
                "inputs": {k: self.entries[k].to_json() for k in sorted(self.entries)},
            },
        }
        return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def envelope(manifest: EscrowManifest, signing, root: Path) -> str:
    """The DSSE envelope of the manifest, signed with the matrix's key when it names one."""
    return provsign.envelope(manifest.statement(), provsign.signer(signing, root))


def parse(text: str, where: str) -> tuple[Any, EscrowManifest]:
    """(envelope, manifest) of an escrow manifest's text; ValueError naming ``where`` otherwise."""
    try:
        env, statement = provsign.read(text)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    try:
        if statement["predicateType"] != PREDICATE_TYPE:
            raise ValueError(f"predicateType {statement['predicateType']!r} is not {PREDICATE_TYPE}")
        pred, subject = statement["predicate"], statement["subject"][0]
        entries = {
            key: Entry(Kind(e["kind"]), e["digest"], int(e["size"]), e["artifact"], e["title"], dict(e["pin"]))
            for key, e in pred["inputs"].items()
        }
        manifest = EscrowManifest(
            pred["target"], subject["name"], "sha256:" + subject["digest"]["sha256"], pred["escrow"], entries
        )
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: not an escrow manifest ({exc.__class__.__name__}: {str(exc)[:80]})") from None
    return env, manifest


def signature_answers(env, signing, root: Path) -> list[provsign.Answer]:
    """The provenance's three questions (signed, signer, signature), asked of the escrow manifest."""
    key = provsign.public_key(root, signing.public_key) if signing.public_key else None
    return [q(env, key) for q in (provsign.signed, provsign.signer_is, provsign.signature_holds)]

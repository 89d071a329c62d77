"""The record of an image index: ``locks/<target>/image.json`` of ``kind`` ``image-index`` for a
target that names platforms (builder/config/platforms.py), beside its provenance.

Each platform is built, pushed (as ``<tag>-<os>-<arch>``), checked and recorded on its own, its
record set in ``locks/<target>/<os>-<arch>/`` (builder/records/store.py); then one OCI image index
names every platform's manifest by digest and is pushed under the target's tag. This record names
the index digest and, per platform, the manifest digest, the platform record's path and its sha256;
the index provenance is an in-toto Statement whose subjects are the index and every manifest, its
one resolved dependency per platform that platform's provenance (by sha256), signed and attached
to the index like an image's. Nothing in it depends on the time: the same manifests give the same
index, the same record and the same provenance bytes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.config import contract
from builder.config.matrix import Target
from builder.errors import RecordError
from builder.fsutil import sha256_bytes, sha256_file

PROVENANCE_NAME = contract.PROVENANCE_NAME  # locks/<target>/provenance.intoto.json: the index's


@dataclass(frozen=True)
class IndexRecord:
    target: str
    image: str  # registry/repository@sha256:<the index's digest>
    digest: str
    tag: str  # the tag the index is pushed under (the target's)
    # platform -> {"digest": its manifest, "record": "<os>-<arch>/image.json" (under locks/<target>/),
    # "record_sha256": that file's sha256}, in the matrix's order.
    platforms: dict[str, dict[str, str]]
    build: dict[str, Any]  # provenance_sha256: the index provenance this record names

    def to_json(self) -> str:
        doc = {
            "schema": contract.RECORD_SCHEMA,
            "kind": contract.INDEX_KIND,
            "target": self.target,
            "image": self.image,
            "digest": self.digest,
            "tag": self.tag,
            "platforms": self.platforms,
            "build": self.build,
        }
        return json.dumps(doc, indent=2) + "\n"

    def manifests(self) -> dict[str, str]:
        """platform -> manifest digest, as the index names them."""
        return {p: entry["digest"] for p, entry in self.platforms.items()}


def kind_of(path: Path) -> str | None:
    """``image-index`` for an index record, "image" for any other readable JSON object, None when
    there is no file (a damaged file is the readers' to refuse)."""
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return "image"
    return contract.INDEX_KIND if isinstance(doc, dict) and doc.get("kind") == contract.INDEX_KIND else "image"


def read(path: Path) -> IndexRecord | None:
    """The committed index record, None when there is none; RecordError when it is damaged."""
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise RecordError(f"{path}: corrupt index record ({exc.__class__.__name__}); restore it from git") from None
    if not isinstance(doc, dict) or doc.get("kind") != contract.INDEX_KIND or doc.get("schema") != 2:
        raise RecordError(f"{path}: not a schema-2 record of kind {contract.INDEX_KIND}; restore it from git")
    fields = {"target": str, "image": str, "digest": str, "tag": str, "platforms": dict, "build": dict}
    wrong = [k for k, kind in fields.items() if not isinstance(doc.get(k), kind)]
    entries: dict = doc["platforms"] if isinstance(doc.get("platforms"), dict) else {}
    keys = ("digest", "record", "record_sha256")
    if any(not isinstance(e, dict) or not all(isinstance(e.get(k), str) for k in keys) for e in entries.values()):
        wrong.append("platforms")
    if wrong:
        raise RecordError(f"{path}: index record fields missing or of the wrong type: {', '.join(wrong)}")
    return IndexRecord(**{k: doc[k] for k in fields})


def platform_entry(root: Path, target: str, platform: str, digest: str) -> dict[str, str]:
    """The index record's entry of one platform, from its record set on disk."""
    path = contract.platform_record_dir(root, target, platform) / contract.RECORD_NAME
    return {
        "digest": digest,
        "record": path.relative_to(root / contract.LOCKS_DIR / target).as_posix(),
        "record_sha256": sha256_file(path),
    }


def statement(target: Target, root: Path, record: IndexRecord) -> str:
    """The index provenance: an in-toto Statement v1 (SLSA provenance v1) whose subjects are the
    index, then each platform's manifest; each platform's provenance is a resolved dependency."""
    from builder.records import slsa

    name = record.image.split("@")[0]
    subjects = [{"name": name, "digest": {"sha256": record.digest.removeprefix("sha256:")}}]
    subjects += [
        {"name": f"{name}#{p}", "digest": {"sha256": d.removeprefix("sha256:")}} for p, d in record.manifests().items()
    ]
    deps = []
    for p in record.platforms:
        prov = contract.platform_record_dir(root, target.name, p) / contract.PROVENANCE_NAME
        deps.append({"name": f"provenance:{p}", "digest": {"sha256": sha256_file(prov)}})
    doc = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": subjects,
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": slsa.build_type(target, os.environ),
                "externalParameters": {"target": target.name, "platforms": list(record.platforms), "tag": record.tag},
                "resolvedDependencies": deps,
            },
            "runDetails": {"builder": {"id": slsa.builder_id(target, os.environ)}},
        },
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def provenance_sha256(text: str) -> str:
    return sha256_bytes(text.encode())


def set_problems(root: Path, record: IndexRecord) -> list[str]:
    """What does not hold between the index record and the files it names (offline): its
    provenance (sha256), each platform's record (present, its sha256, its digest the index's)."""
    from builder.records import store

    base = root / contract.LOCKS_DIR / record.target
    problems = []
    prov = base / PROVENANCE_NAME
    got = sha256_file(prov) if prov.is_file() else None
    if got != record.build.get("provenance_sha256"):
        problems.append(f"{PROVENANCE_NAME} {'is missing' if got is None else 'differs from what image.json names'}")
    for p, entry in record.platforms.items():
        path = base / entry["record"]
        if not path.is_file():
            problems.append(f"{p}: {entry['record']} is missing")
            continue
        if sha256_file(path) != entry["record_sha256"]:
            problems.append(f"{p}: {entry['record']} differs from what the index record names (sha256)")
        try:
            one = store.read(path)
        except RecordError as exc:
            problems.append(f"{p}: {exc.message}")
            continue
        if one is not None and one.digest != entry["digest"]:
            problems.append(f"{p}: {entry['record']} names {one.digest}, the index names {entry['digest']}")
    return problems


def _statement(root: Path, record: IndexRecord) -> dict[str, Any]:
    """The Statement the index provenance (locks/<target>/provenance.intoto.json) carries; {} when unreadable."""
    import base64
    import binascii

    try:
        env = json.loads((root / contract.LOCKS_DIR / record.target / PROVENANCE_NAME).read_text())
        doc = json.loads(base64.b64decode(env["payload"], validate=True))
    except (OSError, ValueError, KeyError, TypeError, binascii.Error):
        return {}
    return doc if isinstance(doc, dict) else {}


def provenance_deps(root: Path, record: IndexRecord) -> dict[str, str]:
    """platform -> the sha256 of that platform's provenance, as the index provenance names it."""
    try:
        deps = _statement(root, record)["predicate"]["buildDefinition"]["resolvedDependencies"]
        return {d["name"].removeprefix("provenance:"): d["digest"]["sha256"] for d in deps}
    except (KeyError, TypeError, AttributeError):
        return {}


def provenance_disagrees(root: Path, record: IndexRecord) -> list[str]:
    """The index record's fields that its (signed) provenance contradicts: the index digest and
    image, the tag, the platform list, each platform's manifest digest. An edit of any of them in
    image.json is found here, offline."""
    doc = _statement(root, record)
    try:
        subjects = [(s["name"], "sha256:" + s["digest"]["sha256"]) for s in doc["subject"]]
        params = doc["predicate"]["buildDefinition"]["externalParameters"]
    except (KeyError, TypeError):
        return [f"{PROVENANCE_NAME}: no index Statement in it"]
    name = record.image.split("@")[0]
    expect = [(name, record.digest)] + [(f"{name}#{p}", d) for p, d in record.manifests().items()]
    problems = []
    if record.image != f"{name}@{record.digest}" or subjects[:1] != expect[:1]:
        problems.append(f"image/digest {record.image} is not the index its provenance describes")
    if params.get("platforms") != list(record.platforms) or subjects[1:] != expect[1:]:
        problems.append("the platforms and their manifest digests are not the ones its provenance names")
    if params.get("tag") != record.tag:
        problems.append(f"tag {record.tag!r} is not the one its provenance names")
    return problems

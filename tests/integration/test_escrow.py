"""`build escrow` on the built smoke (the session's `built` image, a copy of its checkout so its
record set is left alone): every input into a repository of this file's own on the local
registry, `build verify --registry`'s escrow row, a deleted blob named, a second escrow run that
pushes nothing. A few seconds on top of the build: the bases are mounted, not uploaded."""

from __future__ import annotations

import json
import secrets
import time

import pytest

from builder.engine.blobcopy import BlobCopier
from builder.engine.registry import RegistryClient
from tests.integration.conftest import REGISTRY, cli, restore_registry


@pytest.fixture()
def escrow_repo(built):
    smoke = built[0]
    name = f"{REGISTRY}/{smoke.repository}-escrow-{secrets.token_hex(3)}"
    yield name
    client, copier = RegistryClient(), BlobCopier(RegistryClient())
    tags_index = [client.raw_manifest(name, "escrow-" + json.loads(smoke.record.read_text())["digest"][7:])]
    for index in [i for i in tags_index if i is not None]:  # delete only what this test pushed
        for child in index.doc["manifests"]:
            got = client.raw_manifest(name, child["digest"])
            if got is not None and "layers" in got.doc and "artifactType" in got.doc:
                for layer in got.doc["layers"]:
                    copier.delete_blob(name, layer["digest"])
            client.delete_manifest(name, child["digest"])
        client.delete_manifest(name, index.digest)


def test_escrow_verify_and_a_deleted_blob(built, escrow_repo, tmp_path):
    smoke = built[0].copy(tmp_path / "checkout")
    restore_registry(built[0])
    started = time.monotonic()
    first = cli("--matrix", str(smoke.matrix), "escrow", "--target", "smoke", "--to", escrow_repo, "--json")
    took = time.monotonic() - started
    assert first.code == 0, first.err[-3000:]
    doc = json.loads(first.out)
    print(f"escrow of the smoke: {took:.1f} s, {doc['inputs']} inputs, bytes {doc['bytes']}")
    kinds = {row["kind"]: row for row in doc["bytes"]}
    assert {"source", "wheel", "base", "recipe"} <= set(kinds)
    assert kinds["base"]["pushed"] == 0 and kinds["base"]["mounted"] > 0  # same registry: mounted
    ok = cli("--matrix", str(smoke.matrix), "verify", "--registry", "--target", "smoke")
    assert ok.code == 0, ok.err[-3000:]
    assert "registry: escrow" in ok.err and f"{doc['inputs']} inputs, each served" in ok.err
    # Idempotent: the second run pushes nothing.
    again = json.loads(
        cli("--matrix", str(smoke.matrix), "escrow", "--target", "smoke", "--to", escrow_repo, "--json").out
    )
    assert all(row["pushed"] == 0 and row["mounted"] == 0 for row in again["bytes"]), again["bytes"]
    # A deleted blob fails verify, naming the input.
    envelope = json.loads((smoke.root / "locks" / "smoke" / "escrow.json").read_text())
    import base64

    entries = json.loads(base64.b64decode(envelope["payload"]))["predicate"]["inputs"]
    key = next(k for k in sorted(entries) if k.startswith("wheel "))
    assert BlobCopier(RegistryClient()).delete_blob(escrow_repo, entries[key]["digest"])
    bad = cli("--matrix", str(smoke.matrix), "verify", "--registry", "--target", "smoke")
    assert bad.code == 1 and key in bad.err, bad.err[-3000:]

"""`build reproduce --from-escrow`'s download refuses what the escrow registry serves when it is not
what was escrowed: an escrow manifest edited after it was signed, or one that is not a DSSE
envelope at all (exit 2, nothing written). Against the real local registry,
with tests/unit/test_escrow.py's fixture (a repository of this run's own, deleted at the end)."""

from __future__ import annotations

import base64
import json

import pytest

from builder.cli import main
from builder.engine.registry import OCI_INDEX, OCI_MANIFEST
from builder.escrow import manifest as em
from builder.escrow.push import _artifact, _canonical
from builder.escrow.run import escrow_target
from tests.unit.test_escrow import escrowed, pytestmark, smoke_repos  # noqa: F401


def _serve_envelope(made, dest: str, text: bytes) -> str:
    """An escrow index naming one escrow manifest whose bytes are ``text``; its digest (every part
    recorded in ``made``, so the fixture deletes it)."""
    blob = made.copier.push_bytes(dest, text)
    made.blobs.append((dest, blob))
    art = _artifact(em.MANIFEST_TYPE, em.DSSE_MEDIA, blob.removeprefix("sha256:"), len(text), em.ESCROW_NAME, "")
    art_digest = made.copier.push_manifest(dest, art, OCI_MANIFEST)
    index = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "artifactType": em.INDEX_TYPE,
        "manifests": [
            {"mediaType": OCI_MANIFEST, "digest": art_digest, "size": len(art), "artifactType": em.MANIFEST_TYPE}
        ],
    }
    index_digest = made.copier.push_manifest(dest, _canonical(index), OCI_INDEX)
    made.manifests[:0] = [(dest, index_digest), (dest, art_digest)]
    return index_digest


def _edited(envelope: str) -> bytes:
    doc = json.loads(envelope)
    statement = json.loads(base64.b64decode(doc["payload"]))
    first = sorted(statement["predicate"]["inputs"])[0]
    statement["predicate"]["inputs"][first]["size"] += 1
    doc["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (_edited, "does not verify over this payload"),
        (lambda env: b'{"not": "an envelope"}', "not a DSSE envelope"),
    ],
    ids=["edited-after-signing", "not-an-envelope"],
)
def test_an_escrow_manifest_that_does_not_hold_is_exit_2_and_nothing_written(escrowed, capsys, text, says):  # noqa: F811
    loaded, dest, made = escrowed
    pushed = escrow_target(loaded, "smoke", dest)
    index = _serve_envelope(made, dest, text(pushed.envelope))
    with pytest.raises(SystemExit) as info:
        main(["--matrix", str(loaded.path), "reproduce", "--target", "smoke", "--from-escrow", f"{dest}@{index}"])
    assert info.value.code == 2
    assert says in capsys.readouterr().err
    assert not (loaded.path.parent / "artifacts" / "smoke" / "escrow").exists()

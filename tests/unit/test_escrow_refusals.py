"""`build reproduce --from-escrow`'s download refuses what the escrow registry serves when it is not
what was escrowed: an escrow manifest edited after it was signed, or one that is not a DSSE
envelope at all (exit 2, nothing written); and a blob stream cut short is fetched again, as every
other registry read is (builder/engine/transport.py's Retrier). Against the real local registry,
with tests/unit/test_escrow.py's fixture (a repository of this run's own, deleted at the end)."""

from __future__ import annotations

import base64
import dataclasses
import http.server
import json
import threading
import urllib.error
import urllib.request

import pytest

from builder.cli import main
from builder.engine.registry import OCI_INDEX, OCI_MANIFEST
from builder.errors import RecordError
from builder.escrow import manifest as em
from builder.escrow.check import escrow_row
from builder.escrow.fetch import download
from builder.escrow.push import _artifact, _canonical
from builder.escrow.run import escrow_target
from tests.unit.test_escrow import LOCAL, escrowed, pytestmark, smoke_repos  # noqa: F401


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


class _CutOnce(http.server.BaseHTTPRequestHandler):
    """A front on the real registry that cuts the first GET of one blob short (a CDN dropping the
    connection mid-stream), then passes everything through."""

    blob = ""
    cut: list[bool] = []

    def _forward(self, method: str) -> None:
        if method == "GET" and self.path.endswith(f"/blobs/{self.blob}") and not self.cut:
            self.cut.append(True)
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"partial")
            return
        req = urllib.request.Request(f"http://{LOCAL}{self.path}", method=method, headers=dict(self.headers))
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                status, headers, body = resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as exc:
            status, headers, body = exc.code, exc.headers, exc.read()
        self.send_response(status)
        for key in ("Content-Type", "Docker-Content-Digest", "Content-Length"):
            if headers.get(key):
                self.send_header(key, headers[key])
        self.end_headers()
        if method == "GET":
            self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._forward("GET")

    def do_HEAD(self) -> None:  # noqa: N802
        self._forward("HEAD")

    def log_message(self, *args) -> None:
        pass


def test_a_blob_stream_cut_short_is_fetched_again(escrowed, tmp_path):  # noqa: F811
    loaded, dest, made = escrowed
    pushed = escrow_target(loaded, "smoke", dest)
    key = next(k for k in sorted(pushed.manifest.entries) if k.startswith("wheel "))
    handler = type("CutOnce", (_CutOnce,), {"blob": pushed.manifest.entries[key].digest, "cut": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        front = f"127.0.0.1:{server.server_address[1]}/{dest.split('/', 1)[1]}"
        got = download(f"{front}@{pushed.index}", loaded.target("smoke"), loaded.path.parent, tmp_path / "escrow")
        assert handler.cut == [True] and got.digest == pushed.manifest.digest
        entry = pushed.manifest.entries[key]
        assert (tmp_path / "escrow" / entry.kind.value / entry.title).stat().st_size == entry.size
    finally:
        server.shutdown()
        server.server_close()


class _OtherManifest(_CutOnce):
    """A front that serves other bytes for one manifest (its storage changed behind its back)."""

    manifest = ""

    def _forward(self, method: str) -> None:
        if self.path.endswith(f"/manifests/{self.manifest}"):
            body = json.dumps({"schemaVersion": 2, "layers": [], "note": "not the escrowed one"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", OCI_MANIFEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if method == "GET":
                self.wfile.write(body)
            return
        super()._forward(method)


@pytest.mark.parametrize("which", ["base", "wheel", "escrow manifest"])
def test_a_manifest_that_is_not_its_digest_is_refused_with_exit_2(escrowed, tmp_path, which):  # noqa: F811
    """A base's manifest, an input's artifact manifest or the escrow manifest's own, served with
    other bytes: refused (RecordError, exit 2: the escrow's fault, not an unreachable registry)."""
    loaded, dest, made = escrowed
    pushed = escrow_target(loaded, "smoke", dest)
    if which == "escrow manifest":
        index = made.client.raw_manifest(dest, pushed.index)
        digest = next(m["digest"] for m in index.doc["manifests"] if m.get("artifactType") == em.MANIFEST_TYPE)
    else:
        key = next(k for k in sorted(pushed.manifest.entries) if k.startswith(which + " "))
        digest = pushed.manifest.entries[key].artifact
    handler = type("Other", (_OtherManifest,), {"manifest": digest, "cut": [True]})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        front = f"127.0.0.1:{server.server_address[1]}/{dest.split('/', 1)[1]}"
        with pytest.raises(RecordError, match="the escrow served a manifest with digest"):
            download(f"{front}@{pushed.index}", loaded.target("smoke"), loaded.path.parent, tmp_path / "escrow")
        assert not (tmp_path / "escrow").exists() and list(tmp_path.glob(".escrow.*")) == []
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("change", ["an input dropped", "another build's digest"])
def test_verify_row_fails_on_a_signed_escrow_manifest_that_does_not_cover_the_record(escrowed, change):  # noqa: F811
    """Signed with the matrix's own key, so only the row's coverage rules can catch it: an escrow
    manifest lacking one input the record names (named), or escrowing another build's digest."""
    loaded, dest, made = escrowed
    root, target = loaded.path.parent, loaded.target("smoke")
    pushed = escrow_target(loaded, "smoke", dest)
    entries = dict(pushed.manifest.entries)
    if change == "an input dropped":
        dropped = next(k for k in sorted(entries) if k.startswith("deb ") or k.startswith("wheel "))
        del entries[dropped]
        edited, says = (
            dataclasses.replace(pushed.manifest, entries=entries),
            f"lacks 1 input(s) the record names: {dropped}",
        )
    else:
        edited, says = dataclasses.replace(pushed.manifest, digest="sha256:" + "1" * 64), "escrows sha256:111111111111"
    (root / "locks" / "smoke" / em.ESCROW_NAME).write_text(em.envelope(edited, target.signing, root))
    row = escrow_row(root, target)
    assert not row.ok and says in row.detail, row.detail


@pytest.mark.parametrize("which", ["Dockerfile", "requirements.txt"])
def test_a_recipe_file_changed_since_the_build_is_refused_before_anything_is_pushed(escrowed, which):  # noqa: F811
    """The escrow keeps the recipe the build read (its sha256 in image.json), not whatever the
    checkout holds now: a relocked or edited file is refused (exit 2), naming it, before a push."""
    loaded, dest, made = escrowed
    root = loaded.path.parent
    path = next(p for p in sorted(root.rglob(which)) if "artifacts" not in p.parts)
    path.write_text(path.read_text() + "\n# edited after the build\n")
    with pytest.raises(RecordError, match=f"{which}: sha256 .* is not the recorded"):
        escrow_target(loaded, "smoke", dest)
    assert not (root / "locks" / "smoke" / em.ESCROW_NAME).exists()
    assert made.client.raw_manifest(dest, "escrow-" + made.recorded.removeprefix("sha256:")) is None

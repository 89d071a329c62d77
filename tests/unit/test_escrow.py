"""`build escrow` (builder/escrow/) against the real registry on 127.0.0.1:5000: the smoke target
naming linux/amd64 and linux/arm64, built with the fake engine (as tests/unit/test_multiplatform.py
builds it), its bases a two-platform image pushed here first, escrowed into a repository of this
run's own (deleted at the end: only what this test made). Real: the smoke's git repositories and
their bundles, the locks and the wheel cache of test_pipeline_ordering.py, the DSSE signature.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import hashlib
import http.server
import json
import shutil
import subprocess
import threading
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from builder.cli import main
from builder.config import matrix
from builder.config.options import BuildOptions
from builder.engine.blobcopy import BlobCopier
from builder.engine.registry import OCI_INDEX, OCI_MANIFEST, RegistryClient
from builder.errors import RecordError
from builder.escrow import inputs, offline
from builder.escrow import manifest as em
from builder.escrow.check import escrow_row
from builder.escrow.fetch import download
from builder.escrow.inputs import Kind
from builder.escrow.run import escrow_target
from builder.pipeline import build as pipeline
from builder.pipeline.plan import Plan
from builder.records import provsign
from builder.smoke import smoke, smokearm64
from tests.unit.fakeengine import FakeEngine
from tests.unit.test_multiplatform import PLATFORMS, _lock_all
from tests.unit.test_pipeline_ordering import REGISTRY, Checks, smoke_repos  # noqa: F401

LOCAL = "127.0.0.1:5000"


def _registry_up() -> bool:
    try:
        with urllib.request.urlopen(f"http://{LOCAL}/v2/", timeout=3) as resp:
            return resp.status == 200
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _registry_up(), reason=f"no registry on {LOCAL} (ci/setup.sh starts one)")


class Made:
    """What this test pushed, so it deletes only that."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.client = RegistryClient()
        self.copier = BlobCopier(self.client)
        self.manifests: list[tuple[str, str]] = []
        self.blobs: list[tuple[str, str]] = []
        self.recorded = ""  # the recorded digest: the escrow's tag is escrow-<its hex>
        self.recorded_more: list[str] = []  # later builds escrowed into the same repository
        self.engine: FakeEngine | None = None  # the engine the recorded build ran on

    def image(self, name: str, arch: str) -> tuple[str, int]:
        config = json.dumps({"architecture": arch, "os": "linux", "rootfs": {"type": "layers"}}).encode()
        layer = f"base layer for {arch} {self.prefix}".encode()
        for blob in (config, layer):
            self.blobs.append((name, self.copier.push_bytes(name, blob)))
        doc = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": _d(config),
                "size": len(config),
            },
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": _d(layer), "size": len(layer)}
            ],
        }
        raw = json.dumps(doc).encode()
        self.manifests.append((name, self.copier.push_manifest(name, raw, OCI_MANIFEST)))
        return self.manifests[-1][1], len(raw)

    def index(self, name: str, images: dict[str, tuple[str, int]]) -> str:
        """The multi-platform index of ``images`` (arch -> (digest, size)), pushed by digest."""
        entries = [
            {"mediaType": OCI_MANIFEST, "digest": d, "size": n, "platform": {"os": "linux", "architecture": arch}}
            for arch, (d, n) in images.items()
        ]
        raw = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()
        self.manifests.insert(0, (name, self.copier.push_manifest(name, raw, OCI_INDEX)))  # deleted first
        return self.manifests[0][1]

    def delete(self) -> None:
        for name, digest in self.manifests:
            self.client.delete_manifest(name, digest)
        for name, digest in self.blobs:
            self.copier.delete_blob(name, digest)


def _d(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture()
def escrowed(tmp_path, monkeypatch, smoke_repos):  # noqa: F811
    """A two-platform smoke build whose bases are served here, and a repository to escrow into."""
    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path / "cache"))
    prefix = f"k3-escrow-test-{uuid.uuid4().hex[:12]}"
    made = Made(prefix)
    base = f"{LOCAL}/{prefix}/base"
    amd, arm = made.image(base, "amd64"), made.image(base, "arm64")
    index = made.index(base, {"amd64": amd, "arm64": arm})
    bases = {
        "linux/amd64": {"devel": f"{base}:t@{amd[0]}", "runtime": f"{base}:t@{amd[0]}"},
        "linux/arm64": {"devel": f"{base}:t@{arm[0]}", "runtime": f"{base}:t@{arm[0]}"},
        "index": {"devel": index, "runtime": index},
    }
    root = tmp_path / "checkout"
    root.mkdir()
    key, pub = provsign.generate_test_key(tmp_path / "signing")
    text = smoke.matrix_text(
        REGISTRY,
        bases["linux/amd64"],
        smoke_repos,
        dt.date.today() + dt.timedelta(days=180),
        signing={"key": str(key), "public_key": str(pub)},
    )
    (root / "matrix.yaml").write_text(smokearm64.with_platforms(text, bases))
    loaded = matrix.load(root / "matrix.yaml")
    pipeline.render_all(loaded, ["smoke"], check=False)
    plan = Plan.of(loaded, "smoke")
    _lock_all(plan)
    Checks(monkeypatch)
    made.engine = FakeEngine()
    made.recorded = pipeline.build(plan, made.engine, BuildOptions()).digest
    dest = f"{LOCAL}/{prefix}/escrow"
    yield loaded, dest, made
    _cleanup(made, dest)


def _cleanup(made: Made, dest: str) -> None:
    """Delete what the escrow made in this run's repository (every manifest its tag's index names,
    their blobs, the index), then the bases this test pushed."""
    client, copier = made.client, made.copier
    for tag in ("escrow-" + d for d in _escrow_tags(made)):
        index = client.raw_manifest(dest, tag)
        if index is None:
            continue
        for child in index.doc["manifests"]:
            _delete_tree(client, copier, dest, child["digest"])
        client.delete_manifest(dest, index.digest)
    made.delete()


def _escrow_tags(made: Made) -> list[str]:
    return [d.removeprefix("sha256:") for d in [made.recorded, *made.recorded_more] if d]


def _delete_tree(client: RegistryClient, copier: BlobCopier, dest: str, digest: str) -> None:
    got = client.raw_manifest(dest, digest)
    if got is None:
        return
    for child in got.doc.get("manifests", []):
        _delete_tree(client, copier, dest, child["digest"])
    for desc in [got.doc["config"], *got.doc.get("layers", [])] if "config" in got.doc else []:
        copier.delete_blob(dest, desc["digest"])
    client.delete_manifest(dest, digest)


def _served(client: RegistryClient, copier: BlobCopier, dest: str, entry: em.Entry) -> bool:
    if entry.kind is Kind.BASE:
        return copier.has_manifest(dest, entry.digest)
    return copier.has_blob(dest, entry.digest) and copier.has_manifest(dest, entry.artifact)


def test_every_input_is_escrowed_signed_and_a_second_run_pushes_nothing(escrowed):
    loaded, dest, made = escrowed
    root = loaded.path.parent
    first = escrow_target(loaded, "smoke", dest)
    inv = inputs.inventory(root, loaded.target("smoke"))
    kinds = {i.kind for i in inv.inputs}
    assert kinds == {Kind.SOURCE, Kind.WHEEL, Kind.BASE, Kind.RECIPE}
    # The source, the third-party tree and its submodule; both platforms' bases.
    assert {i.name for i in inv.inputs if isinstance(i, inputs.SourceInput)} == {
        "source",
        "third_party/k3kernels",
        "third_party/k3kernels/third-party/k3math",
    }
    assert {i.key for i in inv.inputs if i.kind is Kind.BASE} == {
        f"base {r} {p}" for r in ("build", "runtime") for p in (*PLATFORMS, "index")
    }
    assert set(first.manifest.entries) == {i.key for i in inv.inputs}
    for key, entry in first.manifest.entries.items():
        assert _served(made.client, made.copier, dest, entry), key
    pushed = {r["kind"]: r for r in first.tally.rows()}
    assert pushed["source"]["pushed"] > 0 and pushed["wheel"]["pushed"] > 0
    # The bases sit on the escrow's registry: mounted across repositories, not uploaded.
    assert (pushed["base"]["pushed"], pushed["base"]["mounted"]) == (0, _base_bytes(made))
    # Signed like the provenance, verified offline against the matrix's public key.
    text = (root / "locks" / "smoke" / em.ESCROW_NAME).read_text()
    assert text == first.envelope
    env, parsed = em.parse(text, "escrow.json")
    target = loaded.target("smoke")
    assert [a.ok for a in em.signature_answers(env, target.signing, root)] == [True, True, True]
    assert parsed.digest == inv.digest and parsed.entries == first.manifest.entries
    # The tag names the index, and the index names the signed manifest and every artifact.
    assert made.client.resolve_digest(f"{dest}:{first.tag}") == first.index
    listed = {m["digest"] for m in made.client.raw_manifest(dest, first.index).doc["manifests"]}
    assert {e.artifact for e in first.manifest.entries.values()} <= listed
    # Idempotent: nothing pushed again, everything counted as already there, the same index.
    second = escrow_target(loaded, "smoke", dest)
    assert all(r["pushed"] == 0 and r["mounted"] == 0 for r in second.tally.rows()), second.tally.rows()
    again = {r["kind"]: r["already"] for r in second.tally.rows()}
    assert again == {k: r["pushed"] + r["mounted"] + r["already"] for k, r in pushed.items()}
    assert second.index == first.index


def _base_bytes(made: Made) -> int:
    """The bases' config and layer bytes this test pushed (both platforms' images, once each)."""
    total = 0
    for name, digest in made.manifests:
        doc = made.client.raw_manifest(name, digest).doc
        if "config" in doc:  # an image (the index adds none of its own)
            total += doc["config"]["size"] + sum(layer["size"] for layer in doc["layers"])
    return total


def test_each_source_bundle_clones_alone_to_its_pinned_commit(escrowed, tmp_path):
    """Every bundle (the source, the third-party tree, its submodule) is whole: it clones with no
    other repository (a bundle of a shallow mirror would need prerequisites) to the pinned commit."""
    loaded, dest, made = escrowed
    pushed = escrow_target(loaded, "smoke", dest)
    sources = {k: e for k, e in pushed.manifest.entries.items() if e.kind is Kind.SOURCE}
    assert len(sources) == 3
    for i, (key, entry) in enumerate(sorted(sources.items())):
        bundle = tmp_path / f"{i}.bundle"
        made.client.blob_to(dest, entry.digest, bundle)
        clone = tmp_path / f"clone{i}"
        subprocess.run(["git", "clone", "--quiet", "--bare", str(bundle), str(clone)], check=True)
        head = subprocess.run(
            ["git", "-C", str(clone), "rev-parse", "refs/heads/pinned"], capture_output=True, text=True
        )
        assert head.stdout.strip() == entry.pin["commit"], key
        fsck = subprocess.run(["git", "-C", str(clone), "fsck", "--no-dangling"], capture_output=True, text=True)
        assert fsck.returncode == 0, (key, fsck.stderr)


def test_a_bad_to_is_refused_with_exit_2_and_nothing_written(escrowed, capsys):
    loaded, dest, made = escrowed
    with pytest.raises(SystemExit) as info:
        main(["--matrix", str(loaded.path), "escrow", "--target", "smoke", "--to", "not a repo"])
    assert info.value.code == 2
    assert "--to" in capsys.readouterr().err
    assert not (loaded.path.parent / "locks" / "smoke" / em.ESCROW_NAME).exists()


def test_verify_row_holds_then_names_the_input_whose_blob_was_deleted(escrowed):
    loaded, dest, made = escrowed
    root, target = loaded.path.parent, loaded.target("smoke")
    assert escrow_row(root, target).ok is True
    pushed = escrow_target(loaded, "smoke", dest)
    row = escrow_row(root, target)
    assert row.ok, row.detail
    assert f"{len(pushed.manifest.entries)} inputs" in row.detail
    key = next(k for k in sorted(pushed.manifest.entries) if k.startswith("wheel "))
    digest = pushed.manifest.entries[key].digest
    assert made.copier.delete_blob(dest, digest)
    # Every input that blob held is named (the same wheel in both platforms' locks: one blob).
    sharing = [k for k, e in sorted(pushed.manifest.entries.items()) if e.digest == digest]
    row = escrow_row(root, target)
    assert not row.ok and f"does not serve {len(sharing)} escrowed input(s): {', '.join(sharing)}" in row.detail


def test_verify_row_fails_on_an_edited_escrow_manifest(escrowed):
    loaded, dest, made = escrowed
    root, target = loaded.path.parent, loaded.target("smoke")
    escrow_target(loaded, "smoke", dest)
    path = root / "locks" / "smoke" / em.ESCROW_NAME
    doc = json.loads(path.read_text())
    statement = json.loads(base64.b64decode(doc["payload"]))
    first = sorted(statement["predicate"]["inputs"])[0]
    statement["predicate"]["inputs"][first]["digest"] = "sha256:" + "0" * 64
    doc["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    path.write_text(json.dumps(doc))
    row = escrow_row(root, target)
    assert not row.ok and "does not verify over this payload" in row.detail


def test_reproduce_from_escrow_rebuilds_from_the_download_alone(escrowed, capsys, monkeypatch, tmp_path):
    """Every input downloaded with its digest checked, then the normal reproduce on it: the machine's
    cache emptied (and left unread), no source fetched, the bases pulled by digest from the escrow,
    the same digests on both platforms."""
    loaded, dest, made = escrowed
    pushed = escrow_target(loaded, "smoke", dest)
    ref = f"{pushed.repository}@{pushed.index}"
    machine_cache = tmp_path / "cache"  # the fixture's K3_CACHE_DIR: every wheel and mirror of the build
    shutil.rmtree(machine_cache)
    monkeypatch.setattr("builder.source.pinned.fetch", _no_fetch)
    monkeypatch.setattr("builder.commands.reproduce.docker_engine", lambda: made.engine)
    built = len(made.engine.requests)
    with pytest.raises(SystemExit) as info:
        main(["--matrix", str(loaded.path), "reproduce", "--target", "smoke", "--from-escrow", ref, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert info.value.code == 0, doc
    assert [(p["reproduced"], p["rebuilt"] == p["recorded"]) for p in doc["platforms"]] == [(True, True)] * 2
    assert not any(machine_cache.rglob("*.whl")) and not (machine_cache / "git").exists()
    for req, platform in zip(made.engine.requests[built:], PLATFORMS, strict=True):
        bases = loaded.target("smoke").for_platform(platform).bases
        assert req.build_args["BUILD_BASE_IMAGE"] == f"{dest}@{bases.build.digest}"
        assert req.build_args["RUNTIME_BASE_IMAGE"] == f"{dest}@{bases.runtime.digest}"
        assert any((req.context / "wheelhouse").rglob("*.whl"))
        assert (Path(req.build_contexts["source"]) / "pyproject.toml").is_file()
    out = Path(doc["downloaded"])
    assert (out / em.ESCROW_NAME).read_text() == pushed.envelope
    for key, entry in pushed.manifest.entries.items():
        if entry.kind is Kind.BASE:
            blob = out / "bases" / "blobs" / "sha256" / entry.digest.removeprefix("sha256:")
        else:
            blob = out / entry.kind.value / entry.title
        assert "sha256:" + hashlib.sha256(blob.read_bytes()).hexdigest() == entry.digest, key
    refs = json.loads((out / "bases" / "index.json").read_text())["manifests"]
    assert len(refs) == 6  # build and runtime: both platforms' manifests and the tag's index
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".cache.")]  # the run's own cache: removed


def _no_fetch(*args, **kwargs):
    raise AssertionError("a rebuild from the escrow fetched the source from its host")


def test_an_escrow_of_another_build_is_refused_before_anything_is_built(escrowed, tmp_path):
    loaded, dest, made = escrowed
    pushed = escrow_target(loaded, "smoke", dest)
    root, target = loaded.path.parent, loaded.target("smoke")
    other = dataclasses.replace(pushed.manifest, digest="sha256:" + "1" * 64)
    with pytest.raises(RecordError, match="escrows sha256:1111"):
        offline.inputs(f"{dest}@{pushed.index}", tmp_path / "x", other, target, root, tmp_path / "c")
    key = next(k for k in sorted(pushed.manifest.entries) if k.startswith("wheel "))
    entries = dict(pushed.manifest.entries)
    entries[key] = dataclasses.replace(entries[key], digest="sha256:" + "2" * 64)
    wrong = dataclasses.replace(pushed.manifest, entries=entries)
    with pytest.raises(RecordError, match=f"{key}: the escrow holds sha256:2222"):
        offline.inputs(f"{dest}@{pushed.index}", tmp_path / "x", wrong, target, root, tmp_path / "c")
    del entries[key]
    lacking = dataclasses.replace(pushed.manifest, entries=entries)
    with pytest.raises(RecordError, match=f"lacks 1 input.*{key}"):
        offline.inputs(f"{dest}@{pushed.index}", tmp_path / "x", lacking, target, root, tmp_path / "c")


def test_reproduce_from_escrow_names_a_missing_input_and_writes_nothing(escrowed, capsys):
    loaded, dest, made = escrowed
    pushed = escrow_target(loaded, "smoke", dest)
    key = next(k for k in sorted(pushed.manifest.entries) if k.startswith("source "))
    assert made.copier.delete_blob(dest, pushed.manifest.entries[key].digest)
    with pytest.raises(SystemExit) as info:
        main(["--matrix", str(loaded.path), "reproduce", "--target", "smoke", "--from-escrow", f"{dest}:{pushed.tag}"])
    assert info.value.code == 2
    assert key in capsys.readouterr().err
    assert not (loaded.path.parent / "artifacts" / "smoke" / "escrow").exists()


def test_an_escrow_of_another_build_is_refused_before_its_inputs_are_downloaded(escrowed, capsys):
    """The checkout records another build than the escrow's: refused from the signed manifest, exit 2,
    no input downloaded and nothing written (not a download of every input, then the refusal)."""
    loaded, dest, made = escrowed
    pushed = escrow_target(loaded, "smoke", dest)
    record = loaded.path.parent / "locks" / "smoke" / "image.json"
    doc = json.loads(record.read_text())
    record.write_text(json.dumps({**doc, "digest": "sha256:" + "3" * 64}))
    with pytest.raises(SystemExit) as info:
        main(["--matrix", str(loaded.path), "reproduce", "--target", "smoke", "--from-escrow", f"{dest}:{pushed.tag}"])
    assert info.value.code == 2
    assert "the record set names sha256:3333" in capsys.readouterr().err
    assert not (loaded.path.parent / "artifacts" / "smoke" / "escrow").exists()


def test_a_target_with_build_stage_apt_packages_is_told_they_are_fetched(escrowed, capsys):
    """cu129's compile.apt_packages are not locked, so not escrowed: the rebuild says it still fetches them."""
    loaded, dest, made = escrowed
    pushed = escrow_target(loaded, "smoke", dest)
    target = loaded.target("smoke")
    offline.held(f"{dest}@{pushed.index}", pushed.manifest, target, loaded.path.parent)
    assert "apt_packages" not in capsys.readouterr().err
    apt = target.model_copy(update={"compile": target.compile.model_copy(update={"apt_packages": ("git", "patch")})})
    offline.held(f"{dest}@{pushed.index}", pushed.manifest, apt, loaded.path.parent)
    assert "compile.apt_packages (git, patch) are not locked, so not escrowed" in capsys.readouterr().err


class _Tampering(http.server.BaseHTTPRequestHandler):
    """A registry in front of the real one that serves other bytes for one blob (its storage
    changed behind its back); everything else is passed through as it is."""

    tampered = ""  # the blob digest whose bytes are replaced

    def _forward(self, method: str) -> None:
        if method == "GET" and self.path.endswith(f"/blobs/{self.tampered}"):
            body = b"tampered"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
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


def test_bytes_that_are_not_the_manifest_digest_are_refused_and_nothing_is_written(escrowed, tmp_path):
    loaded, dest, made = escrowed
    pushed = escrow_target(loaded, "smoke", dest)
    key = next(k for k in sorted(pushed.manifest.entries) if k.startswith("wheel "))
    handler = type("Tampering", (_Tampering,), {"tampered": pushed.manifest.entries[key].digest})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        front = f"127.0.0.1:{server.server_address[1]}/{dest.split('/', 1)[1]}"
        out = tmp_path / "escrow"
        with pytest.raises(RecordError, match="the escrow served bytes with digest"):
            download(f"{front}@{pushed.index}", loaded.target("smoke"), loaded.path.parent, out)
        assert not out.exists() and list(tmp_path.glob(".escrow.*")) == []
    finally:
        server.shutdown()
        server.server_close()


def test_a_second_build_escrowed_beside_the_first_pushes_only_what_changed(escrowed, monkeypatch):
    """Two builds that share sources, wheels and bases (here a label-only change: the expiry date,
    so a new Dockerfile and a new digest): the second escrow pushes its Dockerfile and nothing else
    of the inputs; everything else is already there, by content."""
    loaded, dest, made = escrowed
    first = escrow_target(loaded, "smoke", dest)
    path = loaded.path
    text = path.read_text()
    expires = loaded.target("smoke").expires.isoformat()
    path.write_text(text.replace(f"expires: '{expires}'", f"expires: '{_later(expires)}'"))
    bumped = matrix.load(path)
    pipeline.render_all(bumped, ["smoke"], check=False)
    plan = Plan.of(bumped, "smoke")  # the locks stand: the expiry is no input of theirs
    Checks(monkeypatch)
    second_digest = pipeline.build(plan, FakeEngine(), BuildOptions()).digest
    assert second_digest != first.manifest.digest
    second = escrow_target(bumped, "smoke", dest)
    rows = {r["kind"]: r for r in second.tally.rows()}
    assert {k: r["pushed"] + r["mounted"] for k, r in rows.items() if r["pushed"] + r["mounted"]} == {
        "recipe": sum(
            e.size
            for k, e in second.manifest.entries.items()
            if k.startswith("recipe ") and k.endswith("Dockerfile") and e.digest != first.manifest.entries[k].digest
        )
    }
    assert rows["recipe"]["pushed"] > 0
    made.recorded_more.append(second_digest)


def _later(day: str) -> str:
    return (dt.date.fromisoformat(day) + dt.timedelta(days=1)).isoformat()

"""`build escrow` on the built smoke (the session's `built` image, a copy of its checkout so its
record set is left alone): every input into a repository of this file's own on the local
registry, `build verify --registry`'s escrow row, a deleted blob named, a second escrow run that
pushes nothing. A few seconds on top of the build: the bases are mounted, not uploaded.

Then `build reproduce --from-escrow` with every upstream gone for the tool's process, the same
digest: a fresh cache (K3_CACHE_DIR empty, and the run's own cache inside the checkout), the
stand-in upstream repositories hidden (a mount namespace with an empty tmpfs over each: the shared
session's repositories are untouched for every other process), no network but the loopback
registry (HTTP(S)_PROXY to a closed port for everything else), the bases pulled from the escrow by
digest (the build resolves both in the escrow repository, never under their own names). A tampered blob is
refused first (exit 2, nothing written).

Then docs/auditor.md's hand rebuild, verbatim, against the same escrow: the context assembled with
curl, jq, git and tar alone, built by buildx, the recorded digest; and with the tampered blob, it
stops at that blob's sha256, before anything is built.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import secrets
import shutil
import subprocess
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from builder.engine.blobcopy import BlobCopier
from builder.engine.registry import RegistryClient
from tests.conftest import REPO
from tests.integration.conftest import BUILD, REGISTRY, Smoke, cli, restore_registry
from tests.integration.enginelock import build_hold
from tests.unit.test_escrow import _Tampering


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


def test_reproduce_from_the_escrow_alone_offline(built, escrow_repo, tmp_path):
    smoke = built[0].copy(tmp_path / "checkout")
    restore_registry(built[0])
    made = cli("--matrix", str(smoke.matrix), "escrow", "--target", "smoke", "--to", escrow_repo, "--json")
    assert made.code == 0, made.err[-3000:]
    ref = json.loads(made.out)["escrow"]
    downloaded = smoke.root / "artifacts" / "smoke" / "escrow"
    _tampered_is_refused(smoke, ref, downloaded, tmp_path / "hand-rebuild-tampered")
    record = json.loads(smoke.record.read_text())
    # Bit for bit at least a minute after the build (mtimes, created): the suite's one no-cache
    # rebuild of the built smoke (test_app_layers.py reproduces its own bumped build, upstream).
    finished = dt.datetime.fromisoformat(record["build"]["finished"].replace("Z", "+00:00"))
    wait = 61 - (dt.datetime.now(dt.timezone.utc) - finished).total_seconds()
    if wait > 0:
        time.sleep(wait)
    started = time.monotonic()
    args = ("--matrix", str(smoke.matrix), "reproduce", "--target", "smoke", "--from-escrow", ref, "--json")
    run = _offline(tmp_path, _remotes(record), args)
    print(f"reproduce --from-escrow of the smoke (amd64, no cache, offline): {time.monotonic() - started:.1f} s")
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(run.stdout)
    assert doc["reproduced"] and doc["rebuilt"] == doc["recorded"] == record["digest"], doc
    # The bases came from the escrow: BuildKit resolved them there by digest, never under their own
    # names. Only the resolutions are read: BuildKit shares identical in-flight steps between
    # concurrent builds on the engine, and writes a shared step into this log under the other
    # build's names (another test's smoke: its FROM <base's own name>; builder/engine/buildlog.py).
    log = max((smoke.root / "artifacts" / "smoke").glob("*/build.log"), key=lambda p: p.stat().st_mtime).read_text()
    resolved = set(re.findall(r"\[internal\] load metadata for (\S+)", log))
    assert resolved == {f"{escrow_repo}@{b['digest']}" for b in record["bases"].values()}, resolved
    assert not [p for p in downloaded.parent.iterdir() if p.name.startswith(".cache.")]  # the run's cache: gone
    assert not any((tmp_path / "fresh-cache").rglob("*.whl")) and not (tmp_path / "fresh-cache" / "git").exists()
    # The auditor's rebuild by hand from the same escrow: the recorded digest, the bases from the escrow.
    started = time.monotonic()
    to = f"{REGISTRY}/{smoke.repository}:hand-rebuild-{secrets.token_hex(3)}"
    try:
        hand = _hand_rebuild(smoke, tmp_path / "hand-rebuild", TO=to)
    finally:  # the block's --load left this tag on the shared engine: the test's own, removed
        subprocess.run(["docker", "image", "rm", "-f", to], capture_output=True)
    print(f"the hand rebuild from the escrow (amd64, the engine's cache): {time.monotonic() - started:.1f} s")
    assert hand.returncode == 0, hand.stdout[-2000:] + hand.stderr[-3000:]
    assert hand.stdout.splitlines()[-2:] == [
        f"pushed {to}@{record['digest']}",
        "hand rebuild: the recorded digest",
    ], hand.stdout[-2000:]
    resolved = set(re.findall(r"\[internal\] load metadata for (\S+)", hand.stderr))
    assert resolved == {f"{escrow_repo}@{b['digest']}" for b in record["bases"].values()}, resolved


def _tampered_is_refused(smoke: Smoke, ref: str, downloaded: Path, work: Path) -> None:
    """A registry in front of the escrow that serves other bytes for one wheel: the tool refuses it
    (exit 2, nothing written), and the hand rebuild stops at its sha256, before any build."""
    name, digest = ref.split("@")
    wheel = _an_input_blob(name, digest, "wheel ")
    handler = type("Tampering", (_Tampering,), {"tampered": wheel})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        front = f"127.0.0.1:{server.server_address[1]}/{name.split('/', 1)[1]}"
        bad = cli("--matrix", str(smoke.matrix), "reproduce", "--target", "smoke", "--from-escrow", f"{front}@{digest}")
        hand = _hand_rebuild(smoke, work, E=front, TO=f"{REGISTRY}/{smoke.repository}:hand-rebuild-tampered")
    finally:
        server.shutdown()
        server.server_close()
    assert bad.code == 2 and "the escrow served bytes with digest" in bad.err, bad.err[-2000:]
    assert not downloaded.exists() and not list(downloaded.parent.glob(".escrow.*"))
    assert hand.returncode != 0 and f": not {wheel}; stopped" in hand.stderr, hand.stdout[-2000:] + hand.stderr[-2000:]
    assert "pushed" not in hand.stdout and not (work / "metadata.json").exists()  # nothing was built


def _hand_rebuild(smoke: Smoke, work: Path, **env: str) -> subprocess.CompletedProcess:
    """The hand rebuild block of docs/auditor.md, verbatim, under bash -euo pipefail in the smoke's
    checkout; ``env`` names TO (a tag of the smoke's repository: its blobs are there already).
    It may use the engine's cache (CACHE empty): the context is what is tested, and an identical one
    gives the recorded digest (a wheel in another layer, tried by hand, does not)."""
    page = (REPO / "docs" / "auditor.md").read_text()
    block = page.split("<!-- hand-rebuild:begin -->", 1)[1].split("<!-- hand-rebuild:end -->", 1)[0]
    script = block.split("```bash\n", 1)[1].rsplit("```", 1)[0]
    full = {k: v for k, v in os.environ.items() if k not in ("E", "P", "TOKEN", "BUILDER")}
    full |= {
        "T": "smoke",
        "SCHEME": "http",
        "CACHE": "",
        "W": str(work),
        "TEMPLATES": str(REPO / "builder" / "dockerfile" / "templates"),
        **env,
    }
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=smoke.root, env=full, capture_output=True, text=True
    )


def _an_input_blob(name: str, index: str, prefix: str) -> str:
    """The blob of the first input whose key starts with ``prefix``, as the escrow's index names it."""
    client = RegistryClient()
    for child in client.raw_manifest(name, index).doc["manifests"]:
        if child.get("annotations", {}).get("dev.k3-builder.escrow.input", "").startswith(prefix):
            return client.raw_manifest(name, child["digest"]).doc["layers"][0]["digest"]
    raise AssertionError(f"no {prefix!r} input in {name}@{index}")


def _remotes(record: dict) -> list[Path]:
    """The stand-in upstream repositories the recorded build read (file:// URLs): source, third party, submodules."""
    source = record["source"]
    urls = [source["url"]] + [t["url"] for t in source.get("third_party", {}).values()]
    urls += [s["url"] for t in source.get("third_party", {}).values() for s in t.get("submodules", [])]
    paths = [Path(u.removeprefix("file://")) for u in urls]
    assert all(u.startswith("file://") for u in urls) and all(p.is_dir() for p in paths), urls
    return paths


def _offline(tmp_path: Path, hidden: list[Path], args: tuple[str, ...]) -> subprocess.CompletedProcess:
    """The tool with every upstream gone, for its process alone: each of ``hidden`` under an empty
    tmpfs in a mount namespace of its own, an empty K3_CACHE_DIR, and a proxy that refuses every
    connection for HTTP(S) but to the loopback registry (pip, urllib and git's https honour it;
    PIP_* is dropped by the tool's hermetic pip environment, so the proxy is what stops pip)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("hiding the upstream repositories needs root and unshare (a mount namespace)")
    closed = "http://127.0.0.1:9"  # discard: nothing listens there
    env = {
        **os.environ,
        "K3_CACHE_DIR": str(tmp_path / "fresh-cache"),
        "no_proxy": "127.0.0.1",
        "NO_PROXY": "127.0.0.1",
    }
    env |= {k: closed for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy")}
    env["K3_GONE"] = " ".join(map(str, hidden))  # no spaces in pytest's temporary paths
    script = 'for d in $K3_GONE; do mount -t tmpfs -o size=64k,mode=0555 k3-gone "$d" || exit 97; done; exec "$@"'
    with build_hold(args):
        return subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", BUILD, *args],
            capture_output=True,
            text=True,
            env=env,
        )

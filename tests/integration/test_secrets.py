"""A secret reaches the build only as a BuildKit secret mount: nowhere in layers, config,
history, logs, locks, records, SBOM or provenance."""

from __future__ import annotations

import gzip
import json
import os
import secrets

from builder.engine.buildx import DockerEngine
from tests.integration.conftest import REGISTRY, cli


def test_secret_is_mounted_and_leaves_no_trace(built, tmp_path):
    smoke, _ = built
    # The smoke's setup.py prints every secret whose id starts with "echo_" inside the compile step
    # (builder/smoke_assets/src/setup.py): the value really reaches the build and really is printed,
    # so the tool's redaction is what keeps it out of the output. A fresh id each run: a cached
    # compile step would print nothing.
    sid = f"echo_token_{secrets.token_hex(4)}"
    work = smoke.variant(
        tmp_path / "secret",
        "secret",
        lambda text: text.replace("compile:\n", f"compile:\n      secrets:\n      - {sid}\n", 1),
    )
    dockerfile = (work.root / "dockerfiles/smoke/Dockerfile").read_text()
    assert f"--mount=type=secret,id={sid},required=true" in dockerfile
    token = "hf_" + secrets.token_hex(16)
    env = dict(os.environ, HF_TOKEN=token)

    # Without the secret the tool refuses; the mount is required, so the engine would too.
    missing = cli("--matrix", str(work.matrix), "--target", "smoke", env=env)
    assert missing.code == 2 and f"needs {sid}" in missing.err

    r = cli("--matrix", str(work.matrix), "--target", "smoke", "--secret", f"id={sid},env=HF_TOKEN", env=env)
    assert r.code == 0, r.err[-3000:]
    assert token not in r.out + r.err
    # It was mounted and printed, and what reached the terminal and the log is the redacted line.
    printed = f"k3smoke: build secret {sid}: ***"
    assert printed in r.err, r.err[-3000:]
    record = json.loads(work.record.read_text())
    assert printed in (work.root / "artifacts" / "smoke" / record["build"]["id"] / "build.log").read_text()
    ref = r.out.strip().splitlines()[-1]
    name, digest = ref.split("@")

    # Every file the build wrote: logs, context, locks, records, SBOM, provenance.
    hits = [str(p) for p in work.root.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert hits == []
    # Every layer, the config and its history, in the registry.
    engine = DockerEngine()
    manifest = engine.registry.raw_manifest(name, digest).doc
    config = engine.registry.blob(name, manifest["config"]["digest"])
    assert token.encode() not in config
    assert sid not in json.dumps(json.loads(config).get("history", []))  # not even the id as an arg
    for layer in manifest["layers"]:
        blob = engine.registry.blob(name, layer["digest"])
        assert token.encode() not in gzip.decompress(blob)
    attached = engine.registry.referrers(name, digest)
    assert attached and all(token.encode() not in content for content in attached.values())
    assert name.startswith(REGISTRY)

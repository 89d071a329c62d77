"""A secret reaches the build only as a BuildKit secret mount: nowhere in layers, config,
history, logs, locks, records, SBOM or provenance."""

from __future__ import annotations

import gzip
import json
import os
import secrets

from builder.engine import DockerEngine
from tests.integration.conftest import REGISTRY, cli


def test_secret_is_mounted_and_leaves_no_trace(built, tmp_path):
    smoke, _ = built
    work = smoke.copy(tmp_path / "secret")
    text = work.matrix.read_text().replace("compile:\n", "compile:\n      secrets:\n      - hf_token\n", 1)
    work.matrix.write_text(text.replace("tag: smoke", "tag: secret"))
    assert cli("--matrix", str(work.matrix), "render").code == 0
    dockerfile = (work.root / "dockerfiles/smoke/Dockerfile").read_text()
    assert "--mount=type=secret,id=hf_token,required=true" in dockerfile
    token = "hf_" + secrets.token_hex(16)
    env = dict(os.environ, HF_TOKEN=token)

    # Without the secret the tool refuses; the mount is required, so the engine would too.
    missing = cli("--matrix", str(work.matrix), "--target", "smoke", env=env)
    assert missing.code == 2 and "needs hf_token" in missing.err

    r = cli("--matrix", str(work.matrix), "--target", "smoke", "--secret", "id=hf_token,env=HF_TOKEN", env=env)
    assert r.code == 0, r.err[-3000:]
    assert token not in r.out + r.err
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
    assert "hf_token" not in json.dumps(json.loads(config).get("history", []))  # not even the id as an arg
    for layer in manifest["layers"]:
        blob = engine.registry.blob(name, layer["digest"])
        assert token.encode() not in gzip.decompress(blob)
    attached = engine.registry.referrers(name, digest)
    assert attached and all(token.encode() not in content for content in attached.values())
    assert name.startswith(REGISTRY)

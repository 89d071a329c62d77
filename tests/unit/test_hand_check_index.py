"""The hand check of docs/auditor.md, verbatim, against an image index: the smoke naming linux/amd64
and linux/arm64 built with the fake engine (test_multiplatform.py's fixture), its registry served
over HTTP as a registry serves it (manifests, blobs, the referrers tag's index of each attached
artifact). tests/integration/test_audit.py runs the same block against the one-platform smoke."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from builder.config import contract
from builder.config.options import BuildOptions
from builder.pipeline import build as pipeline
from tests.conftest import REPO
from tests.unit.fakeengine import FakeEngine
from tests.unit.test_multiplatform import both, checks  # noqa: F401
from tests.unit.test_pipeline_ordering import smoke_repos  # noqa: F401

pytestmark = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("curl", "jq", "sha256sum", "base64", "cmp")), reason="the hand check's tools"
)


def _served(engine: FakeEngine, repo: str) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """manifests (by digest, tag and referrers tag) and blobs of ``repo``, as the registry serves them."""
    reg = engine.registry
    manifests = {d: raw for (n, d), raw in reg.manifests.items() if n == repo}
    manifests.update({t: reg.manifests[(n, d)] for (n, t), d in reg.tags.items() if n == repo})
    blobs = dict(reg.blobs)
    for (n, subject), arts in reg.attached.items():
        if n != repo:
            continue
        entries = []
        for kind, content in arts.items():
            blob = "sha256:" + hashlib.sha256(content).hexdigest()
            blobs[blob] = content
            raw = json.dumps({"subject": {"digest": subject}, "layers": [{"digest": blob}]}).encode()
            digest = "sha256:" + hashlib.sha256(raw).hexdigest()
            manifests[digest] = raw
            entries.append({"artifactType": kind, "digest": digest})
        manifests["sha256-" + subject.removeprefix("sha256:")] = json.dumps({"manifests": entries}).encode()
    return manifests, blobs


def _script() -> str:
    page = (REPO / "docs" / "auditor.md").read_text()
    block = page.split("<!-- hand-check:begin -->", 1)[1].split("<!-- hand-check:end -->", 1)[0]
    return block.split("```bash\n", 1)[1].rsplit("```", 1)[0]


def _run(plan, engine: FakeEngine) -> subprocess.CompletedProcess:
    host, _, repo = plan.target.image.name.partition("/")
    manifests, blobs = _served(engine, plan.target.image.name)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            prefix = f"/v2/{repo}/"
            kind, _, ref = self.path.removeprefix(prefix).partition("/")
            body = (manifests if kind == "manifests" else blobs).get(ref) if self.path.startswith(prefix) else None
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    record = plan.record_dir / contract.RECORD_NAME
    try:  # the index record names the image's host (the script's only use of it): reached here
        record.write_text(record.read_text().replace(host, f"127.0.0.1:{server.server_port}"))
        env = {"PATH": os.environ["PATH"], "T": plan.target.name, "SCHEME": "http", "HOME": os.environ.get("HOME", "/")}
        return subprocess.run(["bash", "-c", _script()], cwd=plan.root, env=env, capture_output=True, text=True)
    finally:
        server.shutdown()
        record.write_text(record.read_text().replace(f"127.0.0.1:{server.server_port}", host))


def test_the_hand_check_holds_on_an_image_index_and_fails_on_an_edit(both, checks):  # noqa: F811
    engine = FakeEngine()
    pipeline.build(both, engine, BuildOptions())
    ok = _run(both, engine)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.strip().splitlines()[-1] == "hand check: every link holds"
    prov = both.record_dir / "linux-arm64" / contract.PROVENANCE_NAME  # arm64's own evidence edited
    prov.write_text(prov.read_text().replace('"', " ", 1))
    bad = _run(both, engine)
    assert bad.returncode != 0 and "hand check: every link holds" not in bad.stdout


def test_the_hand_check_holds_on_a_one_image_target(tmp_path, monkeypatch, smoke_repos, checks):  # noqa: F811
    """The smoke naming no platforms (as CI's): one record set in locks/smoke/, as before the index."""
    import datetime as dt

    from builder.config import matrix
    from builder.pipeline.plan import Plan
    from builder.smoke import smoke
    from tests.unit.test_multiplatform import REGISTRY, _bases, _lock_all_one

    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "checkout"
    root.mkdir()
    text = smoke.matrix_text(REGISTRY, _bases()["linux/amd64"], smoke_repos, dt.date.today() + dt.timedelta(days=180))
    (root / "matrix.yaml").write_text(text)
    pipeline.render_all(matrix.load(root / "matrix.yaml"), ["smoke"], check=False)
    plan = Plan.of(matrix.load(root / "matrix.yaml"), "smoke")
    _lock_all_one(plan)
    engine = FakeEngine()
    pipeline.build(plan, engine, BuildOptions())
    assert not plan.indexed
    ok = _run(plan, engine)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.strip().splitlines()[-1] == "hand check: every link holds"

"""A registry that answers badly (issue 21, defect 5): a reply cut short, a manifest that is not
JSON or not an object, an image config that is not JSON. Each is one RegistryUnavailable line
(exit 3) naming the registry, never a traceback; a real HTTP server on loopback."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from builder.engine.registry import RegistryClient
from builder.errors import RegistryUnavailable

CONFIG = "sha256:" + "c" * 64


@pytest.fixture(autouse=True)
def no_retries(monkeypatch):
    """A cut reply is transient and tried again (test_registry_retries.py); here, what the last
    failure says."""
    monkeypatch.setenv("K3_REGISTRY_RETRY_SECONDS", "0")


def _serve(body: bytes, declared: int | None = None, ctype: str = "application/vnd.oci.image.manifest.v1+json"):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802
            data = body if "/manifests/" in self.path else b"not json at all"
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(declared if declared is not None else len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
            self.close_connection = True

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"127.0.0.1:{httpd.server_address[1]}"


@pytest.mark.parametrize(
    "body,declared,says",
    [
        (b'{"schemaVersion": 2, "layers": [', 4096, r"cut short or garbled \(IncompleteRead\)"),
        (b"<html>503 from a proxy</html>", None, "is not a JSON object"),
        (b"[1, 2, 3]", None, "is not a JSON object"),
        (b'{"layers": "not a list"}', None, "is not a JSON object"),
    ],
)
def test_a_bad_manifest_reply_is_one_registry_line(body, declared, says):
    httpd, host = _serve(body, declared, ctype="")
    try:
        with pytest.raises(RegistryUnavailable, match=f"^registry: {host}/k3/x:t: .*{says}") as err:
            RegistryClient().resolve_digest(f"{host}/k3/x:t")
        assert "\n" not in err.value.message and host in err.value.message
    finally:
        httpd.shutdown()


def test_an_image_config_that_is_not_json_is_one_registry_line():
    manifest = (f'{{"schemaVersion": 2, "config": {{"digest": "{CONFIG}", "size": 3}}, "layers": []}}').encode()
    httpd, host = _serve(manifest)
    try:
        with pytest.raises(RegistryUnavailable, match="content hashes to|not a JSON object"):
            RegistryClient().image_config(f"{host}/k3/x:t")
    finally:
        httpd.shutdown()

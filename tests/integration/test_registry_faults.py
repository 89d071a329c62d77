"""A busy registry (issue 55): a front on 127.0.0.1 forwards every request to the real registry on
127.0.0.1:5000, but fails each request twice with 500 and once with 429 (``Retry-After: 1``)
first (or resets the connection, then forwards it and cuts the reply short). Through it, the registry client's pushes and
reads and `build doctor --image` give the same answers as the registry itself; a front that fails
forever gives exit 3, one line, once ``K3_REGISTRY_RETRY_SECONDS`` is spent.

The image is the test's own: a one-layer image with doctor's labels, pushed through the front
under a repository of its own, deleted at the end (its manifests; the registry has no blob GC)."""

from __future__ import annotations

import http.client
import json
import os
import re
import secrets
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from builder.engine.registry import RegistryClient, RegistryError, split_reference
from builder.errors import RegistryUnavailable
from tests.integration.conftest import REGISTRY, cli, delete_repository
from tests.integration.test_field import SMI
from tests.integration.test_registry_auth import _push_tiny_image

LABELS = {
    "io.k3-cu129.target": "smoke",
    "io.k3-cu129.owner": "gpu-platform@example.org",
    "io.k3-cu129.expires": "2099-12-31",
    "io.k3-cu129.cuda-version": "12.9",
    "io.k3-cu129.driver-floor": "575.51.03",
    "io.k3-cu129.gpu-families": "8.0 9.0",
}
BUSY = ("500", "500", "429")  # each request, before it is forwarded
CUT = ("reset", "cut")


class Front:
    """A threaded HTTP proxy to the registry that fails each request (keyed by method, path and
    digest, the upload session left out) with the next of ``faults``, then forwards it;
    ``forever`` fails every request with 503 (and ``retry_after`` as its Retry-After)."""

    def __init__(self, faults: tuple[str, ...] = (), forever: bool = False, retry_after: str | None = None) -> None:
        self.faults, self.forever, self.counts, self.lock = faults, forever, {}, threading.Lock()
        self.retry_after = retry_after
        front = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _any(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                fault = front.fault(self.command, self.path)
                if fault == "reset":
                    self.close_connection = True  # no reply at all
                elif fault == "cut":  # the registry did it, the reply is cut short (or never comes)
                    code, headers, data = front.forward(self.command, self.path, self.headers, body)
                    if data and self.command != "HEAD":
                        self._reply(code, {**headers, "Content-Length": str(len(data))}, data[: len(data) // 2])
                    else:
                        self.close_connection = True
                elif fault:
                    retry = {"Retry-After": "1"} if fault == "429" else {}
                    if front.retry_after is not None:
                        retry = {"Retry-After": front.retry_after}
                    self._reply(int(fault), retry, b'{"errors":[{"code":"UNKNOWN","message":"injected"}]}')
                else:
                    self._reply(*front.forward(self.command, self.path, self.headers, body))

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _any  # noqa: N815

            def _reply(self, code: int, headers: dict[str, str], body: bytes) -> None:
                self.send_response(code)
                for key, value in headers.items():
                    self.send_header(key, value)
                if "Content-Length" not in headers:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def fault(self, method: str, path: str) -> str | None:
        if self.forever:
            return "503"
        parts = urllib.parse.urlsplit(path)
        key = (
            method,
            re.sub(r"/uploads/.*", "/uploads/", parts.path),
            urllib.parse.parse_qs(parts.query).get("digest"),
        )
        with self.lock:
            n = self.counts[str(key)] = self.counts.get(str(key), 0) + 1
        return self.faults[n - 1] if n <= len(self.faults) else None

    def forward(self, method: str, path: str, headers, body: bytes) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(REGISTRY, timeout=60)
        keep = {k: v for k, v in headers.items() if k.lower() not in ("host", "connection", "content-length")}
        conn.request(method, path, body=body if body or method in ("PUT", "POST", "PATCH") else None, headers=keep)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        out = {k: v for k, v in resp.getheaders() if k.lower() not in ("connection", "transfer-encoding")}
        if "Location" in out:  # the upload session's URL names the registry: keep the client on the front
            out["Location"] = out["Location"].replace(f"http://{REGISTRY}", f"http://{self.host}")
        return resp.status, out, data

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def front(request):
    made: list[Front] = []

    def make(*args, **kw) -> Front:
        made.append(Front(*args, **kw))
        return made[-1]

    yield make
    for f in made:
        f.close()


@pytest.fixture()
def repository():
    repo = f"k3/registry-faults-{secrets.token_hex(4)}"
    yield repo
    delete_repository(repo)


def _doctor(ref: str, sample: str, **env: str):
    return cli("doctor", "--image", ref, "--nvidia-smi-file", str(SMI / sample), "--json", env=dict(os.environ, **env))


@pytest.mark.parametrize("faults", [BUSY, CUT])
def test_through_a_busy_front_pushes_and_reads_give_the_registrys_answers(front, repository, faults):
    busy = front(faults)
    name, digest = _push_tiny_image(busy.host, repository, LABELS)  # every request failed first
    direct = f"{REGISTRY}/{repository}"
    client = RegistryClient()
    assert client.resolve_digest(f"{direct}:v1") == digest  # the registry itself serves what was pushed
    assert client.resolve_digest(f"{name}:v1") == digest
    assert client.raw_manifest(name, digest).raw == client.raw_manifest(direct, digest).raw
    assert client.image_config(f"{name}:v1") == client.image_config(f"{direct}:v1")
    assert client.image_config(f"{direct}:v1")["config"]["Labels"] == LABELS
    note = b'{"note": "attached through a busy front"}'
    artifact = client.attach(name, digest, "application/vnd.k3.test.note+json", note, {})
    assert RegistryClient().referrers(direct, digest) == {"application/vnd.k3.test.note+json": note}
    assert client.delete_manifest(direct, artifact)  # untagged: the repository's cleanup would miss it
    # Each request failed at least once first (a 404 cut short is still a 404: its status stands).
    assert busy.counts and min(busy.counts.values()) >= 2


@pytest.mark.parametrize("sample, code", [("r575-h100.txt", 0), ("r550-l4.txt", 1)])
def test_doctor_through_a_busy_front_gives_the_registrys_verdict(front, repository, sample, code):
    name, digest = _push_tiny_image(REGISTRY, repository, LABELS)
    busy = front(BUSY)
    healthy = _doctor(f"{REGISTRY}/{repository}:v1", sample)
    faulty = _doctor(f"{busy.host}/{repository}:v1", sample)
    assert (healthy.code, faulty.code) == (code, code), faulty.err
    assert json.loads(faulty.out.replace(busy.host, REGISTRY)) == json.loads(healthy.out)
    retries = [line for line in faulty.err.splitlines() if "retry" in line]
    assert retries and all(re.match(rf"warning: registry (GET|HEAD) {busy.host}/v2/", line) for line in retries)
    assert any("HTTP 500" in line for line in retries) and any("HTTP 429" in line for line in retries)
    assert "retry" not in healthy.err


@pytest.mark.parametrize("retry_after", [None, "0", "\u00b2", "Thu, 01 Jan 1970 00:00:00 GMT"])
def test_a_front_that_fails_forever_is_exit_3_after_the_retries(front, repository, retry_after):
    """Whatever its Retry-After (none, 0, a superscript digit, a past date): exit 3, one line, the
    backoff between retries (no request per round trip), and the retries the warnings counted."""
    name, digest = _push_tiny_image(REGISTRY, repository, LABELS)
    down = front(forever=True, retry_after=retry_after)
    r = _doctor(f"{down.host}/{repository}:v1", "r575-h100.txt", K3_REGISTRY_RETRY_SECONDS="3")
    assert r.code == 3, r.out + r.err
    assert "Traceback" not in r.err
    error = json.loads(r.out)["error"]
    assert "\n" not in error and down.host in error and "HTTP 503" in error
    assert "K3_REGISTRY_RETRY_SECONDS=3" in error
    retries = sum("retry" in line for line in r.err.splitlines())
    assert retries >= 2 and f"still failing after {retries} retries" in error
    assert sum(down.counts.values()) <= retries + 1  # backoff: 3 s hold a handful of requests, not thousands


def test_the_client_gives_up_with_registry_unavailable(front, repository, monkeypatch):
    monkeypatch.setenv("K3_REGISTRY_RETRY_SECONDS", "2")
    down = front(forever=True)
    with pytest.raises(
        RegistryUnavailable, match=f"^registry: {down.host}/{repository}:v1: .*HTTP 503 .*still failing"
    ):
        RegistryClient().raw_manifest(*split_reference(f"{down.host}/{repository}:v1"))
    with pytest.raises(RegistryError, match="HTTP 503 .*still failing"):
        _push_tiny_image(down.host, repository, LABELS)

"""Credentials never follow a redirect off their origin (issue 49, item 1), and a token realm is
asked only on the registry's own host or where the operator allows it.

Two real HTTP servers on 127.0.0.1 (threads): a registry stand-in that wants the helper's
credentials and then redirects (301/302/307/308) to the other, which records every
Authorization header it is sent and must never see one."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from builder.engine import transport
from builder.engine.auth import realm_allowed
from builder.engine.registry import Registry, RegistryError
from builder.errors import ConfigError
from tests.unit import test_registry_auth as auth_tests

SECRET = auth_tests.SECRET
env = auth_tests.env  # DOCKER_CONFIG and PATH of the test's own (a fixture)
BASIC = "Basic " + base64.b64encode(f"alice:{SECRET}".encode()).decode()
BEARER = "Bearer tok-alice-0123456789"
BLOB = b"a layer served by the object store"
DIGEST = "sha256:" + hashlib.sha256(BLOB).hexdigest()

Reply = tuple[int, dict[str, str], bytes]


class Host:
    """An HTTP server on 127.0.0.1: ``answer(handler)`` gives each reply (None: the connection is
    closed with no reply); every request is kept as (method, path, Authorization)."""

    def __init__(self, answer: Callable[[BaseHTTPRequestHandler], Reply | None]) -> None:
        self.seen: list[tuple[str, str, str]] = []
        host = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def handle(self):
                with contextlib.suppress(OSError):  # a client that gave up (a timeout test)
                    super().handle()

            def _any(self):
                host.seen.append((self.command, self.path, self.headers.get("Authorization", "")))
                length = int(self.headers.get("Content-Length") or 0)
                self.body = self.rfile.read(length) if length else b""
                reply = answer(self)
                if reply is None:
                    self.close_connection = True
                    return
                code, headers, body = reply
                self.send_response(code)
                for key, value in headers.items():
                    self.send_header(key, value)
                if "Content-Length" not in headers:  # a declared length longer than the body: a cut reply
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_HEAD = do_PUT = do_POST = _any  # noqa: N815

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"
        self.url = f"http://{self.host}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def auths(self) -> list[str]:
        return [auth for _, _, auth in self.seen if auth]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def store():
    """The object store a registry redirects to: serves the blob to anyone, keeps what it saw."""

    def answer(h: BaseHTTPRequestHandler) -> Reply:
        if h.path.startswith("/token"):
            return 200, {}, json.dumps({"token": "tok-from-elsewhere-0123"}).encode()
        if h.path.startswith("/back"):  # a redirect back to the registry that sent us here
            return 307, {"Location": h.headers["X-Back"]}, b""
        return 200, {"Content-Type": "application/octet-stream"}, BLOB

    host = Host(answer)
    yield host
    host.close()


def _gate(h: BaseHTTPRequestHandler, mode: str, realm: str) -> Reply | None:
    """A registry's token service and 401 for ``mode`` ("basic", "bearer" from ``realm``); None
    once the request carries the right credential."""
    auth = h.headers.get("Authorization", "")
    if h.path.startswith("/token"):
        return 200, {}, json.dumps({"token": BEARER.split()[1] if auth == BASIC else "tok-anon-0123"}).encode()
    if auth != (BASIC if mode == "basic" else BEARER):
        challenge = 'Basic realm="k3"' if mode == "basic" else f'Bearer realm="{realm}"'
        return 401, {"WWW-Authenticate": challenge}, b'{"errors":[{"code":"UNAUTHORIZED"}]}'
    return None


def _registry(store: Host, code: int, mode: str = "basic", realm: str | None = None) -> Host:
    """A registry that wants ``mode`` credentials, then answers ``code`` to the store for blobs."""

    def answer(h: BaseHTTPRequestHandler) -> Reply:
        refused = _gate(h, mode, realm or registry.url + "/token")
        if refused:
            return refused
        if "/blobs/" in h.path and h.command == "GET":
            return code, {"Location": f"{store.url}/objects/{DIGEST}?X-Signature=presigned"}, b""
        return 200, {}, b""

    registry = Host(answer)
    return registry


@pytest.fixture()
def helper(env):
    """The credential helper answers alice:SECRET for whichever registry asks."""

    def configure(host: str) -> None:
        env.helper("k3redir", auth_tests._answer("alice", SECRET, host))
        env.write_config({"credHelpers": {host: "k3redir"}})

    return configure


@pytest.mark.parametrize("code", [301, 302, 307, 308])
@pytest.mark.parametrize("mode", ["basic", "bearer"])
def test_a_redirected_blob_reaches_the_store_without_the_credential(helper, store, code, mode, tmp_path):
    registry = _registry(store, code, mode)
    try:
        helper(registry.host)
        reg = Registry(registry.host)
        assert reg.blob("k3/x", DIGEST) == BLOB
        reg.blob_to("k3/x", DIGEST, tmp_path / "blob")  # the streamed download too
        assert (tmp_path / "blob").read_bytes() == BLOB
        assert [path.split("?")[0] for _, path, _ in store.seen] == [f"/objects/{DIGEST}"] * 2
        assert store.auths() == []
        assert BASIC in registry.auths() or BEARER in registry.auths()  # it was sent, to the registry
    finally:
        registry.close()


def test_a_redirect_on_the_same_origin_keeps_the_credential(helper, store):
    def answer(h: BaseHTTPRequestHandler) -> Reply:
        if h.headers.get("Authorization") != BASIC:
            return 401, {"WWW-Authenticate": 'Basic realm="k3"'}, b""
        if h.path.endswith("/moved"):
            return 200, {}, BLOB
        return 307, {"Location": f"/v2/k3/x/blobs/{DIGEST}/moved"}, b""

    registry = Host(answer)
    try:
        helper(registry.host)
        assert Registry(registry.host).blob("k3/x", DIGEST) == BLOB
        assert registry.seen[-1] == ("GET", f"/v2/k3/x/blobs/{DIGEST}/moved", BASIC)
    finally:
        registry.close()


def test_a_credential_dropped_once_is_not_put_back_when_a_redirect_returns(helper, store):
    """registry -> store -> registry again: the second visit comes without the credential."""
    back: list[str] = []

    def answer(h: BaseHTTPRequestHandler) -> Reply:
        if h.path.startswith("/v2/back"):
            back.append(h.headers.get("Authorization", ""))
            return 200, {}, BLOB
        if h.headers.get("Authorization") != BASIC:
            return 401, {"WWW-Authenticate": 'Basic realm="k3"'}, b""
        return 302, {"Location": f"{store.url}/back"}, b""

    registry = Host(answer)
    try:
        helper(registry.host)
        reg = Registry(registry.host)
        reg._request("GET", "/v2/k3/x/blobs/start", headers={"X-Back": f"{registry.url}/v2/back"})
        assert back == [""] and store.auths() == []
    finally:
        registry.close()


def test_a_token_service_that_redirects_does_not_pass_the_credential_on(helper, store):
    def answer(h: BaseHTTPRequestHandler) -> Reply:
        if h.path.startswith("/token"):
            return 307, {"Location": f"{store.url}/token?moved=1"}, b""
        if h.headers.get("Authorization") != "Bearer tok-from-elsewhere-0123":
            return 401, {"WWW-Authenticate": f'Bearer realm="{registry.url}/token",service="k3"'}, b""
        return 200, {}, BLOB

    registry = Host(answer)
    try:
        helper(registry.host)
        assert Registry(registry.host).blob("k3/x", DIGEST) == BLOB
        assert [p.split("?")[0] for _, p, _ in store.seen] == ["/token"] and store.auths() == []
        assert registry.seen[1] == ("GET", "/token?service=k3", BASIC)  # the realm itself got it
    finally:
        registry.close()


def test_a_token_realm_on_another_host_is_not_asked_unless_the_operator_allows_it(helper, store, monkeypatch):
    registry = _registry(store, 200, "bearer", realm=f"{store.url}/token")
    try:
        helper(registry.host)
        with pytest.raises(RegistryError) as info:
            Registry(registry.host).manifest("k3/x", "latest")
        assert info.value.status == 401 and store.seen == []
        assert f"token realm {store.host} is not on {registry.host}" in str(info.value)
        assert f"K3_TOKEN_REALMS={registry.host}={store.host}" in str(info.value)

        monkeypatch.setenv("K3_TOKEN_REALMS", f"registry.example=auth.example, {registry.host}={store.host}")
        with pytest.raises(RegistryError):  # the store's token is not the registry's: refused, but asked
            Registry(registry.host).manifest("k3/x", "latest")
        assert [(m, p.split("?")[0], a) for m, p, a in store.seen] == [("GET", "/token", BASIC)]
    finally:
        registry.close()


@pytest.mark.parametrize(
    "host, realm, allowed",
    [
        ("registry-1.docker.io", "https://auth.docker.io/token", True),  # built in: Docker Hub
        ("registry.example", "https://auth.docker.io/token", False),
        ("registry.example", "https://registry.example/token", True),
        ("registry.example", "https://registry.example:8443/token", False),  # another port, another service
        ("registry.example:443", "https://registry.example/token", True),
        ("127.0.0.1:5000", "http://127.0.0.1:5000/token", True),
        ("127.0.0.1:5000", "http://127.0.0.1:5001/token", False),
        ("registry.example", "http://registry.example:443/token", False),  # same host:port, cleartext
        ("registry.example", "http://registry.example/token", False),
        ("127.0.0.2:8443", "http://127.0.0.2:8443/token", False),  # https: 127.0.0.2 is not loopback by name
        ("registry.example", "https://registry.example.attacker.test/token", False),
    ],
)
def test_which_realms_are_honoured(host, realm, allowed):
    assert realm_allowed(host, realm) is allowed


@pytest.mark.parametrize("value", ["auth.example", "=auth.example", "r.example=", "r.example=https://a.example/t"])
def test_a_malformed_realm_allowance_is_bad_input_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("K3_TOKEN_REALMS", value)
    with pytest.raises(ConfigError, match=r"^\$K3_TOKEN_REALMS: .* is not registry=realm-host"):
        realm_allowed("r.example", "https://a.example/token")


@pytest.mark.parametrize(
    "a, b, same",
    [
        ("https://r.example/v2/x", "https://r.example:443/v2/y", True),
        ("https://r.example/v2/x", "http://r.example/v2/x", False),  # a downgrade to plain http
        ("https://r.example/v2/x", "https://R.EXAMPLE/v2/x", True),
        ("https://r.example/v2/x", "https://cdn.r.example/v2/x", False),
        ("http://127.0.0.1:5000/a", "http://127.0.0.1:5001/a", False),
    ],
)
def test_an_origin_is_scheme_host_and_port(a, b, same):
    assert (transport.origin(a) == transport.origin(b)) is same


# -- an upload session's Location (issue 49, review of item 1) -------------------------------------


def _uploading_registry(location: Callable[[], str], mode: str = "basic") -> Host:
    """A registry that wants ``mode`` credentials and opens upload sessions at ``location()``."""

    def answer(h: BaseHTTPRequestHandler) -> Reply:
        refused = _gate(h, mode, registry.url + "/token")
        if refused:
            return refused
        return {"HEAD": (404, {}, b""), "POST": (202, {"Location": location()}, b"")}.get(h.command, (201, {}, b""))

    registry = Host(answer)
    return registry


@pytest.mark.parametrize("mode", ["basic", "bearer"])
@pytest.mark.parametrize("wants", [201, 401])
def test_an_upload_session_on_another_host_gets_no_credential(helper, mode, wants):
    """The session's PUT goes where Location says, but the token stays with the registry, and a
    401 from the other host is not answered with the registry's credentials."""

    def answer(h: BaseHTTPRequestHandler) -> Reply:
        return (401, {"WWW-Authenticate": 'Basic realm="elsewhere"'}, b"") if wants == 401 else (201, {}, b"")

    other = Host(answer)
    registry = _uploading_registry(lambda: f"{other.url}/upload/abc?_state=s1", mode)
    try:
        helper(registry.host)
        reg = Registry(registry.host)
        if wants == 201:
            reg.push_blob("k3/x", BLOB)
        else:
            with pytest.raises(RegistryError) as info:
                reg.push_blob("k3/x", BLOB)
            assert info.value.status == 401 and other.host in str(info.value)
            assert "not the registry's origin: no credentials sent there" in str(info.value)
        assert [(m, p.split("?")[0]) for m, p, _ in other.seen] == [("PUT", "/upload/abc")]
        assert other.auths() == []
        assert "_state=s1&digest=sha256%3A" in other.seen[0][1]  # the session's own query kept
        assert BASIC in registry.auths() or BEARER in registry.auths()
    finally:
        registry.close()
        other.close()


@pytest.mark.parametrize(
    "location, path",
    [
        ("/v2/k3/x/blobs/uploads/u1", "/v2/k3/x/blobs/uploads/u1"),
        ("uploads/u1", "/v2/k3/x/blobs/uploads/uploads/u1"),  # relative to the POST's URL (RFC 3986)
        ("HTTP://{host}/v2/k3/x/blobs/uploads/u1", "/v2/k3/x/blobs/uploads/u1"),
        ("//{host}/v2/k3/x/blobs/uploads/u1", "/v2/k3/x/blobs/uploads/u1"),
        ("httpfoo/u1", "/v2/k3/x/blobs/uploads/httpfoo/u1"),
        ("?_state=abc", "/v2/k3/x/blobs/uploads/"),
    ],
)
def test_an_upload_location_is_resolved_against_the_post(helper, location, path):
    registry = _uploading_registry(lambda: location.format(host=registry.host))
    try:
        helper(registry.host)
        Registry(registry.host).push_blob("k3/x", BLOB)
        method, sent, auth = registry.seen[-1]
        assert (method, sent.split("?")[0], auth) == ("PUT", path, BASIC)
    finally:
        registry.close()


@pytest.mark.parametrize(
    "location", ["http://[::1/u1", "http://127.0.0.1:99999/u1", "/v2/k3/x/blobs/uploads/u 1", "http://:80/u1"]
)
def test_a_malformed_upload_location_is_final_not_retried(helper, monkeypatch, location):
    lines: list[str] = []
    monkeypatch.setattr(transport.log, "warn", lines.append)
    registry = _uploading_registry(lambda: location)
    try:
        helper(registry.host)
        with pytest.raises(RegistryError) as info:
            Registry(registry.host).push_blob("k3/x", BLOB)
        assert info.value.fault is transport.Fault.OTHER and lines == []
    finally:
        registry.close()

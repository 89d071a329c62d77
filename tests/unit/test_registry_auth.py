"""builder.engine.auth's credentials: the Docker config's credHelpers, credsStore and auths, the
credential-helper protocol, and what a refusal says (never the secret). Fake helpers are shell
scripts on a temporary PATH; the HTTP side is a tiny registry stand-in on 127.0.0.1."""

from __future__ import annotations

import base64
import json
import os
import stat
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from builder import log
from builder.engine import auth
from builder.engine.auth import (
    DOCKER_HUB_SERVER,
    CredentialLookup,
    Credentials,
    credential_helper_get,
    docker_credentials,
)
from builder.engine.registry import Registry, RegistryClient, RegistryError
from builder.errors import RegistryUnavailable

SECRET = "s3cr3t-Pa55word-for-k3"


@pytest.fixture()
def env(tmp_path, monkeypatch):
    """An empty DOCKER_CONFIG and a PATH dir for fake helpers (the rest of PATH stays for sh, cat)."""
    config_dir, bin_dir = tmp_path / "docker", tmp_path / "bin"
    config_dir.mkdir()
    bin_dir.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(config_dir))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    class Env:
        config = config_dir / "config.json"

        @staticmethod
        def write_config(doc: dict) -> None:
            Env.config.write_text(json.dumps(doc))

        @staticmethod
        def helper(name: str, body: str) -> Path:
            """docker-credential-<name>: records its arguments and stdin, then runs ``body``."""
            path = bin_dir / f"docker-credential-{name}"
            log_file = tmp_path / f"{name}.calls"
            path.write_text(f'#!/bin/sh\nin=$(cat)\nprintf "%s|%s\\n" "$*" "$in" >> "{log_file}"\n{body}\n')
            path.chmod(path.stat().st_mode | stat.S_IXUSR)
            return log_file

    return Env


def _answer(user: str, secret: str, server: str = "127.0.0.1:5999") -> str:
    doc = json.dumps({"ServerURL": server, "Username": user, "Secret": secret})
    return f"cat <<'JSON'\n{doc}\nJSON"


# -- where credentials come from ------------------------------------------------------------------


def test_a_cred_helper_is_asked_with_the_protocol(env):
    calls = env.helper("k3a", _answer("alice", SECRET))
    env.write_config({"credHelpers": {"127.0.0.1:5999": "k3a"}})
    found = docker_credentials("127.0.0.1:5999")
    assert found.credentials and (found.credentials.username, found.credentials.secret) == ("alice", SECRET)
    assert calls.read_text() == "get|127.0.0.1:5999\n"  # `get`, the server URL on stdin
    assert "docker-credential-k3a" in found.note and SECRET not in found.note
    assert SECRET not in repr(found)


def test_cred_helpers_win_over_creds_store_which_wins_over_auths(env):
    env.helper("host", _answer("from-host-helper", SECRET))
    env.helper("store", _answer("from-store", SECRET))
    auth = base64.b64encode(f"from-auths:{SECRET}".encode()).decode()
    env.write_config(
        {
            "credHelpers": {"127.0.0.1:5999": "host"},
            "credsStore": "store",
            "auths": {"127.0.0.1:5999": {"auth": auth}, "other.example:443": {"auth": auth}},
        }
    )
    assert docker_credentials("127.0.0.1:5999").credentials.username == "from-host-helper"
    assert docker_credentials("other.example:443").credentials.username == "from-store"
    env.write_config({"auths": {"https://other.example:443/v1/": {"auth": auth}}})
    found = docker_credentials("other.example:443")
    assert found.credentials.username == "from-auths" and found.credentials.secret == SECRET


def test_creds_store_failure_is_anonymous_not_a_fallback_to_auths(env):
    """Like the Docker CLI: with a credsStore the store answers; an entry under auths is a marker."""
    env.helper("store", 'echo "credentials not found in native keychain"; exit 1')
    auth = base64.b64encode(f"someone:{SECRET}".encode()).decode()
    env.write_config({"credsStore": "store", "auths": {"127.0.0.1:5999": {"auth": auth}}})
    found = docker_credentials("127.0.0.1:5999")
    assert found.credentials is None
    assert "has no credentials for 127.0.0.1:5999" in found.note and "credsStore" in found.note


def test_docker_hub_is_asked_by_its_index_url(env):
    calls = env.helper("hub", _answer("bob", SECRET, DOCKER_HUB_SERVER))
    env.write_config({"credHelpers": {"https://index.docker.io/v1/": "hub"}})
    assert docker_credentials("registry-1.docker.io").credentials.username == "bob"
    assert calls.read_text() == f"get|{DOCKER_HUB_SERVER}\n"


def test_an_identity_token_in_auths(env):
    env.write_config({"auths": {"127.0.0.1:5999": {"auth": "", "identitytoken": SECRET}}})
    creds = docker_credentials("127.0.0.1:5999").credentials
    assert creds.identity_token and creds.secret == SECRET


@pytest.mark.parametrize(
    "body, says",
    [
        (None, "docker-credential-k3x is not on PATH"),
        ('echo "credentials not found in native keychain"; exit 1', "has no credentials for 127.0.0.1:5999"),
        (f'echo "boom {SECRET}" >&2; echo "{SECRET}"; exit 3', "get failed (exit 3)"),
        (f'echo "not json {SECRET}"', "printed no JSON object"),
        ('echo "[1, 2]"', "printed no JSON object"),
        ('echo \'{"Username": "u", "Secret": ""}\'', "without a Username and Secret"),
        (f'echo \'{{"Secret": "{SECRET}"}}\'', "without a Username and Secret"),
    ],
)
def test_a_missing_or_failing_helper_means_anonymous_and_says_why_without_the_secret(env, body, says):
    if body is not None:
        env.helper("k3x", body)
    env.write_config({"credHelpers": {"127.0.0.1:5999": "k3x"}})
    found = docker_credentials("127.0.0.1:5999")
    assert found.credentials is None
    assert says in found.note and "sent none" in found.note
    assert SECRET not in found.note and "\n" not in found.note


def test_a_hanging_helper_times_out(env):
    env.helper("slow", "sleep 5")
    found = credential_helper_get("slow", "127.0.0.1:5999", timeout=0.3)
    assert found.credentials is None and "did not answer within 0.3 s" in found.note


@pytest.mark.parametrize("name", ["../../bin/sh", "a b", "", None, 7])
def test_a_helper_name_that_is_not_a_name_runs_nothing(env, name):
    env.write_config({"credHelpers": {"127.0.0.1:5999": name}})
    assert docker_credentials("127.0.0.1:5999").credentials is None


@pytest.mark.parametrize(
    "text",
    [
        None,
        "{not json",
        "[]",
        json.dumps({"auths": []}),
        json.dumps({"auths": {"127.0.0.1:5999": {"auth": "%%%notbase64"}}}),
    ],
)
def test_a_missing_or_broken_config_is_anonymous(env, text):
    if text is not None:
        env.config.write_text(text)
    assert docker_credentials("127.0.0.1:5999").credentials is None


def test_a_secret_read_is_redacted_from_every_log_line(env):
    secret = "an0ther-Secret-value-k3"
    env.helper("k3r", _answer("carol", secret))
    env.write_config({"credHelpers": {"127.0.0.1:5999": "k3r"}})
    creds = docker_credentials("127.0.0.1:5999").credentials
    assert log.redact(f"x {secret} y {creds.basic()}") == "x *** y ***"


# -- the HTTP side: basic and bearer against a stand-in registry ---------------------------------------


class _Server:
    """/v2/... wants ``Basic alice:SECRET`` (mode basic) or a bearer token from /token (mode bearer)."""

    def __init__(self, mode: str) -> None:
        self.mode, self.seen = mode, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):  # noqa: N802
                auth = self.headers.get("Authorization", "")
                server.seen.append((self.path, auth))
                good_basic = "Basic " + base64.b64encode(f"alice:{SECRET}".encode()).decode()
                if self.path.startswith("/token"):
                    if auth and auth != good_basic:
                        return self._send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}')
                    token = "tok-alice-0123456789" if auth else "tok-anon-0123456789"
                    return self._send(200, json.dumps({"token": token}).encode())
                ok = auth == good_basic if server.mode == "basic" else auth == "Bearer tok-alice-0123456789"
                if not ok:
                    challenge = (
                        'Basic realm="k3"'
                        if server.mode == "basic"
                        else f'Bearer realm="http://127.0.0.1:{server.port}/token",service="k3",'
                        'scope="repository:k3/x:pull"'
                    )
                    return self._send(
                        401,
                        b'{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}\n',
                        {"WWW-Authenticate": challenge},
                    )
                body = b'{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json"}'
                return self._send(200, body, {"Content-Type": "application/vnd.oci.image.manifest.v1+json"})

            def _send(self, code, body, headers=None):
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.host = f"127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(params=["basic", "bearer"])
def server(request):
    s = _Server(request.param)
    yield s
    s.close()


@pytest.mark.parametrize("password, ok", [(SECRET, True), ("wrong-Passw0rd-k3", False)])
def test_helper_credentials_reach_the_registry(env, server, password, ok):
    env.helper("k3h", _answer("alice", password, server.host))
    env.write_config({"credHelpers": {server.host: "k3h"}})
    reg = Registry(server.host)
    if ok:
        assert reg.manifest("k3/x", "latest") is not None
        return
    with pytest.raises(RegistryError) as info:
        reg.manifest("k3/x", "latest")
    msg = str(info.value)
    assert info.value.status == 401 and "HTTP 401" in msg and "\n" not in msg
    assert "docker-credential-k3h" in msg and "refused" in msg
    assert password not in msg and SECRET not in msg


def test_no_helper_is_one_line_401_through_the_client(env, server):
    env.write_config({"credHelpers": {server.host: "k3-not-installed"}})
    with pytest.raises(RegistryUnavailable) as info:
        RegistryClient().resolve_digest(f"{server.host}/k3/x:latest")
    msg = str(info.value)
    assert "HTTP 401" in msg and "docker-credential-k3-not-installed is not on PATH" in msg and "\n" not in msg


def test_the_helper_is_asked_once_per_registry(env, server):
    calls = env.helper("k3once", _answer("alice", SECRET, server.host))
    env.write_config({"credHelpers": {server.host: "k3once"}})
    reg = Registry(server.host)
    for _ in range(3):
        assert reg.manifest("k3/x", "latest") is not None
    assert len(calls.read_text().splitlines()) == 1


@pytest.mark.parametrize("realm, asked", [("http://token.example/token", False), ("https://token.example/token", True)])
def test_an_allowed_token_service_elsewhere_is_asked_only_over_https(env, monkeypatch, realm, asked):
    """A bearer realm on another host (allowed by $K3_TOKEN_REALMS) over plain http, for an https
    registry, is not asked at all (not even anonymously: its token would come back in cleartext)."""
    import io

    from builder.engine import transport

    env.helper("k3h", _answer("alice", SECRET, "registry.example"))
    env.write_config({"credHelpers": {"registry.example": "k3h"}})
    monkeypatch.setenv("K3_TOKEN_REALMS", "registry.example=token.example")
    seen = []

    def open_url(req, credential, timeout=None):
        seen.append(credential)
        return io.BytesIO(b'{"token": "tok-0123456789"}')

    monkeypatch.setattr(transport, "open_url", open_url)
    reg = Registry("registry.example")
    assert reg._authenticate(f'Bearer realm="{realm}",service="k3",scope="repository:k3/x:pull"') is asked
    assert [credential is not None for credential in seen] == ([True] if asked else [])
    if not asked:
        return
    assert reg._token == "Bearer tok-0123456789"


def test_an_https_registrys_plain_http_realm_on_its_own_host_and_port_is_not_asked():
    """127.0.0.2 is not loopback by name, so its registry is https; a realm naming the same host
    and port over http is a cleartext service: neither the credentials nor a request go there."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802
            seen.append(self.headers.get("Authorization", ""))
            self.send_response(200)
            self.send_header("Content-Length", "15")
            self.end_headers()
            self.wfile.write(b'{"token":"t0k"}')

    token = ThreadingHTTPServer(("127.0.0.2", 0), Handler)
    threading.Thread(target=token.serve_forever, args=(0.05,), daemon=True).start()
    host = f"127.0.0.2:{token.server_address[1]}"
    try:
        creds = CredentialLookup(Credentials("alice", SECRET, "test"), "test creds")
        answer = auth.answer_challenge(f'Bearer realm="http://{host}/token",service="r"', creds, host, None)
        assert answer.header is None and seen == []
        assert answer.note == f"the registry's token realm http://{host} is plain http; asked nothing there"
    finally:
        token.shutdown()
        token.server_close()

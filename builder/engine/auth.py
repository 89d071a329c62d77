"""Authenticating to an OCI registry: the credentials the Docker CLI would send, and the answer to
a registry's 401 challenge (basic credentials, or a bearer token from the challenge's realm).

Credentials come from the Docker config (``$DOCKER_CONFIG/config.json``, else ~/.docker/config.json)
the way the Docker CLI finds them: ``credHelpers[host]`` wins over ``credsStore``, which wins over
``auths`` (``auth``, ``identitytoken``). A helper is ``docker-credential-<name>`` on PATH, asked with
the credential-helper protocol (``get``, the server URL on stdin, ``{"ServerURL", "Username",
"Secret"}`` on stdout); one that is missing, fails or answers nonsense means no credentials
(anonymous). They are sent as basic credentials or exchanged for a bearer token where the registry
asks for one. Every secret is registered with ``builder.log.register_secret`` as soon as it is
read, and never appears in logs or errors: a refusal says where the credentials came from, not
what they are.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from builder import log
from builder.engine import transport
from builder.errors import ConfigError


def insecure(host: str) -> bool:
    """Whether ``host`` is spoken to over plain http: loopback, or named in $K3_INSECURE_REGISTRIES."""
    bare = host.rsplit(":", 1)[0]
    extra = {h.strip() for h in os.environ.get("K3_INSECURE_REGISTRIES", "").split(",") if h.strip()}
    return bare in ("localhost", "127.0.0.1", "::1") or host in extra


# --- credentials (the Docker config and the credential-helper protocol) ---------------------------

DOCKER_HUB_HOSTS = ("registry-1.docker.io", "index.docker.io", "docker.io")
DOCKER_HUB_SERVER = "https://index.docker.io/v1/"
HELPER_TIMEOUT = 60  # seconds; ECR/GCR helpers call their cloud's API
_HELPER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


@dataclass(frozen=True)
class Credentials:
    username: str
    secret: str = field(repr=False)
    source: str  # where they came from, for messages: never the secret itself

    @property
    def identity_token(self) -> bool:
        """A helper's ``<token>`` user (or an ``identitytoken``): the secret is an OAuth2 refresh token."""
        return self.username == "<token>"

    def basic(self) -> str:
        return base64.b64encode(f"{self.username}:{self.secret}".encode()).decode()


@dataclass(frozen=True)
class CredentialLookup:
    credentials: Credentials | None
    note: str  # one line, no secret: where the credentials came from, or why there are none


def docker_config_path() -> Path:
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"


def _hostname(key: str) -> str:
    """A config key ('https://host/v1/', 'host:port', 'http://host') -> 'host[:port]', like the CLI's
    ConvertToHostname."""
    key = re.sub(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", "", key)
    return key.split("/", 1)[0]


def _same_registry(key: str, host: str) -> bool:
    name = _hostname(key)
    if host in DOCKER_HUB_HOSTS:
        return name in DOCKER_HUB_HOSTS
    return name == host


def _server_url(host: str) -> str:
    """What the Docker CLI passes to a helper for this registry: the host, or Docker Hub's URL."""
    return DOCKER_HUB_SERVER if host in DOCKER_HUB_HOSTS else host


def _remember(creds: Credentials) -> Credentials:
    log.register_secret(creds.secret)
    log.register_secret(creds.basic())
    return creds


def credential_helper_get(helper: str, server_url: str, timeout: float = HELPER_TIMEOUT) -> CredentialLookup:
    """``docker-credential-<helper> get`` for ``server_url``; any failure means no credentials.

    Nothing the helper prints is ever repeated (it may hold the secret): a failure is described by
    the helper's name, the server and the exit status only."""
    if not isinstance(helper, str) or not _HELPER_NAME.match(helper):
        return CredentialLookup(None, f"the credential helper name {helper!r} is not valid; sent none")
    program = f"docker-credential-{helper}"
    exe = shutil.which(program)
    if exe is None:
        return CredentialLookup(None, f"{program} is not on PATH; sent none")
    try:
        # Its own process group: on a timeout the helper and anything it started go, pipes and all.
        proc = subprocess.Popen(
            [exe, "get"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
    except OSError as exc:
        return CredentialLookup(None, f"{program} cannot run ({exc.strerror}); sent none")
    try:
        stdout, stderr = proc.communicate(server_url.encode(), timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.kill()
        proc.communicate()
        return CredentialLookup(None, f"{program} get did not answer within {timeout:g} s; sent none")
    if proc.returncode != 0:
        if b"credentials not found" in (stdout + stderr).lower():
            return CredentialLookup(None, f"{program} has no credentials for {server_url}; sent none")
        return CredentialLookup(None, f"{program} get failed (exit {proc.returncode}); sent none")
    try:
        doc = json.loads(stdout)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return CredentialLookup(None, f"{program} get printed no JSON object; sent none")
    username, secret = doc.get("Username"), doc.get("Secret")
    if not isinstance(secret, str) or not secret or not isinstance(username, str):
        # Register whatever secret-looking value there was before saying anything else.
        if isinstance(secret, str) and secret:
            log.register_secret(secret)
        return CredentialLookup(None, f"{program} get answered without a Username and Secret; sent none")
    creds = _remember(Credentials(username, secret, program))
    return CredentialLookup(creds, f"credentials from {program}")


def _from_auths(auths: object, host: str, where: str) -> CredentialLookup:
    if not isinstance(auths, dict):
        return CredentialLookup(None, f"no credentials for {host} in {where}; sent none")
    for key, entry in auths.items():
        if not isinstance(key, str) or not isinstance(entry, dict) or not _same_registry(key, host):
            continue
        username, password = entry.get("username") or "", entry.get("password") or ""
        encoded = entry.get("auth")
        if isinstance(encoded, str) and encoded:
            log.register_secret(encoded)
            try:
                username, _, password = base64.b64decode(encoded, validate=False).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return CredentialLookup(
                    None, f"auths[{key!r}].auth in {where} is not base64 'user:password'; sent none"
                )
        token = entry.get("identitytoken")
        if isinstance(token, str) and token:
            return CredentialLookup(
                _remember(Credentials("<token>", token, f"auths in {where}")), f"the identity token in auths in {where}"
            )
        if isinstance(password, str) and password:
            return CredentialLookup(
                _remember(Credentials(str(username), password, f"auths in {where}")),
                f"credentials from auths in {where}",
            )
    return CredentialLookup(None, f"no credentials for {host} in {where}; sent none")


def docker_credentials(host: str) -> CredentialLookup:
    """The credentials the Docker CLI would use for ``host``: credHelpers[host], else credsStore,
    else auths. Never raises; a missing or unreadable config means anonymous."""
    path = docker_config_path()
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        return CredentialLookup(None, f"no Docker config at {path}; sent none")
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not JSON"
        return CredentialLookup(None, f"cannot read {path} ({reason}); sent none")
    if not isinstance(config, dict):
        return CredentialLookup(None, f"{path} is not a JSON object; sent none")
    helpers = config.get("credHelpers")
    if isinstance(helpers, dict):
        for key, helper in helpers.items():
            if isinstance(key, str) and _same_registry(key, host):
                found = credential_helper_get(helper, _server_url(host))
                return CredentialLookup(found.credentials, f"credHelpers in {path}: {found.note}")
    store = config.get("credsStore")
    if store:
        found = credential_helper_get(store, _server_url(host))
        return CredentialLookup(found.credentials, f"credsStore in {path}: {found.note}")
    return _from_auths(config.get("auths"), host, str(path))


# --- where a token may come from -----------------------------------------------------------------

TOKEN_REALMS_VAR = "K3_TOKEN_REALMS"
# Docker Hub's registry names its token service on another host (Docker's token authentication
# specification, https://distribution.github.io/distribution/spec/auth/token/, and the realm
# registry-1.docker.io's 401 names): built in, so public images read without configuration.
BUILT_IN_REALMS = frozenset((hub, "auth.docker.io") for hub in DOCKER_HUB_HOSTS)


def configured_realms() -> frozenset[tuple[str, str]]:
    """$K3_TOKEN_REALMS: comma-separated ``registry=realm-host`` pairs (``host[:port]`` each)."""
    pairs = set()
    for entry in (e.strip() for e in os.environ.get(TOKEN_REALMS_VAR, "").split(",")):
        registry, sep, realm = entry.partition("=")
        if entry and (not sep or not registry.strip() or not realm.strip() or "/" in entry):
            raise ConfigError(f"${TOKEN_REALMS_VAR}: {entry!r} is not registry=realm-host (host[:port] each)")
        if entry:
            pairs.add((registry.strip().lower(), realm.strip().lower()))
    return frozenset(pairs)


def registry_url(host: str) -> str:
    """The registry's base URL: plain http for an insecure one, else https."""
    return f"{'http' if insecure(host) else 'https'}://{host}"


def realm_allowed(host: str, realm: str) -> bool:
    """Whether the registry ``host`` may send the tool to the token service at ``realm``: the
    registry's own origin (scheme, host and port), or a pair built in or configured in
    $K3_TOKEN_REALMS. A plain-http realm only for a registry that is itself spoken to over http:
    an https registry's realm on the same host and port but http is another (cleartext) service."""
    scheme = transport.origin(realm)[0]
    if scheme == "http" and not insecure(host):
        return False
    if transport.origin(realm) == transport.origin(registry_url(host)):
        return True
    netloc = urllib.parse.urlsplit(realm).netloc.lower()
    return (host.lower(), netloc) in BUILT_IN_REALMS | configured_realms()


# --- a 401's challenge ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """What to send after a 401: an Authorization header, or None when there is nothing better to
    send. ``note`` says why, in one line without the secret, for the refusal's message."""

    header: str | None
    note: str


def answer_challenge(challenge: str, lookup: CredentialLookup, host: str, sent: str | None) -> Answer:
    """Answer ``host``'s 401 challenge with ``lookup``'s credentials; ``sent`` is the Authorization
    header the refused request carried (basic credentials are not sent twice)."""
    creds = lookup.credentials
    scheme = challenge.split(" ", 1)[0].lower()
    if scheme == "basic":
        if creds is None or creds.identity_token:
            return Answer(
                None,
                lookup.note
                if creds is None
                else f"{lookup.note}: an identity token, but the registry asks for basic credentials; sent none",
            )
        if sent == f"Basic {creds.basic()}":  # already sent and refused
            return Answer(None, f"{lookup.note}: the registry refused them")
        return Answer(f"Basic {creds.basic()}", f"{lookup.note}: the registry refused them")
    if scheme != "bearer":
        return Answer(None, f"unsupported authentication challenge {scheme!r}")
    return _bearer(challenge, lookup, host)


def _bearer(challenge: str, lookup: CredentialLookup, host: str) -> Answer:
    """A token from the challenge's realm: anonymous, with basic credentials, or (an identity
    token) by OAuth2 refresh-token grant, as the Docker CLI does."""
    creds = lookup.credentials
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = params.pop("realm", None)
    if not realm:
        return Answer(None, "the registry's bearer challenge names no realm")
    realm_parts = urllib.parse.urlsplit(realm)
    if realm_parts.scheme not in ("http", "https"):
        return Answer(None, f"the registry's token realm is not http(s): {realm_parts.scheme!r}")
    if realm_parts.scheme == "http" and not insecure(host):
        return Answer(
            None, f"the registry's token realm http://{realm_parts.netloc} is plain http; asked nothing there"
        )
    if not realm_allowed(host, realm):
        return Answer(
            None,
            f"the registry's token realm {realm_parts.netloc} is not on {host}; asked nothing there "
            f"(an operator may allow it: {TOKEN_REALMS_VAR}={host}={realm_parts.netloc})",
        )
    # Credentials go to the token service only over https, or over http to an insecure registry's
    # own origin or another insecure host (loopback, $K3_INSECURE_REGISTRIES) it was allowed to name.
    may_send = creds is not None and (
        realm_parts.scheme == "https" or (insecure(host) and insecure(realm_parts.netloc))
    )
    sent = creds if may_send else None
    if creds is None:
        note = lookup.note
    elif sent is None:
        note = f"{lookup.note}: not sent to the token service {realm_parts.netloc} over plain http; sent none"
    else:
        note = f"{lookup.note}: the registry refused them"
    try:
        req, credential = _token_request(realm, params, sent)
        with transport.open_url(req, credential, timeout=60) as resp:
            doc = json.load(resp)
    except urllib.error.HTTPError as exc:
        return Answer(
            None,
            f"{lookup.note}: the token service {realm_parts.netloc} refused them (HTTP {exc.code})"
            if sent is not None
            else note,
        )
    except (OSError, ValueError):
        return Answer(None, f"the token service {realm_parts.netloc} gave no token")
    token = doc.get("token") or doc.get("access_token") if isinstance(doc, dict) else None
    if not isinstance(token, str) or not token:
        return Answer(None, f"the token service {realm_parts.netloc} gave no token")
    log.register_secret(token)
    return Answer(f"Bearer {token}", note)


def _token_request(
    realm: str, params: dict[str, str], sent: Credentials | None
) -> tuple[urllib.request.Request, str | None]:
    """The token service's request and its Authorization: a refresh-token grant for an identity
    token, else a GET with the challenge's parameters (and basic credentials when they may be sent)."""
    if sent is not None and sent.identity_token:
        form = {"grant_type": "refresh_token", "refresh_token": sent.secret, "client_id": "k3-builder"}
        form.update({k: v for k, v in params.items() if k in ("service", "scope")})
        post = urllib.request.Request(
            realm,
            data=urllib.parse.urlencode(form).encode(),
            method="POST",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        return post, None
    get = urllib.request.Request(f"{realm}?{urllib.parse.urlencode(params)}")
    return get, f"Basic {sent.basic()}" if sent is not None else None

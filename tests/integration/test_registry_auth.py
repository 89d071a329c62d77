"""Credentials against a registry that requires them (issue 14, part 3).

A registry of its own (Debian's docker-registry, htpasswd auth) on a free 127.0.0.1 port, a
credential helper ``docker-credential-k3test`` (a shell script speaking the Docker
credential-helper protocol) on PATH, and a DOCKER_CONFIG whose config.json has only
``credHelpers``, the way Docker Desktop, ``gh auth`` or the ECR/GCR helpers leave it. The tool's
registry client reads and writes with the helper's credentials; without the helper, or with a
wrong password, it gets 401 and says so in one line that holds no secret. A full build pushes to
that registry (buildx asks the same helper), attaches its SBOM and provenance, and
``build verify --registry`` passes."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from builder.engine.registry import OCI_MANIFEST, Registry, RegistryClient
from builder.errors import RegistryUnavailable
from tests.integration.conftest import LocalRegistry, cli

USER = "k3tester"
ARTIFACT = "application/vnd.k3.test.note+json"
PATH = os.environ["PATH"]  # as the session started: each setup puts its own helper dir before it


@dataclass
class AuthRegistry:
    host: str
    user: str
    password: str


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture(scope="module")
def auth_registry(tmp_path_factory):
    for tool in ("docker-registry", "htpasswd"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed; run ci/setup.sh (docker-registry, apache2-utils)")
    root = tmp_path_factory.mktemp("auth-registry")
    password = "k3-" + secrets.token_urlsafe(18)
    made = subprocess.run(["htpasswd", "-iBn", USER], input=password, capture_output=True, text=True, check=True)
    (root / "htpasswd").write_text(made.stdout)
    registry = LocalRegistry(root, htpasswd=root / "htpasswd")
    registry.start()
    try:
        assert _status(f"http://{registry.address}/v2/") == 401
        yield AuthRegistry(registry.address, USER, password)
    finally:
        registry.stop()
        _remove_local_images(f"{registry.address}/")


def _remove_local_images(prefix: str) -> None:
    """Images the engine pulled or tagged from the test registry (by their own reference only)."""
    out = subprocess.run(
        ["docker", "image", "ls", "--digests", "--format", "{{json .}}"], capture_output=True, text=True
    ).stdout
    for line in out.splitlines():
        img = json.loads(line)
        if not img.get("Repository", "").startswith(prefix):
            continue
        tag, digest = img.get("Tag"), img.get("Digest")
        ref = f"{img['Repository']}:{tag}" if tag and tag != "<none>" else f"{img['Repository']}@{digest}"
        subprocess.run(["docker", "image", "rm", "-f", ref], capture_output=True)


@dataclass
class HelperSetup:
    config_dir: Path
    bin_dir: Path
    env: dict  # for subprocesses: DOCKER_CONFIG and PATH with the helper


def _helper_setup(where: Path, registry: AuthRegistry, secret: str, install: bool = True) -> HelperSetup:
    config_dir, bin_dir = where / "docker-config", where / "bin"
    config_dir.mkdir(parents=True)
    bin_dir.mkdir()
    (config_dir / "config.json").write_text(json.dumps({"credHelpers": {registry.host: "k3test"}}))
    if install:
        helper = bin_dir / "docker-credential-k3test"
        answer = json.dumps({"ServerURL": registry.host, "Username": registry.user, "Secret": secret})
        helper.write_text(
            "#!/bin/sh\n# The Docker credential-helper protocol, for one registry.\n"
            'case "$1" in\n'
            f'  get) [ "$(cat)" = "{registry.host}" ] || {{ echo "credentials not found in native keychain"; exit 1; }}\n'
            f"       echo '{answer}' ;;\n"
            "  store|erase) cat >/dev/null ;;\n"
            "  list) echo '{}' ;;\n"
            "  *) exit 1 ;;\n"
            "esac\n"
        )
        helper.chmod(0o755)
    env = dict(os.environ, DOCKER_CONFIG=str(config_dir), PATH=f"{bin_dir}{os.pathsep}{PATH}")
    return HelperSetup(config_dir, bin_dir, env)


def _use(setup: HelperSetup, monkeypatch) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", setup.env["DOCKER_CONFIG"])
    monkeypatch.setenv("PATH", setup.env["PATH"])


def _push_tiny_image(host: str, repo: str, labels: dict[str, str] | None = None) -> tuple[str, str]:
    """A one-layer image (with ``labels``) pushed with the client's own transport: (name, manifest digest)."""
    reg = Registry(host)
    layer = b"k3 registry auth test layer " + secrets.token_bytes(8)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Labels": labels or {}},
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
        },
        sort_keys=True,
    ).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": reg.push_blob(repo, config),
            "size": len(config),
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": reg.push_blob(repo, layer),
                "size": len(layer),
            }
        ],
    }
    raw = json.dumps(manifest, sort_keys=True).encode()
    return f"{host}/{repo}", reg.push_manifest(repo, "v1", raw, OCI_MANIFEST)


def _assert_no_secret(registry: AuthRegistry, *texts: str) -> None:
    for text in texts:
        assert registry.password not in text


# -- the client ------------------------------------------------------------------------------------


def test_the_registry_really_requires_credentials(auth_registry):
    assert _status(f"http://{auth_registry.host}/v2/_catalog") == 401


def test_the_client_reads_and_writes_with_the_helpers_credentials(auth_registry, tmp_path, monkeypatch):
    _use(_helper_setup(tmp_path, auth_registry, auth_registry.password), monkeypatch)
    name, digest = _push_tiny_image(auth_registry.host, f"k3/auth-{secrets.token_hex(3)}")
    client = RegistryClient()
    assert client.serves(name, digest)
    client.attach(name, digest, ARTIFACT, b'{"note": "attached with helper credentials"}', {"org.k3.test": "1"})
    assert client.referrers(name, digest) == {ARTIFACT: b'{"note": "attached with helper credentials"}'}


@pytest.mark.parametrize("case", ["no helper on PATH", "wrong password"])
def test_without_good_credentials_it_is_a_one_line_401_with_no_secret(auth_registry, tmp_path, monkeypatch, case):
    good = _helper_setup(tmp_path / "good", auth_registry, auth_registry.password)
    _use(good, monkeypatch)
    name, digest = _push_tiny_image(auth_registry.host, f"k3/auth-{secrets.token_hex(3)}")
    wrong = "k3-wrong-" + secrets.token_urlsafe(12)
    bad = _helper_setup(tmp_path / "bad", auth_registry, wrong, install=case == "wrong password")
    _use(bad, monkeypatch)
    for attempt in (
        lambda c: c.resolve_digest(f"{name}@{digest}"),
        lambda c: c.attach(name, digest, ARTIFACT, b"{}", {}),
        lambda c: c.referrers(name, digest),
    ):
        with pytest.raises(RegistryUnavailable) as info:
            attempt(RegistryClient())
        msg = str(info.value)
        assert "HTTP 401" in msg and "\n" not in msg, msg
        assert (
            "docker-credential-k3test is not on PATH"
            if case == "no helper on PATH"
            else "credentials from docker-credential-k3test: the registry refused them"
        ) in msg, msg
        _assert_no_secret(auth_registry, msg)
        assert wrong not in msg


def test_docker_login_credentials_work_too(auth_registry, tmp_path, monkeypatch):
    """The old path: `docker login` writes auths[host].auth into DOCKER_CONFIG; the client uses it."""
    config_dir = tmp_path / "login-config"
    config_dir.mkdir()
    login = subprocess.run(
        [
            "docker",
            "--config",
            str(config_dir),
            "login",
            "--username",
            auth_registry.user,
            "--password-stdin",
            auth_registry.host,
        ],
        input=auth_registry.password,
        capture_output=True,
        text=True,
    )
    assert login.returncode == 0, login.stderr
    assert "auth" in json.loads((config_dir / "config.json").read_text())["auths"][auth_registry.host]
    monkeypatch.setenv("DOCKER_CONFIG", str(config_dir))
    name, digest = _push_tiny_image(auth_registry.host, f"k3/auth-{secrets.token_hex(3)}")
    assert RegistryClient().serves(name, digest)


# -- the whole pipeline ----------------------------------------------------------------------------


def _all_text(root: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(root.rglob("*")) if p.is_file())


def test_a_build_with_a_credential_helper_pushes_attaches_and_verifies(built, auth_registry, tmp_path):
    """buildx pushes with the helper's credentials (the engine asks the same helper), the tool
    attaches the SBOM and provenance with them, and `build verify --registry` reads them back."""
    smoke, _ = built
    work = smoke.copy(tmp_path / "work")
    setup = _helper_setup(tmp_path, auth_registry, auth_registry.password)
    env = dict(setup.env, K3_REGISTRY=auth_registry.host)
    rendered = cli("--matrix", str(work.matrix), "render", env=env)
    assert rendered.code == 0, rendered.err
    r = cli("--matrix", str(work.matrix), "--target", "smoke", env=env)
    assert r.code == 0, r.err[-3000:]
    ref = r.out.strip().splitlines()[-1]
    assert ref.startswith(f"{auth_registry.host}/{smoke.repository}@sha256:")
    verified = cli("--matrix", str(work.matrix), "verify", "--target", "smoke", "--registry", env=env)
    assert verified.code == 0, verified.out + verified.err
    assert "SBOM and provenance attached" in verified.out + verified.err

    # The same verification without the helper: the registry rows fail, each in one line, no secret.
    no_helper = dict(env, PATH=PATH)
    refused = cli("--matrix", str(work.matrix), "verify", "--target", "smoke", "--registry", env=no_helper)
    assert refused.code != 0
    said = refused.out + refused.err
    assert "HTTP 401" in said and "docker-credential-k3test is not on PATH" in said, said
    assert "Traceback" not in said
    _assert_no_secret(auth_registry, r.out, r.err, verified.out, verified.err, said, _all_text(work.root))

"""Fixtures on the real engine, registry, git and PyPI. What they create, they remove:
pushed manifests are deleted from the registry and local tags from the engine at teardown.
(The smoke base images are a machine-wide cache kept on purpose: making them takes ~80 s.)"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

REGISTRY = "127.0.0.1:5000"
BUILD = str(REPO / ".venv" / "bin" / "build")
MANIFEST_TYPES = ", ".join([
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
])


@dataclass
class Run:
    code: int
    out: str
    err: str


def cli(*args: str, cwd: Path | None = None, env: dict | None = None) -> Run:
    proc = subprocess.run([BUILD, *args], capture_output=True, text=True, cwd=cwd, env=env)
    return Run(proc.returncode, proc.stdout, proc.stderr)


def registry_digest(repository: str, reference: str) -> str | None:
    """Ask the registry itself (HTTP API v2), independently of the tool and of buildx."""
    req = urllib.request.Request(f"http://{REGISTRY}/v2/{repository}/manifests/{reference}", method="HEAD",
                                 headers={"Accept": MANIFEST_TYPES})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.headers["Docker-Content-Digest"]
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def delete_repository(repository: str) -> None:
    try:
        with urllib.request.urlopen(f"http://{REGISTRY}/v2/{repository}/tags/list", timeout=10) as resp:
            tags = json.load(resp).get("tags") or []
    except urllib.error.HTTPError:
        return
    for tag in tags:
        digest = registry_digest(repository, tag)
        if digest:
            req = urllib.request.Request(f"http://{REGISTRY}/v2/{repository}/manifests/{digest}", method="DELETE")
            try:
                urllib.request.urlopen(req, timeout=10).close()
            except urllib.error.HTTPError:
                pass
    subprocess.run(["docker", "image", "rm", "-f", f"{REGISTRY}/{repository}:smoke"], capture_output=True)


@dataclass
class Smoke:
    root: Path  # directory of the generated matrix: dockerfiles/, locks/, artifacts/ live here
    matrix: Path
    repository: str

    @property
    def record(self) -> Path:
        return self.root / "locks" / "smoke" / "image.json"

    def copy(self, dest: Path) -> "Smoke":
        """An independent checkout of the same target (same source repo, registry repository)."""
        dest.mkdir(parents=True)
        shutil.copy(self.matrix, dest / "matrix.yaml")
        for sub in ("dockerfiles", "locks"):
            if (self.root / sub).exists():
                shutil.copytree(self.root / sub, dest / sub)
        return Smoke(dest, dest / "matrix.yaml", self.repository)


@pytest.fixture(scope="session")
def smoke(tmp_path_factory) -> Smoke:
    """The smoke target made for this machine, rendered and locked (not yet built)."""
    root = tmp_path_factory.mktemp("smoke")
    repository = f"k3/smoke-test-{secrets.token_hex(3)}"
    made = cli("smoke-init", "--out", str(root), "--registry", REGISTRY, "--repository", repository)
    assert made.code == 0, made.err
    matrix = Path(made.out.strip().splitlines()[-1])
    for args in (("render",), ("lock", "--target", "smoke")):
        r = cli("--matrix", str(matrix), *args)
        assert r.code == 0, r.err
    yield Smoke(root, matrix, repository)
    delete_repository(repository)


@pytest.fixture(scope="session")
def built(smoke) -> tuple[Smoke, str]:
    """The smoke target built once and pushed: (smoke, printed image reference)."""
    r = cli("--matrix", str(smoke.matrix), "--target", "smoke")
    assert r.code == 0, r.err[-3000:]
    return smoke, r.out.strip().splitlines()[-1]

"""Fixtures on the real engine, registry, git and PyPI. What they create, they remove:
pushed manifests are deleted from the registry and local tags from the engine at teardown.
(The smoke base images are a machine-wide cache kept on purpose: making them takes ~80 s.)"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

REGISTRY = "127.0.0.1:5000"
BUILD = str(REPO / ".venv" / "bin" / "build")
MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    ]
)


@dataclass
class Run:
    code: int
    out: str
    err: str


def cli(*args: str, cwd: Path | None = None, env: dict | None = None) -> Run:
    proc = subprocess.run([BUILD, *args], capture_output=True, text=True, cwd=cwd, env=env)
    return Run(proc.returncode, proc.stdout, proc.stderr)


# Variant images are independent: built and checked side by side. Most of a `build test` is
# waiting on `docker exec` round trips, so a few at a time fill the machine's cores (CI has two).
WORKERS = max(2, min(4, (os.cpu_count() or 2) + 1))


def side_by_side(calls: dict[str, Callable[[], object]]) -> dict[str, object]:
    """Run independent calls WORKERS at a time; their results by name (the first error raises)."""
    with ThreadPoolExecutor(WORKERS) as pool:
        futures = {name: pool.submit(call) for name, call in calls.items()}
        return {name: future.result() for name, future in futures.items()}


def variant_images(ref: str, bodies: dict[str, str], suffix: str, context: Path | None = None) -> dict[str, str]:
    """One image per body (Dockerfile lines after ``FROM ref``), tagged ``k3-check-variant:NAME-SUFFIX``,
    built side by side into the engine (``context``, when given, is the shared build context)."""

    def make(name: str, body: str) -> Callable[[], str]:
        def build() -> str:
            tag = f"k3-check-variant:{name}-{suffix}"
            dockerfile = f"FROM {ref}\n{body}\n"
            where = ["-f", "-", str(context)] if context else ["-"]
            subprocess.run(
                ["docker", "buildx", "build", "--load", "-q", "-t", tag, *where],
                input=dockerfile,
                text=True,
                capture_output=True,
                check=True,
            )
            return tag

        return build

    return side_by_side({name: make(name, body) for name, body in bodies.items()})  # type: ignore[return-value]


def check_images(matrix: Path, tags: dict[str, str], *extra: str) -> dict[str, Run]:
    """`build test --image TAG` for each variant, side by side; the runs by name."""
    calls = {
        name: (lambda tag=tag: cli("--matrix", str(matrix), "test", "--target", "smoke", *extra, "--image", tag))
        for name, tag in tags.items()
    }
    return side_by_side(calls)  # type: ignore[return-value]


def registry_digest(repository: str, reference: str) -> str | None:
    """Ask the registry itself (HTTP API v2), independently of the tool and of buildx."""
    req = urllib.request.Request(
        f"http://{REGISTRY}/v2/{repository}/manifests/{reference}", method="HEAD", headers={"Accept": MANIFEST_TYPES}
    )
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


class LocalRegistry:
    """Debian's docker-registry on a free 127.0.0.1 port, with its own storage (deletes enabled),
    optionally behind htpasswd auth; a test or the attack script may stop and start it."""

    def __init__(self, root: Path, htpasswd: Path | None = None) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.address = f"127.0.0.1:{s.getsockname()[1]}"
        auth = f"auth:\n  htpasswd:\n    realm: k3-test\n    path: {htpasswd}\n" if htpasswd else ""
        name = self.address.replace(":", "-")
        self.config = root / f"{name}.yml"
        self.config.write_text(
            f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: "
            f"{root / name}\n  delete:\n    enabled: true\nhttp:\n  addr: {self.address}\n{auth}"
        )
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["docker-registry", "serve", str(self.config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for _ in range(200):
            try:
                urllib.request.urlopen(f"http://{self.address}/v2/", timeout=1).close()
                return
            except urllib.error.HTTPError:
                return  # 401: up, and asking for credentials
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"the registry on {self.address} did not start")

    def stop(self) -> None:
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@dataclass
class Smoke:
    root: Path  # directory of the generated matrix: dockerfiles/, locks/, artifacts/ live here
    matrix: Path
    repository: str

    @property
    def record(self) -> Path:
        return self.root / "locks" / "smoke" / "image.json"

    def copy(self, dest: Path) -> Smoke:
        """An independent checkout of the same target (same source repo, registry repository)."""
        dest.mkdir(parents=True)
        shutil.copy(self.matrix, dest / "matrix.yaml")
        for sub in ("dockerfiles", "locks"):
            if (self.root / sub).exists():
                shutil.copytree(self.root / sub, dest / sub)
        return Smoke(dest, dest / "matrix.yaml", self.repository)

    def variant(self, dest: Path, tag: str, change: Callable[[str], str] = lambda text: text) -> Smoke:
        """A copy whose matrix text went through ``change``, under an image tag of its own (the
        shared ``smoke`` tag is left alone), rendered."""
        work = self.copy(dest)
        text = change(work.matrix.read_text())
        assert text.count("tag: smoke") == 1, "the variant's matrix lost its tag line"
        work.matrix.write_text(text.replace("tag: smoke", f"tag: {tag}"))
        rendered = cli("--matrix", str(work.matrix), "render")
        assert rendered.code == 0, rendered.err
        return work


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

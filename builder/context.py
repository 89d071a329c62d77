"""The build context, assembled on the host: locks, a hash-checked wheelhouse, the interpreter.

Everything the build stage installs is downloaded here, outside the engine: the host verifies
each file against the lock's sha256 (pip --require-hashes) or the matrix's (the CPython tarball),
so RUN steps need no network and no certificates, and the build is hermetic. Every file's mtime
is set to SOURCE_DATE_EPOCH so the context, like the source export, is a pure function of inputs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

from builder import contract
from builder.errors import LockError
from builder.fsutil import atomic_write, cache_dir, clamp_mtimes, sha256_file
from builder.lock import hermetic_env
from builder.matrix import Target


# Rewrites the relocated CPython's build-time prefix and compiler (see the script's docstring).
RELOCATE_SCRIPT = Path(__file__).with_name("templates") / "relocate_python.py"


def _wheelhouse(target: Target, lock: Path) -> Path:
    """Download the lock's files into a cache keyed by the lock's own hash; reuse when complete."""
    key = sha256_file(lock)
    dest = cache_dir() / "wheelhouse" / key
    done = dest / ".complete"
    if done.exists():
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    partial = dest.with_name(dest.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    py = target.python.version
    index, *extra = target.lock_indexes()
    cmd = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
        "--only-binary=:all:", "--implementation", "cp", "--python-version", py,
        "--abi", "cp" + py.replace(".", ""), "--dest", str(partial), "--index-url", index,
    ]
    for url in extra:
        cmd += ["--extra-index-url", url]
    for platform in target.python.wheel_platforms():
        cmd += ["--platform", platform]
    cmd += ["-r", str(lock)]
    proc = subprocess.run(cmd, env=hermetic_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise LockError(
            f"{lock}: downloading the locked wheels failed: {lines[-1] if lines else proc.returncode} "
            "(a hash mismatch means the index changed a file; re-run `build lock`)"
        )
    (partial / ".complete").write_text(key + "\n")
    partial.rename(dest)
    return dest


def _copy_tree(src: Path, dest: Path) -> None:
    """Copy (a reflink where the filesystem can) the cache entry: the context's mtimes are then
    clamped, and an edit under artifacts/ must never reach the shared cache (no hard links)."""
    dest.mkdir(parents=True, exist_ok=True)
    items = [str(item) for item in sorted(src.iterdir()) if not item.name.startswith(".")]
    if items:
        subprocess.run(["cp", "--reflink=auto", *items, str(dest)], check=True)


def _standalone_python(target: Target) -> Path:
    spec = target.python.standalone
    assert spec is not None
    dest = cache_dir() / "python" / f"{spec.sha256}.tar.gz"
    if dest.exists() and sha256_file(dest) == spec.sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".partial")
    try:
        with urllib.request.urlopen(spec.url, timeout=120) as resp, tmp.open("wb") as out:  # noqa: S310
            shutil.copyfileobj(resp, out)
    except OSError as exc:
        raise LockError(f"{target.name}: cannot download python.standalone.url: {exc}") from None
    got = sha256_file(tmp)
    if got != spec.sha256:
        tmp.unlink()
        raise LockError(f"{target.name}: python.standalone sha256 mismatch: matrix {spec.sha256}, downloaded {got}")
    tmp.rename(dest)
    return dest


def assemble(target: Target, locks_dir: Path, dest: Path, epoch: int) -> Path:
    """Build the default context at ``dest``: the two locks, wheelhouse/{runtime,build}, python/."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for name, sub in ((contract.LOCK_NAME, "runtime"), (contract.BUILD_LOCK_NAME, "build")):
        lock = locks_dir / name
        shutil.copyfile(lock, dest / name)
        _copy_tree(_wheelhouse(target, lock), dest / "wheelhouse" / sub)
    if target.python.provider == "standalone":
        (dest / "python").mkdir()
        shutil.copyfile(_standalone_python(target), dest / "python" / "cpython.tar.gz")
        shutil.copyfile(RELOCATE_SCRIPT, dest / "python" / "relocate.py")
    atomic_write(dest / ".dockerignore", "")  # the context is already exactly what the build reads
    clamp_mtimes(dest, epoch)
    return dest

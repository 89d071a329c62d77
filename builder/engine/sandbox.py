"""The sandbox where the tool runs code an untrusted tree wrote: the kernel plan's ``cmake -P`` of
upstream's ``cmake/utils.cmake`` functions (issue 49). Upstream CMake never runs on the build host.

The sandbox is a container, on the engine the build uses anyway, of an image made here from the
tool's own pinned cmake (the ``cmake`` wheel of ci/requirements.lock: its binary, its ``Modules``,
and the host libraries that binary needs, nothing else): no image is pulled, so it works where
only PyPI is reachable, and the image is named by the digest of what it holds, made once per
machine. The container has no network, a read-only root, no capability, ``no-new-privileges``,
user 65534, bounded pids, memory and CPU, and no file of the host: the script arrives on stdin
(``cmake -P /dev/stdin``). It runs with a timeout and its output capped. No engine: exit 3; the
plan is then not computed rather than run on the host.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import subprocess
import tarfile
import uuid
from pathlib import Path

from builder.config import contract
from builder.engine.containers import Ran, run_capped
from builder.errors import BuildError, EngineUnavailable

REPOSITORY = "k3-cmake-sandbox"
ROOT = "/cmake"  # where the wheel's data directory (bin/, share/cmake-X.Y/Modules) sits in the image
USER = "65534:65534"
LIMITS = ["--pids-limit", "64", "--memory", "512m", "--cpus", "1"]
_LDD = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x")


def _libraries(binary: Path) -> list[Path]:
    """The host libraries ``binary`` (the tool's own pinned cmake) loads, its loader included."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=30).stdout
    return sorted({Path(m.group(1)) for m in map(_LDD.search, out.splitlines()) if m})


def _members(data: Path) -> list[tuple[str, Path]]:
    """(path in the image, host file) of everything the sandbox image holds."""
    binary = data / "bin" / "cmake"
    found = [(f"{ROOT}/bin/cmake", binary)]
    for share in sorted((data / "share").glob("cmake-*")):
        for path in sorted((share / "Modules").rglob("*")):
            if path.is_file() and not path.is_symlink():
                found.append((f"{ROOT}/share/{share.name}/Modules/{path.relative_to(share / 'Modules')}", path))
    found += [(str(lib), lib.resolve()) for lib in _libraries(binary)]
    return found


def _tar(members: list[tuple[str, Path]]) -> tuple[bytes, str]:
    """The image's root file system as a tar, and the digest that names it (its members and bytes)."""
    raw, digest = io.BytesIO(), hashlib.sha256()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, path in members:
            data = path.read_bytes()
            digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
            info = tarfile.TarInfo(name.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), 0o755 if "/bin/" in name or ".so" in name else 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue(), digest.hexdigest()[:16]


class CMakeSandbox:
    """``cmake -P`` of a script in the sandbox container; made from the wheel's data dir ``cmake_data``."""

    def __init__(self, docker_cmd: list[str], cmake_data: Path) -> None:
        self._cli, self._data, self._image = docker_cmd, cmake_data, ""

    def _run(self, args: list[str], what: str, data: bytes | None = None) -> subprocess.CompletedProcess:
        try:
            proc = subprocess.run([*self._cli, *args], input=data, capture_output=True, timeout=600)
        except FileNotFoundError:
            raise EngineUnavailable("docker CLI not found; the kernel plan runs CMake only in a container") from None
        if proc.returncode != 0:
            err = proc.stderr.decode("utf-8", "replace").strip()
            down = "cannot connect to the docker daemon" in err.lower() or "is the docker daemon running" in err
            kind = EngineUnavailable if down else BuildError
            raise kind(f"{what}: {err.splitlines()[-1][:300] if err else 'exit ' + str(proc.returncode)}")
        return proc

    def image(self) -> str:
        """The sandbox image, imported into the engine the first time (named by its content)."""
        if not self._image:
            tar, digest = _tar(_members(self._data))
            tag = f"{REPOSITORY}:{digest}"
            known = subprocess.run([*self._cli, "image", "inspect", tag], capture_output=True, timeout=120)
            if known.returncode != 0:
                self._run(["version", "--format", "{{.Server.Version}}"], "the kernel plan's sandbox needs the engine")
                self._run(["image", "import", "-", tag], f"cannot make the sandbox image {tag}", tar)
            self._image = tag
        return self._image

    def run(self, script: bytes, timeout: float) -> Ran:
        """Run ``script`` with the sandbox's cmake (-P, from stdin); killed after ``timeout`` seconds."""
        image, name = self.image(), f"k3-cmake-{uuid.uuid4().hex[:12]}"
        argv = [*self._cli, "run", "-i", "--rm", "--name", name, "--network", "none", "--read-only"]
        argv += ["--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--user", USER, *LIMITS]
        argv += ["--label", f"{contract.CONTAINER_LABEL}={os.getpid()}", "--workdir", "/"]
        argv += ["--entrypoint", f"{ROOT}/bin/cmake"]
        ran = run_capped([*argv, image, "-P", "/dev/stdin"], timeout, stdin=script)
        if ran.timed_out:
            subprocess.run([*self._cli, "rm", "-f", name], capture_output=True, timeout=120)
        return ran

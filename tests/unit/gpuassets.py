"""Real GPU binaries for the GPU-code tests, fetched once into ~/.cache/k3-builder/gpu (PyPI):
NVRTC 12.9 (CUDA C++ -> cubin/PTX through ctypes, no GPU needed), cuobjdump 13.x (the
cross-check), NCCL 2.30.7 (built with CUDA 12.9), members of vLLM 0.30.0's CUDA 13 wheel read with
HTTP range requests (the wheel is 315 MB; only its central directory and one member are fetched),
and nvcc 13 where this machine has /usr/local/cuda-13.0. A test that needs one skips, saying
why, only when PyPI (or the toolkit) is not there.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from functools import cache
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "k3-builder" / "gpu"
PYPI = "https://pypi.org/pypi/{name}/json"
NVCC13 = Path("/usr/local/cuda-13.0/bin/nvcc")
KERNEL = 'extern "C" __global__ void k3(float *x) { x[threadIdx.x] *= 2.0f; }\n'


def _skip_offline(what: str, exc: Exception) -> None:
    pytest.skip(f"PyPI unreachable for {what}: {type(exc).__name__}: {exc}"[:200])


@cache
def wheel(name: str, version: str) -> Path:
    """The unpacked wheel ``name==version`` (pip download --no-deps), cached."""
    out = CACHE / f"{name}-{version}"
    if (out / ".done").exists():
        return out
    dl = CACHE / "downloads"
    dl.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PIP_CONFIG_FILE": "/dev/null", "PIP_FIND_LINKS": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", f"{name}=={version}", "-d", str(dl)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if proc.returncode:
        _skip_offline(f"{name}=={version}", RuntimeError(proc.stderr.strip().splitlines()[-1:]))
    stem = name.replace("-", "_")
    (whl,) = [p for p in dl.glob("*.whl") if p.name.lower().startswith(f"{stem}-{version}-".lower())]
    shutil.rmtree(out, ignore_errors=True)
    with zipfile.ZipFile(whl) as zf:
        zf.extractall(out)
    for path in out.rglob("*"):
        if path.is_file() and ("/bin/" in str(path) or ".so" in path.name):
            path.chmod(0o755)
    (out / ".done").write_text("")
    return out


def _get(url: str, start: int | None = None, end: int | None = None) -> bytes:
    headers = {"Range": f"bytes={start}-{end - 1}"} if start is not None and end is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=120) as resp:
            return resp.read()
    except (urllib.error.URLError, OSError) as exc:
        _skip_offline(url, exc)
        raise


def wheel_member(name: str, version: str, filename_part: str, member: str) -> Path:
    """One member of a PyPI wheel, fetched with range requests (the zip's end record, its central
    directory, the member's local header and data), cached."""
    out = CACHE / f"{name}-{version}-members" / member
    if out.exists():
        return out
    base = PYPI.format(name=name)
    doc = json.loads(_get(base))
    (entry,) = [u for u in doc["releases"][version] if filename_part in u["filename"]]
    url, size = urllib.parse.urljoin(base, entry["url"]), entry["size"]
    tail = _get(url, size - 65536 - 22, size)
    at = tail.rfind(b"PK\x05\x06")
    cd_size, cd_off = struct.unpack_from("<II", tail, at + 12)
    central = _get(url, cd_off, cd_off + cd_size)
    pos = 0
    while central[pos : pos + 4] == b"PK\x01\x02":
        method, csize, usize = (
            struct.unpack_from("<H", central, pos + 10)[0],
            *struct.unpack_from("<II", central, pos + 20),
        )
        nlen, elen, clen = struct.unpack_from("<HHH", central, pos + 28)
        offset = struct.unpack_from("<I", central, pos + 42)[0]
        if central[pos + 46 : pos + 46 + nlen].decode() == member:
            local = _get(url, offset, offset + 30)
            start = offset + 30 + sum(struct.unpack_from("<HH", local, 26))
            data = _get(url, start, start + csize)
            raw = zlib.decompress(data, -15) if method == 8 else data
            assert len(raw) == usize, f"{member}: {len(raw)} bytes, the central directory says {usize}"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(raw)
            return out
        pos += 46 + nlen + elen + clen
    raise AssertionError(f"{member} is not in {entry['filename']}")


def cuobjdump() -> Path:
    return wheel("nvidia-cuda-cuobjdump", "13.5.37") / "nvidia" / "cu13" / "bin" / "cuobjdump"


def listed(path: Path) -> list[str]:
    """cuobjdump --list-elf --list-ptx: the (kind, arch) of every entry, e.g. "ELF sm_90a"."""
    proc = subprocess.run([str(cuobjdump()), "--list-elf", "--list-ptx", str(path)], capture_output=True, text=True)
    return [
        f"{m.group(1)} {m.group(2)}"
        for m in re.finditer(r"^(ELF|PTX) file\s+\d+: .*\.(sm_\w+)\.(?:cubin|ptx)$", proc.stdout, re.M)
    ]


@cache
def _nvrtc():
    lib = wheel("nvidia-cuda-nvrtc-cu12", "12.9.86") / "nvidia" / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"
    return ctypes.CDLL(str(lib))


def nvrtc(arch: str, ptx: bool = False) -> bytes:
    """Compile KERNEL with NVRTC 12.9 for ``arch`` (sm_90a, compute_90): the cubin or PTX text."""
    lib, prog = _nvrtc(), ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), KERNEL.encode(), b"k3.cu", 0, None, None) == 0
    opts = (ctypes.c_char_p * 1)(f"--gpu-architecture={arch}".encode())
    assert lib.nvrtcCompileProgram(prog, 1, opts) == 0, f"NVRTC could not compile for {arch}"
    size = ctypes.c_size_t()
    get_size, get = (lib.nvrtcGetPTXSize, lib.nvrtcGetPTX) if ptx else (lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN)
    assert get_size(prog, ctypes.byref(size)) == 0
    buf = ctypes.create_string_buffer(size.value)
    assert get(prog, buf) == 0
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return buf.raw.rstrip(b"\0") if ptx else buf.raw


# nvcc's -fatbin output, by file name and arguments: the same bytes whatever the directory (checked:
# two compiles in two directories are byte-equal), and a compile costs a second or more of CPU; five
# tests ask for one fatbin and seven for another. A host object (-shared) is not the same bytes twice.
_FATBINS: dict[tuple[str, ...], tuple[bytes, int]] = {}


def nvcc13(out: Path, *args: str) -> Path:
    """Run nvcc 13 on KERNEL (plus a host launcher) into ``out``; skip where the toolkit is absent.
    A fatbin compiled before in this session is written again from its bytes, not compiled again."""
    if not NVCC13.exists():
        pytest.skip(f"no CUDA 13 toolkit at {NVCC13.parent.parent}")
    src = out.with_suffix(".cu")
    src.write_text(KERNEL + "void k3_launch(float *x) { k3<<<1, 32>>>(x); }\n")
    key = (out.name, *args)
    if key in _FATBINS:
        data, mode = _FATBINS[key]
        out.write_bytes(data)
        out.chmod(mode)
        return out
    subprocess.run([str(NVCC13), *args, str(src), "-o", str(out)], check=True, capture_output=True, timeout=600)
    if "-fatbin" in args:
        _FATBINS[key] = (out.read_bytes(), out.stat().st_mode & 0o7777)
    return out

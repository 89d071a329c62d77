"""Which Python distributions belong to a CUDA major: one rule for the image check and the lock
rehearsal, so what the rehearsal flags on PyPI is exactly what the image check would fail."""

from __future__ import annotations

import re
from typing import overload

from builder.config.names import normalize

# CUDA 13's wheels dropped the -cuNN suffix. Some keep the CUDA version as their own version
# (cuda-toolkit, nvidia-cuda-runtime, nvidia-cublas, ...: 13.x); PyPI's torch 2.13/2.14 pull these
# in. Others carry a library version (cufft 12.x, curand 10.x, cusparse 12.x, cufile 1.x) and
# exist unsuffixed only from CUDA 13 on (PyPI: first real releases with CUDA 13.0): for those the
# name alone says CUDA 13.
_TRACKS_CUDA = re.compile(
    r"cuda-toolkit|nvidia-cuda-[a-z-]+|nvidia-cublas|nvidia-nvjitlink|nvidia-nvtx"
    r"|cuda-bindings|cuda-python"
)
_CUDA13_ONLY = re.compile(
    r"nvidia-cufft|nvidia-curand|nvidia-cusolver|nvidia-cusparse|nvidia-cufile|nvidia-npp"
    r"|nvidia-nvjpeg"
)
_SUFFIX = re.compile(r"-cu(\d+)(?:-|$)")


@overload
def major_minor(version: str) -> str: ...
@overload
def major_minor(version: None) -> None: ...
def major_minor(version: str | None) -> str | None:
    """12.9.1 -> 12.9: the one place a CUDA version is cut to major.minor."""
    return ".".join(version.split(".")[:2]) if version else None


def _major(digits: str) -> int:
    # cu12 -> 12, cu129 -> 12, cu130 -> 13 (the last digit of a three-digit tag is the minor).
    return int(digits[:-1]) if len(digits) >= 3 else int(digits)


def cuda_major_of(name: str, version: str) -> int | None:
    """The CUDA major a distribution is built for, when its name or version says so."""
    norm = normalize(name)
    m = _SUFFIX.search(norm)
    if m:  # nvidia-nccl-cu12, nvidia-cutlass-dsl-libs-cu13
        return _major(m.group(1))
    lm = re.fullmatch(r"cu(\d+)", version.partition("+")[2])
    if lm:  # torch 2.13.0+cu129 -> 12, flashinfer-jit-cache 0.6.18.post1+cu130 -> 13
        return _major(lm.group(1))
    major = version.split(".")[0]
    if not major.isdigit() or major == "0":  # placeholder releases (0.0.1.dev)
        return None
    if _TRACKS_CUDA.fullmatch(norm):
        return int(major)
    if _CUDA13_ONLY.fullmatch(norm):
        return 13
    return None


def is_other_major(name: str, version: str, major: int) -> bool:
    found = cuda_major_of(name, version)
    return found is not None and found != major

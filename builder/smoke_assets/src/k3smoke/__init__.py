"""Stand-in for vLLM: imports its compiled kernels the way vLLM imports its extensions."""

import ctypes
import importlib.util
import os
from importlib.metadata import version


def _load_global_deps() -> None:
    """Load libcudart.so.12 from nvidia-cuda-runtime-cu12 before _C, whose NEEDED entry names it
    and which has no RPATH or RUNPATH: torch does this for vLLM's extensions (torch/__init__.py,
    _load_global_deps). Without the wheel, the loader's own search decides, and says what it missed.
    """
    spec = importlib.util.find_spec("nvidia.cuda_runtime")
    for location in (spec.submodule_search_locations or []) if spec else []:
        lib = os.path.join(location, "lib", "libcudart.so.12")
        if os.path.exists(lib):
            ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
            return


_load_global_deps()

from k3smoke import _C  # noqa: E402,F401  (a missing compiled module, libcudart or libcuda.so.1 fails here)

__version__ = version("k3smoke")


def rms(values):
    return _C.rms([float(v) for v in values])

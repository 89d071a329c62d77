"""Stand-in for vLLM: imports its compiled kernels the way vLLM imports its extensions."""

from importlib.metadata import version

from k3smoke import _C  # noqa: F401  (a missing compiled module, or no libcuda.so.1, fails here)

__version__ = version("k3smoke")


def rms(values):
    return _C.rms([float(v) for v in values])

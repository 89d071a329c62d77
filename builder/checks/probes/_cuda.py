# Prepended (after _report.py) to the probes that find CUDA libraries in the image and ask them what
# they are (probes.PRELUDES): facts.py and loaded.py read the same files the same way.
import ctypes as _ctypes
import os as _cos

PSEUDO = ("/proc", "/sys", "/dev")  # kernel views, not the image's files
# Where the search for CUDA runtimes starts: the container's whole file system. (The unit tests run
# the probes on the host, whose / is a whole machine: they start it at a directory of their own.)
SCAN_ROOT = "/"


def image_files(prefixes):
    """Every path under / whose file name starts with one of ``prefixes``, links included."""
    for top, dirs, files in _cos.walk(SCAN_ROOT):
        if top in PSEUDO:
            dirs[:] = []
            continue
        for name in files:
            if name.startswith(prefixes):
                yield _cos.path.join(top, name)


def mapped_files():
    """The files this process has mapped (/proc/self/maps): what it really loaded."""
    with open("/proc/self/maps") as fh:
        return sorted({line.split(None, 5)[5].strip() for line in fh if len(line.split(None, 5)) == 6})


def runtime_version(path):
    """What the CUDA runtime (libcudart) or NVRTC (libnvrtc) at ``path`` reports, as major*1000 +
    minor*10, or the call's non-zero status as a string; raises OSError when the file does not load,
    AttributeError when it lacks the call. Loading it maps it into this process."""
    lib = _ctypes.CDLL(path)
    if "libnvrtc" in _cos.path.basename(path):
        major, minor = _ctypes.c_int(), _ctypes.c_int()
        rc = lib.nvrtcVersion(_ctypes.byref(major), _ctypes.byref(minor))
        return major.value * 1000 + minor.value * 10 if rc == 0 else f"nvrtcVersion returned {rc}"
    value = _ctypes.c_int()
    rc = lib.cudaRuntimeGetVersion(_ctypes.byref(value))
    return value.value if rc == 0 else f"cudaRuntimeGetVersion returned {rc}"

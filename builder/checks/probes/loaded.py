"""Probe: what the app's process really maps, and every copy of a CUDA runtime in the image.

Run with the image's own Env (the container's). Imports the modules the entrypoint and the
source's package bring in (an audit hook records, report-only, what those imports do besides
importing: network connects, writes outside /tmp, subprocesses), then reads /proc/self/maps:
the libcudart and libnccl files mapped (libnccl's version from ncclGetVersion). Then, in forked
children (so nothing more is mapped here), the version every libcudart (cudaRuntimeGetVersion)
and libnvrtc (nvrtcVersion) in the image reports. And the search paths of the config: each
PYTHONPATH, LD_LIBRARY_PATH and LD_PRELOAD entry, whether it exists, and what it shadows: a
top-level module a PYTHONPATH entry holds that an application sys.path directory also holds; a
library an LD_LIBRARY_PATH entry holds under a soname a file under the roots also has (the values
are the config's, from the request: the check adds the compat driver directory to the process's
own). Request: {"argv": [...], "package": "...", "roots": [...], "env": {...}}.
"""

import ctypes
import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time _report.py, _cuda.py, _dyn.py and _fork.py are prepended
    from builder.checks.probes._cuda import image_files, mapped_files, runtime_version
    from builder.checks.probes._dyn import elf_files
    from builder.checks.probes._fork import in_child
    from builder.checks.probes._report import report

RUNTIMES = ("libcudart.so", "libnvrtc.so")


def copies():
    return {
        path: in_child(runtime_version, path)
        for path in image_files(RUNTIMES)
        if not os.path.islink(path) and ".so." in os.path.basename(path) + "."
    }


def search_paths(roots, env):
    sonames: dict[str, str] = {}
    for path, dyn in elf_files(roots):
        sonames.setdefault(dyn["soname"] or os.path.basename(path), path)
    app_sites = [p for p in sys.path if any(p.startswith(r + "/") for r in roots) and os.path.isdir(p)]
    app_tops = {n.split(".")[0] for s in app_sites for n in os.listdir(s)}
    out: dict[str, dict[str, Any]] = {}
    for var in ("PYTHONPATH", "LD_LIBRARY_PATH", "LD_PRELOAD"):
        sep = ":" if var != "LD_PRELOAD" else None
        raw = env.get(var, "")
        for entry in [e for e in (raw.split(sep) if sep else raw.replace(":", " ").split()) if e]:
            found: dict[str, Any] = {"var": var, "exists": os.path.exists(entry), "shadows": []}
            if found["exists"] and var == "PYTHONPATH" and not any(entry.startswith(r + "/") for r in roots):
                names = {n.split(".")[0] for n in os.listdir(entry)} if os.path.isdir(entry) else set()
                found["shadows"] = sorted(n for n in names & app_tops if not n.startswith(("_", "__")))
            elif found["exists"] and var == "LD_LIBRARY_PATH" and os.path.isdir(entry):
                here = [n for n in os.listdir(entry) if n in sonames and sonames[n] != os.path.join(entry, n)]
                found["shadows"] = sorted(f"{n} ({sonames[n]})" for n in here)
            elif found["exists"] and var == "LD_PRELOAD":
                found["shadows"] = ["every library loaded after it"]
            out.setdefault(var, {})[entry] = found
    return out


def entry_modules(argv, package):
    """What the entrypoint imports: the module after ``-m``, or the module of the console script
    it runs; and the source's own package."""
    found = [argv[argv.index("-m") + 1]] if "-m" in argv[:-1] else []
    if argv and not found:
        import importlib.metadata as md

        name = os.path.basename(argv[0])
        eps = [e for e in md.entry_points(group="console_scripts") if e.name == name]
        found += [eps[0].value.partition(":")[0].strip()] if eps else []
    return found + ([package] if package and package not in found else [])


SIDE_EFFECTS: list = []
RECORDING = [True]
SPAWNS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.startfile")


def audit(event, args):
    """Report-only: what the app's imports do besides importing (network, writes, processes)."""
    if not RECORDING[0] or len(SIDE_EFFECTS) >= 50:
        return
    if event == "socket.connect":
        SIDE_EFFECTS.append(["connect", repr(args[1])[:200]])
    elif event in SPAWNS:
        SIDE_EFFECTS.append(["subprocess", repr(args[:2])[:200]])
    elif event == "open" and isinstance(args[0], str) and not args[0].startswith(("/tmp/", "/dev/", "/proc/")):
        mode, flags = args[1], args[2] if len(args) > 2 else 0
        writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(flags & (os.O_WRONLY | os.O_RDWR))
        if writes:
            SIDE_EFFECTS.append(["write", args[0][:200]])


def main(req):
    out: dict[str, Any] = {"imports": {}, "side_effects": SIDE_EFFECTS}
    sys.addaudithook(audit)
    for name in entry_modules(req["argv"], req.get("package")):
        try:
            importlib.import_module(name)
            out["imports"][name] = None
        except BaseException as exc:  # noqa: BLE001
            out["imports"][name] = f"{type(exc).__name__}: {exc}"[:300]
    RECORDING[0] = False
    maps = mapped_files()
    out["cudart"] = sorted({os.path.realpath(p) for p in maps if "/libcudart.so" in p})
    out["nccl"] = {}
    for path in sorted({os.path.realpath(p) for p in maps if "/libnccl.so" in p}):
        v = ctypes.c_int()
        rc = ctypes.CDLL(path).ncclGetVersion(ctypes.byref(v))
        out["nccl"][path] = v.value if rc == 0 else f"ncclGetVersion returned {rc}"
    out["copies"] = copies()
    out["paths"] = search_paths(req["roots"], req.get("env") or {})
    return out


if __name__ == "__main__":
    report(main)

"""Probe: the facts most checks share (libraries, distributions, modules, ops, torch).

One process, because ops are registered by importing the compiled modules first. Every fact
is gathered under its own guard and a failed one is recorded in ``errors`` under its key: a
libcudart without cudaRuntimeGetVersion, say, fails only the CUDA runtime check, with what was
found. Run with the compat driver library on the path (GPU-less). Request: {"modules": [...],
"ops": [...], "absent": [...]}.
"""

import ctypes
import importlib
import importlib.metadata as md
import importlib.util
import json
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # at run time _report.py and _cuda.py are prepended
    from builder.checks.probes._cuda import image_files, mapped_files, runtime_version
    from builder.checks.probes._report import report


def guarded(facts, key, fn):
    try:
        facts[key] = fn()
    except BaseException as exc:  # noqa: BLE001 - SystemExit too: the probe always reports
        facts[key] = None
        facts["errors"][key] = f"{type(exc).__name__}: {exc}"[:400]


def libcuda():
    # The driver library the extensions link; in a GPU-less container, the base's compat copy.
    try:
        ctypes.CDLL("libcuda.so.1")
        return None
    except OSError as exc:
        return str(exc)


def cudart_version(path):
    try:
        value = runtime_version(path)
    except (OSError, AttributeError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return (value, None) if isinstance(value, int) else (None, value)


def libraries():
    found = {}
    for path in image_files(("libcudart.so", "libcublas.so")):
        entry = {"real": os.path.realpath(path)}
        if os.path.basename(path).startswith("libcudart.so"):
            entry["version"], entry["error"] = cudart_version(path)
        found[path] = entry
    return found


def version_json():
    try:
        with open("/usr/local/cuda/version.json") as fh:
            return json.load(fh).get("cuda", {}).get("version")
    except (OSError, ValueError):
        return None


def dists():
    """[name, version, dist-info path] of every distribution on sys.path, one entry per copy: a
    second copy of a name (another version, or the same one again) is a fact, not noise. A
    dist-info reached twice through two sys.path spellings of one directory counts once."""
    found = {}
    for d in md.distributions():
        where = getattr(d, "_path", None)
        key = os.path.realpath(str(where)) if where is not None else repr(d)
        if d.metadata["Name"]:
            found[key] = [d.metadata["Name"], d.version, key]
    return sorted(found.values())


def mapped():
    """The libcudart files this process has mapped (after the modules' imports): the runtime
    the app really uses, not one that merely sits in the image."""
    return [p for p in mapped_files() if "/libcudart.so" in p]


def resolve(path):
    parts = path.split(".")
    obj, i = None, 0
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
            break
        except ImportError:
            continue
    if obj is None:
        return "no importable prefix"
    try:
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return None
    except BaseException as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"


def imports(names):
    out: dict[str, str | None] = {}
    for name in names:
        try:
            importlib.import_module(name)
            out[name] = None
        except BaseException as exc:  # noqa: BLE001
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def torch():
    if not importlib.util.find_spec("torch"):
        return None
    try:
        import torch as t

        return {"version": t.__version__, "cuda": t.version.cuda}
    except BaseException as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {exc}"}


def main(req):
    facts = {"errors": {}, "uid": os.getuid()}
    guarded(facts, "libcuda", libcuda)
    guarded(facts, "modules", lambda: imports(req["modules"]))
    guarded(facts, "ops", lambda: {p: resolve(p) for p in req["ops"]})
    guarded(facts, "absent", lambda: {p: resolve(p) for p in req["absent"]})
    guarded(facts, "torch", torch)
    # Before the scan below: reading each libcudart's version maps every copy into this process.
    guarded(facts, "mapped", mapped)
    guarded(facts, "libs", libraries)
    guarded(facts, "version_json", version_json)
    guarded(facts, "dists", dists)
    return facts


if __name__ == "__main__":
    report(main)

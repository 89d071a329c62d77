"""Probe: does everything under the application prefix that can be loaded, load?

Each ELF shared object (a ``.so`` in its name) is tried in its own forked child, so one that
crashes, hangs or pollutes the process cannot hide another: a Python extension module under a
sys.path directory is imported by its dotted name (its package's ``__init__`` first, as any user
of it would), and must be the file that import loads; every other shared object is opened with
RTLD_NOW, as ld.so does with LD_BIND_NOW, so every undefined symbol and symbol version must
resolve against its NEEDED closure. A NEEDED soname no search path finds but a file under the
prefix provides is loaded first (RTLD_GLOBAL), as an earlier import would (torch loads libc10.so
before the libraries that need it without a RUNPATH). A library another file under the prefix
NEEDs is not opened on its own: it is loaded and bound in its dependent's load group, where ld.so
resolves its symbols. A driver library the container runtime
mounts is the one allowed gap: it is counted, and the file's symbols are then not checked.
Run with the compat libcuda.so.1 on LD_LIBRARY_PATH. Request: {"roots": [...],
"driver_libraries": [...], "timeout": 120, "jobs": 2}; with "in_order": true (and "skip", "killed": [steps]), every
item is loaded in this one process instead, in order (``in_order``: the cpu_level check).

Each child that loaded also reports what it then maps (/proc/self/maps): every file the imports
mapped (the check holds each to the image's files as the host reads them: code written at run time,
to /tmp or a memfd, is in no layer), and the libraries no NEEDED entry of a mapped file names: what
the imports loaded with dlopen (``dlopened``).
"""

import importlib
import importlib.machinery
import json
import os
import re
import signal
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time _report.py, _dyn.py and _fork.py are prepended
    from builder.checks.probes._dyn import elf_dynamic, elf_files
    from builder.checks.probes._fork import child_result, fork_call, in_child
    from builder.checks.probes._report import report

AT, ITEM = "K3-AT ", "K3-ITEM "  # in_order's lines (builder/checks/cpurun.py reads them)
MISSING = re.compile(r"([^\s:/]+\.so[.\d]*): cannot open shared object file")
LIMIT = 200
MAPPED_LIMIT = 20000


def dotted(path, sites):
    """The module name ``path`` imports as from a sys.path directory, or None (not an extension
    module, or not under an importable package path)."""
    # A bare ".so" is also an import suffix, but what carries only it is a library (torch/lib/libc10.so
    # would import as torch.lib.libc10): extension modules carry the interpreter's tag or abi3.
    tagged = [s for s in importlib.machinery.EXTENSION_SUFFIXES if s != ".so"]
    suffix = next((s for s in tagged if path.endswith(s)), None)
    if suffix is None:
        return None
    for site in sites:
        if path.startswith(site + "/"):
            parts = path[len(site) + 1 : -len(suffix)].split("/")
            if all(p.isidentifier() for p in parts):
                return ".".join(parts)
    return None


def load_now(path, providers, drivers):
    """None when ``path`` loads with every symbol bound, else why; ("gap", soname) for a driver library."""
    import ctypes

    done = set()
    for _ in range(64):
        try:
            ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
            return None
        except OSError as exc:
            text = str(exc)
        m = MISSING.search(text)
        soname = m.group(1) if m else None
        if soname in drivers:
            return ["gap", soname]
        if soname not in providers or soname in done:
            return text
        done.add(soname)
        try:
            ctypes.CDLL(providers[soname], mode=os.RTLD_NOW | os.RTLD_GLOBAL)
        except OSError as exc:  # its own missing library: load that one first, then retry
            inner = MISSING.search(str(exc))
            if inner and inner.group(1) in drivers:
                return ["gap", inner.group(1)]
            if not inner or inner.group(1) not in providers:
                return f"{soname} ({providers[soname]}): {exc}"
            done.discard(soname)
            ctypes.CDLL(providers[inner.group(1)], mode=os.RTLD_NOW | os.RTLD_GLOBAL)
            done.add(inner.group(1))
    return "too many libraries to preload"


def maps():
    """The files this process maps (/proc/self/maps), " (deleted)" and memfd ones included."""
    with open("/proc/self/maps") as fh:
        rows = [line.split(None, 5) for line in fh]
    return sorted({r[5].strip() for r in rows if len(r) == 6 and r[5].startswith("/")})


def attempt(path, module, providers, drivers, mapped=True):
    if module is None:
        why = load_now(path, providers, drivers)
        return why if why is not None or not mapped else {"maps": maps()}
    try:
        loaded = importlib.import_module(module)
    except BaseException as exc:  # noqa: BLE001 - whatever an import raises is the finding
        m = MISSING.search(str(exc))
        if m and m.group(1) in drivers:
            return ["gap", m.group(1)]
        return f"{type(exc).__name__}: {exc}"
    where = os.path.realpath(getattr(loaded, "__file__", "") or "")
    if where != os.path.realpath(path):
        return f"import {module} loads {where or 'no file'} instead"
    return {"maps": maps()} if mapped else None


def dlopened(mapped, files, sites):
    """The mapped ELF libraries no NEEDED entry of a mapped or prefix file names, that are no
    extension module (Python dlopens those): what imports loaded by name at run time."""
    needed = {n for dyn in files.values() for n in dyn["needed"]}
    libs = {}
    for path in mapped:
        if path.endswith(" (deleted)") or not os.path.isfile(path):
            continue
        try:
            dyn = elf_dynamic(path)
        except (OSError, ValueError, IndexError):
            continue
        if dyn is not None and dyn["type"] == 3:
            libs[path] = dyn
            needed.update(dyn["needed"])
    out = []
    for path, dyn in sorted(libs.items()):
        names = {os.path.basename(path), dyn["soname"]}
        if names & needed or dotted(os.path.realpath(path), sites) or dyn["interp"]:
            continue  # a NEEDED library, an extension module, or ld.so / the interpreter itself
        out.append(path)
    return out


def run_all(items, providers, drivers, timeout, jobs):
    results: dict[str, Any] = {}
    running: dict[int, tuple[str, int]] = {}
    queue = list(items)
    none = object()
    while queue or running:
        while queue and len(running) < jobs:
            path, module = queue.pop(0)
            pid, r = fork_call(attempt, path, module, providers, drivers, quiet=True, timeout=timeout, cut=400)
            running[pid] = (path, r)
        pid, status = os.waitpid(-1, 0)
        if pid not in running:
            continue
        path, r = running.pop(pid)
        found = child_result(r, none)
        if found is not none:
            results[path] = found
        elif os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM:
            results[path] = f"did not load within {timeout}s"
        else:
            results[path] = f"the loading process died (status {status})"
    return results


def zygote(top, group, providers, drivers, timeout, jobs):
    try:
        importlib.import_module(top)
    except BaseException:  # noqa: BLE001, S110 - each child imports again and reports why
        pass
    return run_all(group, providers, drivers, timeout, jobs)


def by_package(items, providers, drivers, timeout, jobs):
    """Each top-level package's extensions from a zygote that imported the package once (its
    children fork from it: torch is imported once, not once per extension); the shared objects
    that are no module from the probe itself."""
    groups: dict[str, list] = {}
    for path, module in items:
        groups.setdefault(module.split(".")[0] if module else "", []).append((path, module))
    results = run_all(groups.pop("", []), providers, drivers, timeout, jobs)
    for top, group in sorted(groups.items()):
        found = in_child(zygote, top, group, providers, drivers, timeout, jobs, quiet=True)
        found = found if isinstance(found, dict) else {}
        results.update({p: found.get(p, f"the process importing {top} died") for p, _ in group})
    return results


def _line(marker, value):
    """One line on fd 1 at once, after whatever the imports buffered: what a crash leaves behind."""
    sys.stdout.flush()
    os.write(1, (marker + json.dumps(value) + "\n").encode())


def _step(key, fn, *args):
    """One announced step: AT before, its ITEM (null, or why) after."""
    _line(AT, key)
    try:
        result = fn(*args)
    except BaseException as exc:  # noqa: BLE001 - whatever a load raises is its result
        result = f"{type(exc).__name__}: {exc}"
    _line(ITEM, [key, result[:400] if isinstance(result, str) else result])


def _import_top(top):
    importlib.import_module(top)


def in_order(items, providers, drivers, skip, killed):
    """Every item loaded in this one process, in order (cpu_level: one process under QEMU, not one per
    file), each top-level package imported first as a step of its own ("import P"). Each step is
    announced (AT) before and its result (ITEM) written after, so when an instruction the CPU lacks
    kills the process the last AT names the step; the check then starts again past it (``skip``). A
    package whose import killed the process (``killed``) is not tried again, nor are its files: each
    would import it again."""
    done, tops = 0, set()
    for path, module in items:
        top = module.split(".")[0] if module else None
        if top and f"import {top}" in killed:
            continue
        if top and top not in tops:
            tops.add(top)
            if f"import {top}" not in skip:
                _step(f"import {top}", _import_top, top)
        if path not in skip:
            _step(path, attempt, path, module, providers, drivers, False)
            done += 1
    return {"loaded": done}


def main(req):
    sites = sorted({os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)}, key=len, reverse=True)
    providers: dict[str, str] = {}
    items = []
    files = dict(elf_files(req["roots"]))
    needed = {n for dyn in files.values() for n in dyn["needed"]}
    covered = 0
    for path, dyn in files.items():
        providers.setdefault(dyn["soname"] or os.path.basename(path), path)
        providers.setdefault(os.path.basename(path), path)
        if ".so" not in os.path.basename(path):
            continue
        module = dotted(os.path.realpath(path), sites)
        # A library another file here NEEDs is loaded, and bound, in that file's load group (where
        # ld.so resolves its symbols too: libtorch_nvshmem.so's come from libtorch_cuda.so's closure).
        if module is None and (dyn["soname"] in needed or os.path.basename(path) in needed):
            covered += 1
            continue
        items.append((path, module))
    drivers = set(req["driver_libraries"])
    if req.get("in_order"):
        return in_order(items, providers, drivers, set(req.get("skip") or ()), set(req.get("killed") or ()))
    jobs = max(1, min(req.get("jobs") or os.cpu_count() or 1, 8))
    results = by_package(items, providers, drivers, req.get("timeout", 120), jobs)
    mapped = sorted({f for r in results.values() if isinstance(r, dict) for f in r.get("maps", ())})
    out: dict[str, Any] = {
        "extensions": sum(1 for _, m in items if m),
        "shared": sum(1 for _, m in items if not m),
        "covered": covered,
        "failed": [[p, m, results[p]] for p, m in items if isinstance(results.get(p), str)],
        "gaps": [[p, results[p][1]] for p, _ in items if isinstance(results.get(p), list)],
        "mapped": mapped[:MAPPED_LIMIT],
        "mapped_count": len(mapped),
        "dlopened": dlopened(mapped, files, sites)[:LIMIT],
    }
    out["count"] = len(out["failed"])
    out["failed"] = out["failed"][:LIMIT]
    return out


if __name__ == "__main__":
    report(main)

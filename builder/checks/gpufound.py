"""The GPU-code facts ``gpu_code`` and ``gpu_coverage`` judge, from the host's reading of the
image's files (imagefiles.py with gpuread.py), and the gpucode probe's listing held to them.

Which files: every file under the application prefix, and every library the NEEDED closure of
those files reaches outside it, found on the image's listing as ld.so finds it and as the probe
finds it (probes/gpucode.py ``needed_outside``: DT_RPATH without DT_RUNPATH, LD_LIBRARY_PATH,
DT_RUNPATH with $ORIGIN, /etc/ld.so.conf(.d)'s directories, the default ones). The facts have the
probe's shape ({"files": {path: {"shape", "objects", "needed_by"?}}, "errors", "scanned"}), so the
rules (gpurules.py) read either.
"""

from __future__ import annotations

import posixpath

from builder.checks import elfdyn
from builder.checks.probes import _fatbin
from builder.checks.probes.elf import DEFAULT_DIRS

MAX_NEEDED = 4000  # libraries outside the prefix a closure may reach (the probe's cap)
FILE_KINDS = ("file", "hardlink")


def _is_file(files, path: str) -> str | None:
    """The path ``path`` leads to when it is a file of the image (links followed), else None."""
    entry = files.resolve(path)
    return entry.path if entry is not None and entry.kind in FILE_KINDS else None


def _resolve(files, soname: str, dyn: elfdyn.Dynamic, origin: str, ld_library_path: str, system: list[str]):
    if "/" in soname:
        return soname if _is_file(files, soname) else None
    dirs = [] if dyn.runpath else dyn.rpath.split(":")
    dirs += ld_library_path.split(":") + dyn.runpath.split(":") + system
    for d in dict.fromkeys(dirs):
        d = d.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)
        if d and _is_file(files, posixpath.join(d, soname)):
            return posixpath.join(d, soname)
    return None


def _under(files, roots: tuple[str, ...]) -> list[str]:
    return [e.path for root in roots for e in files.under(root) if e.kind in FILE_KINDS]


def needed_outside(files, roots: tuple[str, ...], ld_library_path: str) -> dict[str, str]:
    """path -> the file under ``roots`` whose NEEDED closure loads it, for every library that
    closure reaches outside the roots (the probe's walk, on the host's listing)."""
    tops = tuple((_is_file(files, r) or r).rstrip("/") + "/" for r in roots)
    system = list(dict.fromkeys([*elfdyn.conf_dirs(files.texts), *DEFAULT_DIRS]))[: elfdyn.MAX_SEARCH]
    env_dirs = ":".join(list(dict.fromkeys(ld_library_path.split(":")))[: elfdyn.MAX_SEARCH])
    queue = [(p, p) for p in _under(files, roots)]
    seen: set[str] = set()
    outside: dict[str, str] = {}
    while queue and len(outside) < MAX_NEEDED:
        path, via = queue.pop()
        real = _is_file(files, path) or path
        if real in seen:
            continue
        seen.add(real)
        dyn = files.linked.get(real)
        if not isinstance(dyn, elfdyn.Dynamic):
            continue
        for soname in dyn.needed:
            found = _resolve(files, soname, dyn, posixpath.dirname(path), env_dirs, system)
            target = _is_file(files, found) if found else None
            if target is None:
                continue  # shared_libraries names what resolves nowhere
            if not (target + "/").startswith(tops) and target not in outside:
                outside[target] = via
            if target not in seen:
                queue.append((found, via))
    return outside


def host_found(files, roots: tuple[str, ...], ld_library_path: str) -> dict:
    """The GPU code under ``roots`` and in their NEEDED closure, as the host read it."""
    out: dict = {"files": {}, "errors": {}, "scanned": 0}
    outside = needed_outside(files, roots, ld_library_path)
    for path in [*_under(files, roots), *sorted(outside)]:
        out["scanned"] += 1
        gpu = files.gpu.get(path)
        if isinstance(gpu, str):
            out["errors"][path] = gpu
        elif gpu is not None:
            out["files"][path] = dict(gpu, **({"needed_by": outside[path]} if path in outside else {}))
    out["needed_outside"] = len(outside)
    return out


def held_to_host(host: dict, probe: dict, files) -> list[str]:
    """Each file whose GPU code the image's interpreter (the probe, headers only) listed otherwise
    than its files hold as the host reads them. A file the probe reached outside the host's
    closure is judged too, on the host's reading of it (its ``files.gpu``), and added to ``host``."""
    problems = []
    for path in sorted(set(probe.get("files", {})) - set(host["files"])):
        if isinstance(files.gpu.get(path), dict):
            host["files"][path] = dict(files.gpu[path], needed_by=probe["files"][path].get("needed_by", "?"))
    for path in sorted(set(host["files"]) | set(probe.get("files", {}))):
        mine = _fatbin.listed(host["files"].get(path, {}).get("objects", []))
        told = _fatbin.listed(probe.get("files", {}).get(path, {}).get("objects", []))
        if mine != told:
            found = f"its files hold {_show(mine)} (read on the host)"
            problems.append(f"{path}: the image's interpreter reported {_show(told)}, {found}")
    return problems


def _show(listing: dict[str, int]) -> str:
    if not listing:
        return "no GPU code"
    items = [f"{key}" + (f" x{n}" if n > 1 else "") for key, n in sorted(listing.items())]
    return "; ".join(items[:4]) + (f" (+{len(items) - 4} more)" if len(items) > 4 else "")

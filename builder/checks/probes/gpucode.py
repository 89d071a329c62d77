"""Probe: every piece of GPU code under the given roots, as its headers list it, and the run-time assemblers.

GPU code lives in these shapes: the ``.nv_fatbin`` section of an ELF file (every ELF file is
opened, whatever its name), any other well-formed fatbin container in an ELF file (data a library
loads itself; ``__nv_relfatbin``'s relocatable cubins are left out: the driver never loads them), a
standalone cubin (an ELF file of machine EM_CUDA, as FlashInfer ships them), and standalone
``.fatbin``/``.ptx`` files; under the roots, and in every library their NEEDED closure reaches
outside them (``needed_by``). The reading is _fatbin.py's, prepended, which the host's reader
(builder/checks/gpuread.py) imports too.

This probe decodes nothing: ``gpu_code`` and ``gpu_coverage`` are judged on the host's reading of
the image's files, which decodes every compressed entry with C decoders. What this probe lists
(each file's entries as their headers say) is held to the host's listing: an image whose
interpreter hides or invents GPU code fails, naming the file. The assemblers' ``--version`` is
the one thing only the image can answer (it runs the image's ptxas).

Request: {"roots": [...], "cuda_home": "/usr/local/cuda" | null, "env": {TRITON_PTXAS_PATH: ...},
"ld_library_path": "..."}.
"""

import mmap
import os
import struct
import subprocess
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time _report.py, _dyn.py and _fatbin.py are prepended
    from builder.checks.probes._dyn import elf_dynamic
    from builder.checks.probes._fatbin import gpu_shape, inspect_buffer, release, summarize
    from builder.checks.probes._report import report

ASSEMBLERS = ("ptxas", "ptxas-blackwell", "nvcc")
TOKENSPEED = "tokenspeed"


def inspect(path):
    """(shape, code objects) of one file as its headers list them, or None when it holds no GPU code."""
    with open(path, "rb") as fh:
        shape = gpu_shape(path, fh.read(64))
        if shape is None or os.fstat(fh.fileno()).st_size < 64:
            return None
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return inspect_buffer(shape, buf)


def version_of(path):
    try:
        out = subprocess.run([path, "--version"], capture_output=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{type(exc).__name__}: {exc}"[:200]
    found = release(out)
    return (found, None) if found else (None, f"no release in: {out[-200:]!r}")


def assemblers(paths, env):
    """Every ptxas/nvcc found, its version, and which one each run-time compiler selects.

    Triton 3.7.1 (triton/backends/nvidia/compiler.py, knobs.nvidia): below sm_100 it runs
    TRITON_PTXAS_PATH, else its bundled bin/ptxas; from sm_100 TRITON_PTXAS_BLACKWELL_PATH, else
    bin/ptxas-blackwell. tokenspeed-triton reads only TRITON_PTXAS_PATH, for every arch."""
    found = {}
    for path in sorted(set(paths)):
        version, error = version_of(path)
        found[path] = {"version": version, "error": error}
    selections = []
    for path in sorted(found):
        parent = os.path.dirname(path)
        if not (parent.endswith("/backends/nvidia/bin") and os.path.basename(path) == "ptxas"):
            continue
        package = parent[: -len("/backends/nvidia/bin")]
        blackwell = os.path.join(parent, "ptxas-blackwell")
        hopper = env.get("TRITON_PTXAS_PATH") or path
        if TOKENSPEED in os.path.basename(package):
            rules = [("all", hopper, "TRITON_PTXAS_PATH")]
        else:
            late = env.get("TRITON_PTXAS_BLACKWELL_PATH") or (blackwell if os.path.exists(blackwell) else path)
            rules = [("<100", hopper, "TRITON_PTXAS_PATH"), (">=100", late, "TRITON_PTXAS_BLACKWELL_PATH")]
        for archs, chosen, var in rules:
            if chosen not in found:
                version, error = version_of(chosen)
                found[chosen] = {"version": version, "error": error}
            selections.append(
                {"compiler": package, "archs": archs, "path": chosen, "variable": var, "set": bool(env.get(var))}
            )
    return found, selections


def walk(roots):
    for root in roots:
        for top, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(top, name)
                if not os.path.islink(path) and os.path.isfile(path):
                    yield path


LIB_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")  # fmt: skip
MAX_NEEDED = 4000


def conf_dirs():
    """The directories /etc/ld.so.conf(.d) names (read as text: no program of the image runs)."""
    import glob

    dirs = []
    for conf in ["/etc/ld.so.conf", *sorted(glob.glob("/etc/ld.so.conf.d/*.conf"))]:
        try:
            with open(conf, encoding="utf-8", errors="replace") as fh:
                lines = fh.read(1 << 16).splitlines()
        except OSError:
            continue
        dirs += [ln.strip() for ln in lines if ln.strip().startswith("/")]
    return dirs


def resolve(soname, dyn, origin, ld_library_path, system):
    """Where ld.so finds ``soname`` for a file with dynamic section ``dyn`` (DT_RPATH without
    DT_RUNPATH, LD_LIBRARY_PATH, DT_RUNPATH, then ld.so.conf's and the default directories)."""
    if "/" in soname:
        return soname if os.path.isfile(soname) else None
    dirs = [] if dyn["runpath"] else dyn["rpath"].split(":")
    dirs += ld_library_path.split(":") + dyn["runpath"].split(":") + system
    for d in dirs:
        d = d.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)
        if d and os.path.isfile(os.path.join(d, soname)):
            return os.path.join(d, soname)
    return None


def needed_outside(roots, ld_library_path):
    """realpath -> the file under ``roots`` whose NEEDED closure loads it, for every library that
    closure reaches outside the roots (a CUDA library of the base image, a vendored copy elsewhere)."""
    tops = tuple(os.path.realpath(r).rstrip("/") + "/" for r in roots)
    system = conf_dirs() + list(LIB_DIRS)
    queue = [(p, p) for p in walk(roots)]
    seen: set[str] = set()
    outside: dict[str, str] = {}
    while queue and len(outside) < MAX_NEEDED:
        path, via = queue.pop()
        real = os.path.realpath(path)
        if real in seen:
            continue
        seen.add(real)
        try:
            dyn = elf_dynamic(path)
        except (OSError, ValueError, struct.error, IndexError):
            continue
        if dyn is None:
            continue
        for soname in dyn["needed"]:
            found = resolve(soname, dyn, os.path.dirname(path), ld_library_path, system)
            if found is None:
                continue  # shared_libraries names what resolves nowhere
            target = os.path.realpath(found)
            if not (target + "/").startswith(tops) and target not in outside:
                outside[target] = via
            if target not in seen:
                queue.append((found, via))
    return outside


def scan(path, files, errors):
    try:
        found = inspect(path)
    except (OSError, ValueError, struct.error, IndexError) as exc:
        errors[path] = f"{type(exc).__name__}: {exc}"[:200]
        return None
    if found and found[1]:
        files[path] = {"shape": found[0], "objects": summarize(found[1])}
    return found


def main(req):
    started = time.monotonic()
    files: dict[str, Any] = {}
    errors: dict[str, str] = {}
    tools, scanned = [], 0
    for path in walk(req["roots"]):
        scanned += 1
        if os.path.basename(path) in ASSEMBLERS and os.access(path, os.X_OK):
            tools.append(path)
        scan(path, files, errors)
    outside = needed_outside(req["roots"], req.get("ld_library_path") or "")
    for path, via in sorted(outside.items()):
        scanned += 1
        if scan(path, files, errors) and path in files:
            files[path]["needed_by"] = via
    home = req.get("cuda_home")
    if home:
        tools += [
            os.path.join(home, "bin", n) for n in ("ptxas", "nvcc") if os.path.isfile(os.path.join(home, "bin", n))
        ]
    found_tools, selections = assemblers(tools, req.get("env") or {})
    if home:
        for name in ("nvcc", "ptxas"):
            path = os.path.join(home, "bin", name)
            if path in found_tools:
                selections.append(
                    {"compiler": "CUDA_HOME", "archs": "all", "path": path, "variable": "CUDA_HOME", "set": True}
                )
    return {
        "files": files,
        "errors": errors,
        "assemblers": found_tools,
        "selected": selections,
        "scanned": scanned,
        "needed_outside": len(outside),
        "seconds": round(time.monotonic() - started, 2),
    }


if __name__ == "__main__":
    report(main)

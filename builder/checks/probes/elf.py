"""Probe: does every ELF file under the application prefix find each library it needs?

Resolves each DT_NEEDED soname the way ld.so does (DT_RPATH when there is no DT_RUNPATH, then
LD_LIBRARY_PATH, then DT_RUNPATH, with $ORIGIN expanded; then the ld.so cache; then the default
directories). Python extensions also get what an earlier import loaded by soname (torch loads
libc10.so and nvidia/*/lib/libcudart.so.12 before vLLM's extensions, which carry no RUNPATH):
a soname that no search path finds but that a file under the prefix provides counts as
"preloaded". Reports what nothing in the image provides, and every soname of a CUDA library of
another major, with the distribution that installed the file asking for it.
Also loads, by name, the libraries packages dlopen at run time (no NEEDED entry shows those).
Request: {"roots": [...], "ld_library_path": "...", "cuda_major": 12, "tracking": [...],
"dlopen": [...]}.
"""

import os
import re
import struct
import subprocess
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time builder/checks/probes/_report.py is prepended: report() is defined
    from builder.checks.probes._report import report

DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_SONAME, DT_RPATH, DT_RUNPATH = 1, 5, 10, 14, 15, 29
DEFAULT_DIRS = (
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
)


def dynamic(path):
    """(needed, soname, rpath, runpath) of an ELF file, or None when it is not a dynamic ELF."""
    with open(path, "rb") as fh:
        head = fh.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF":
            return None
        wide, little = head[4] == 2, head[5] == 1
        end = "<" if little else ">"
        if wide:
            phoff, phentsize, phnum = struct.unpack(end + "Q", head[32:40])[0], *struct.unpack(end + "HH", head[54:58])
        else:
            phoff, phentsize, phnum = struct.unpack(end + "I", head[28:32])[0], *struct.unpack(end + "HH", head[42:46])
        loads, dyn = [], None
        for i in range(phnum):
            fh.seek(phoff + i * phentsize)
            ph = fh.read(phentsize)
            if wide:
                p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack(end + "IIQQQQ", ph[:40])
            else:
                p_type, p_offset, p_vaddr, _, p_filesz = struct.unpack(end + "IIIII", ph[:20])
            if p_type == 1:
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == 2:
                dyn = (p_offset, p_filesz)
        if dyn is None:
            return None
        fh.seek(dyn[0])
        raw = fh.read(dyn[1])
        size = 16 if wide else 8
        fmt = end + ("qQ" if wide else "iI")
        entries = [struct.unpack(fmt, raw[i : i + size]) for i in range(0, len(raw) - size + 1, size)]

        def offset(vaddr):
            for start, off, filesz in loads:
                if start <= vaddr < start + filesz:
                    return vaddr - start + off
            return vaddr

        table = {tag: val for tag, val in entries if tag in (DT_STRTAB, DT_STRSZ)}
        if DT_STRTAB not in table:
            return None
        fh.seek(offset(table[DT_STRTAB]))
        strtab = fh.read(table.get(DT_STRSZ, 1 << 20))

    def text(i):
        return strtab[i : strtab.index(b"\0", i)].decode("utf-8", "replace")

    needed = [text(v) for t, v in entries if t == DT_NEEDED]
    soname = next((text(v) for t, v in entries if t == DT_SONAME), None)
    rpath = next((text(v) for t, v in entries if t == DT_RPATH), "")
    runpath = next((text(v) for t, v in entries if t == DT_RUNPATH), "")
    return needed, soname, rpath, runpath


def ld_cache():
    """soname -> path from `ldconfig -p` (the image's /etc/ld.so.cache)."""
    for exe in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            out = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        found: dict[str, str] = {}
        for line in out.splitlines():
            m = re.match(r"\s+(\S+) \(([^)]*)\) => (\S+)", line)
            if m:
                found.setdefault(m.group(1), m.group(3))
        return found
    return {}


def search(entry, needed, origin, ld_library_path, cache):
    if "/" in needed:
        return needed if os.path.exists(needed) else None
    _, _, rpath, runpath = entry
    paths = [] if runpath else rpath.split(":")
    paths += ld_library_path.split(":") + runpath.split(":")
    for d in paths:
        d = d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin)
        if d and os.path.isfile(os.path.join(d, needed)):
            return os.path.join(d, needed)
    if needed in cache and os.path.exists(cache[needed]):
        return cache[needed]
    for d in DEFAULT_DIRS:
        if os.path.isfile(os.path.join(d, needed)):
            return os.path.join(d, needed)
    return None


def loads(name):
    """None when the dynamic loader finds ``name`` the way a package's dlopen(name) would."""
    import ctypes

    try:
        ctypes.CDLL(name)
        return None
    except OSError as exc:
        return str(exc)


def owners(paths):
    """Path -> "name version" of the distribution that installed it, for the given paths only
    (resolving every file of every distribution takes the better part of a minute)."""
    wanted = {os.path.normpath(p) for p in paths}
    found: dict[str, str] = {}
    if not wanted:
        return found
    try:
        import importlib.metadata as md

        for dist in md.distributions():
            for f in dist.files or ():
                path = os.path.normpath(str(dist.locate_file(f)))
                if path in wanted:
                    found[path] = f"{dist.metadata['Name']} {dist.version}"
    except Exception:  # noqa: BLE001 - no metadata means no owner names, not no check
        pass
    return found


def elves(roots):
    for root in roots:
        for top, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(top, name)
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                try:
                    entry = dynamic(path)
                except (OSError, struct.error, ValueError, IndexError):
                    continue
                if entry is not None:
                    yield path, entry


def main(req):
    tracking = re.compile(r"lib({})\.so\.(\d+)(?:\.\d+)*$".format("|".join(map(re.escape, req["tracking"]))))
    cache, files = ld_cache(), dict(elves(req["roots"]))
    provided: dict[str, str] = {}
    for path, entry in files.items():
        provided.setdefault(entry[1] or os.path.basename(path), path)
        provided.setdefault(os.path.basename(path), path)
    out: dict[str, Any] = {
        "elves": len(files),
        "unresolved": [],
        "other_major": [],
        "preloaded": 0,
        "ld_cache": len(cache),
    }
    for path, entry in sorted(files.items()):
        origin = os.path.dirname(path)
        for needed in entry[0]:
            m = tracking.match(needed)
            if m and int(m.group(2)) != req["cuda_major"]:
                out["other_major"].append({"path": path, "needed": needed, "major": int(m.group(2))})
            if search(entry, needed, origin, req["ld_library_path"], cache):
                continue
            if needed in provided:
                out["preloaded"] += 1
                continue
            out["unresolved"].append({"path": path, "needed": needed})
    out["dlopen"] = {name: loads(name) for name in req.get("dlopen", ())}
    owner = owners([e["path"] for e in out["unresolved"] + out["other_major"]])
    for e in out["unresolved"] + out["other_major"]:
        e["dist"] = owner.get(os.path.normpath(e["path"]))
    return out


if __name__ == "__main__":
    report(main)

"""Probe: can every ELF file the image loads or runs be mapped on its hosts' largest page size?

Grace hosts (GH200, GB200, GB300) often run 64K-page kernels. glibc maps each PT_LOAD segment at
a page boundary and refuses a file whose segments do not fit that page size (elf/dl-load.c,
_dl_map_object_from_fd; docs/checks.md "page_alignment" quotes both generations of the rule):
up to 2.34 every PT_LOAD's p_align must be a multiple of the page size ("ELF load command
alignment not page-aligned") and p_vaddr - p_offset a multiple of p_align; from 2.35 (commit
163f625c, BZ #28688) p_vaddr - p_offset must be a multiple of the page size ("ELF load command
address/offset not page-aligned"). The kernel maps executables with the same congruence. So a
file passes when every PT_LOAD has p_align a multiple of the page and p_vaddr - p_offset a
multiple of the page: what the linker promises with -z max-page-size=65536, and what both
generations of glibc accept.

The machine is the image's own: the ELF header of this interpreter (sys.executable). When the
request names no page size for it (x86_64: 4K-page kernels only) nothing is walked. Otherwise every
regular ELF executable or shared object (ET_EXEC, ET_DYN) of that machine under the roots is judged
(symlinks are not followed; a file reached twice counts once); files of another machine are counted,
never judged (this machine cannot load them). With "loader", the dynamic loader's own directories
are walked too: its default directories for the machine and every directory the ld.so cache names.
Request: {"roots": [...], "pages": {"aarch64": 65536}, "loader": true}.
"""

import os
import re
import stat
import struct
import subprocess
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time builder/checks/probes/_report.py is prepended: report() is defined
    from builder.checks.probes._report import report

LIMIT = 200
PT_LOAD, ET_EXEC, ET_DYN = 1, 2, 3
# e_machine -> the name `uname -m` (platform.machine()) gives that machine.
MACHINES = {3: "i386", 40: "arm", 62: "x86_64", 183: "aarch64", 21: "ppc64", 243: "riscv64"}
# ld.so's default directories (sysdeps/unix/sysv/linux/*/ldconfig.h; Debian's multiarch ones).
DEFAULT_DIRS = {
    "aarch64": ("/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64"),
    "x86_64": ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64"),
}


def segments(path):
    """(machine, e_type, [(p_offset, p_vaddr, p_align), ...] of each PT_LOAD), or None: not ELF."""
    with open(path, "rb") as fh:
        head = fh.read(64)
        if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2):
            return None
        wide, end = head[4] == 2, "<" if head[5] == 1 else ">"
        e_type, e_machine = struct.unpack(end + "HH", head[16:20])
        if wide:
            phoff, (phentsize, phnum) = struct.unpack(end + "Q", head[32:40])[0], struct.unpack(end + "HH", head[54:58])
        else:
            phoff, (phentsize, phnum) = struct.unpack(end + "I", head[28:32])[0], struct.unpack(end + "HH", head[42:46])
        loads = []
        fh.seek(phoff)
        table = fh.read(phentsize * phnum)
    for i in range(phnum):
        ph = table[i * phentsize : (i + 1) * phentsize]
        if wide:
            p_type, _, p_offset, p_vaddr, _, _, _, p_align = struct.unpack(end + "IIQQQQQQ", ph[:56])
        else:
            p_type, p_offset, p_vaddr, _, _, _, _, p_align = struct.unpack(end + "IIIIIIII", ph[:32])
        if p_type == PT_LOAD:
            loads.append((p_offset, p_vaddr, p_align))
    return MACHINES.get(e_machine, f"e_machine {e_machine}"), e_type, loads


def judge(loads, page):
    """Why ``loads`` (PT_LOAD segments) cannot be mapped with pages of ``page`` bytes, or None."""
    why = []
    short = sorted({align for _, _, align in loads if align < page or align % page})
    if short:
        why.append("p_align " + ", ".join(f"{a:#x}" for a in short) + f" (not a multiple of {page:#x})")
    skewed = [(i, (vaddr - offset) % page) for i, (offset, vaddr, _) in enumerate(loads) if (vaddr - offset) % page]
    if skewed:
        shown = ", ".join(f"PT_LOAD {i}: {rest:#x}" for i, rest in skewed[:4])
        why.append(f"p_vaddr - p_offset not a multiple of {page:#x} ({shown})")
    return "; ".join(why) or None


def ld_cache_dirs():
    """The directories of every library `ldconfig -p` (the image's /etc/ld.so.cache) names."""
    for exe in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            out = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        return sorted({os.path.dirname(m.group(1)) for m in re.finditer(r" => (/\S+)", out)})
    return []


def walk_roots(roots):
    """The existing roots, resolved, without one that lies inside another (walked once)."""
    real = sorted({os.path.realpath(r) for r in roots if r and os.path.isdir(r)})
    return [r for r in real if not any(r.startswith(o.rstrip("/") + "/") for o in real if o != r)]


def main(req):
    exe = os.path.realpath(sys.executable)
    try:
        machine = segments(exe)[0]
    except (OSError, TypeError, struct.error):
        import platform

        machine = platform.machine()
    page = req["pages"].get(machine)
    out: dict[str, Any] = {"machine": machine, "page": page, "roots": [], "checked": 0, "other_machine": 0}
    out.update(count=0, problems=[])
    if page is None:
        return out
    roots = list(req["roots"])
    if req.get("loader"):
        roots += [*DEFAULT_DIRS.get(machine, ()), "/lib", "/usr/lib", *ld_cache_dirs()]
    out["roots"] = walk_roots(roots)
    seen = set()
    for root in out["roots"]:
        for top, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(top, name)
                try:
                    st = os.lstat(path)
                    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in seen:
                        continue
                    seen.add((st.st_dev, st.st_ino))
                    found = segments(path)
                except (OSError, struct.error, ValueError):
                    continue
                if found is None or found[1] not in (ET_EXEC, ET_DYN) or not found[2]:
                    continue
                if found[0] != machine:
                    out["other_machine"] += 1
                    continue
                out["checked"] += 1
                why = judge(found[2], page)
                if why:
                    out["count"] += 1
                    if len(out["problems"]) < LIMIT:
                        out["problems"].append([path, why])
    return out


if __name__ == "__main__":
    report(main)

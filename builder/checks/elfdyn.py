"""The dynamic section of the image's shared objects, read on the host from the exported stream
(issue 49: NEEDED lists are read by the tool's own code, and the ELF probe's answer is held to them).

The stream is read forward once, so a file's dynamic section is captured as it passes (its place
comes from the program headers at the start), and the NEEDED, RPATH and RUNPATH strings are read
from the first ``PREFIX`` bytes, where ``.dynstr`` sits in every linker's layout we know (it is in
the first load segment, before the code). A file whose strings lie further in is not read, and said
so, never counted as needing nothing. Then ``unresolved`` finds each NEEDED soname the way ld.so
does, on the image's file listing: nothing of the image runs.
"""

from __future__ import annotations

import posixpath
import re
import struct
from dataclasses import dataclass

PREFIX = 8 << 20
PT_LOAD, PT_DYNAMIC = 1, 2
DT_NEEDED, DT_STRTAB, DT_SONAME, DT_RPATH, DT_RUNPATH = 1, 5, 14, 15, 29
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
CONF = re.compile(r"^/etc/ld\.so\.conf(\.d/[^/]+\.conf)?$")


@dataclass(frozen=True)
class Dynamic:
    needed: tuple[str, ...]
    soname: str | None
    rpath: str
    runpath: str


class Capture:
    """Fed a file's chunks in order: keeps its first PREFIX bytes and its PT_DYNAMIC bytes."""

    def __init__(self) -> None:
        self.head, self.dyn, self.pos = bytearray(), bytearray(), 0
        self.range: tuple[int, int] | None = None

    def feed(self, chunk: bytes) -> None:
        if len(self.head) < PREFIX:
            self.head += chunk[: PREFIX - len(self.head)]
        if self.range is None and len(self.head) >= 64:
            self.range = _dynamic_range(bytes(self.head)) or (0, 0)
        start, end = self.range or (0, 0)
        lo, hi = max(start, self.pos), min(end, self.pos + len(chunk))
        if lo < hi:
            self.dyn += chunk[lo - self.pos : hi - self.pos]
        self.pos += len(chunk)

    def result(self) -> Dynamic | str | None:
        """The file's dynamic section; None when it has none (not a dynamic ELF64 LE file); a
        string saying why it was not read."""
        if self.range is None or self.range == (0, 0):
            return None
        return _parse(bytes(self.head), bytes(self.dyn))


def _phdrs(head: bytes) -> list[tuple[int, int, int, int]]:
    """(type, offset, vaddr, filesz) of each program header of an ELF64 little-endian file."""
    if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return []
    (phoff,) = struct.unpack_from("<Q", head, 32)
    phentsize, phnum = struct.unpack_from("<HH", head, 54)
    out = []
    for i in range(phnum):
        at = phoff + i * phentsize
        if phentsize < 56 or at + 56 > len(head):
            return []
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", head, at)
        out.append((p_type, p_offset, p_vaddr, p_filesz))
    return out


def _dynamic_range(head: bytes) -> tuple[int, int] | None:
    dyn = [(off, off + size) for t, off, _, size in _phdrs(head) if t == PT_DYNAMIC]
    return dyn[0] if dyn else None


def _parse(head: bytes, dyn: bytes) -> Dynamic | str:
    entries = [struct.unpack_from("<qQ", dyn, i) for i in range(0, len(dyn) - 15, 16)]
    strtab = next((v for t, v in entries if t == DT_STRTAB), None)
    if strtab is None:
        return "its dynamic section names no string table"
    for p_type, off, vaddr, size in _phdrs(head):
        if p_type == PT_LOAD and vaddr <= strtab < vaddr + size:
            strtab = strtab - vaddr + off
            break
    else:
        return "its string table is in no load segment"

    def text(i: int) -> str | None:
        at = strtab + i
        end = head.find(b"\0", at, at + 4096)
        return head[at:end].decode("utf-8", "replace") if at < len(head) and end != -1 else None

    names = {t: text(v) for t, v in entries if t in (DT_SONAME, DT_RPATH, DT_RUNPATH)}
    needed = [text(v) for t, v in entries if t == DT_NEEDED]
    if None in needed or None in names.values():
        return f"its dynamic strings lie beyond the first {PREFIX >> 20} MiB the host keeps"
    return Dynamic(
        tuple(n for n in needed if n is not None),
        names.get(DT_SONAME),
        names.get(DT_RPATH) or "",
        names.get(DT_RUNPATH) or "",
    )


def conf_dirs(texts: dict[str, bytes]) -> list[str]:
    """The directories /etc/ld.so.conf and /etc/ld.so.conf.d/*.conf name (``include`` lines are
    the .d files, read anyway)."""
    dirs = []
    for path in sorted(texts, key=lambda p: (p != "/etc/ld.so.conf", p)):
        if CONF.match(path):
            lines = texts[path].decode("utf-8", "replace").splitlines()
            dirs += [ln.strip() for ln in lines if ln.strip().startswith("/")]
    return dirs


def unresolved(files, root: str, ld_library_path: str) -> list[tuple[str, str]]:
    """(path, soname) of each NEEDED entry of a shared object under ``root`` that ld.so would find
    nowhere in the image: DT_RPATH (without DT_RUNPATH), LD_LIBRARY_PATH, DT_RUNPATH ($ORIGIN
    expanded), ld.so.conf's directories, the default ones; a soname a file under ``root`` provides
    counts as found (an earlier import loads it by that name, as the ELF probe counts it)."""
    top = root.rstrip("/") + "/"
    mine = {p: d for p, d in files.dynamic.items() if p.startswith(top) and isinstance(d, Dynamic)}
    provided = {posixpath.basename(p) for p in mine} | {d.soname for d in mine.values() if d.soname}
    system = conf_dirs(files.texts) + list(DEFAULT_DIRS)
    found = []
    for path, dyn in sorted(mine.items()):
        origin = posixpath.dirname(path)
        dirs = ([] if dyn.runpath else dyn.rpath.split(":")) + ld_library_path.split(":") + dyn.runpath.split(":")
        for soname in dyn.needed:
            if soname in provided:
                continue
            where = [soname] if "/" in soname else [posixpath.join(d, soname) for d in dirs + system if d]
            where = [w.replace("${ORIGIN}", origin).replace("$ORIGIN", origin) for w in where]
            if not any((e := files.resolve(w)) is not None and e.kind == "file" for w in where):
                found.append((path, soname))
    return found

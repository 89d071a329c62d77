"""The dynamic section of the image's shared objects, read on the host from the exported stream
(issue 49: NEEDED lists are read by the tool's own code, and the ELF probe's answer is held to them).

The stream is read forward once, so a file's dynamic section is captured as it passes (its place
comes from the program headers at the start), and the NEEDED, RPATH and RUNPATH strings are read
from the first ``PREFIX`` bytes, where a linker puts ``.dynstr`` (in the first load segment, before
the code), or captured as they pass once the dynamic section has named them (patchelf moves
``.dynstr`` to the end of the file). A file whose strings cannot be read (they lie past the first
``PREFIX`` bytes and before its dynamic section, or a stated size is over a cap) is said unread, never
counted as needing nothing. Then ``unresolved`` finds each NEEDED soname the way ld.so does, on the
image's file listing: nothing of the image runs.
"""

from __future__ import annotations

import posixpath
import re
import struct
from dataclasses import dataclass

# ld.so's default directories: one list, the in-image probe's (importable: its main is guarded)
from builder.checks.probes.elf import DEFAULT_DIRS

PREFIX = 32 << 20  # libtriton.so (Triton 3.x, lld) keeps its NEEDED strings 17 MiB in, before its dynamic section
PT_LOAD, PT_DYNAMIC = 1, 2
DT_NEEDED, DT_STRTAB, DT_SONAME, DT_RPATH, DT_RUNPATH = 1, 5, 14, 15, 29
CONF = re.compile(r"^/etc/ld\.so\.conf(\.d/[^/]+\.conf)?$")


@dataclass(frozen=True)
class Dynamic:
    needed: tuple[str, ...]
    soname: str | None
    rpath: str
    runpath: str


MAX_DYN = 64 << 10  # 4,096 entries: real libraries have tens (torch's libtorch_cuda.so: 40)
MAX_STRINGS = 1024  # NEEDED, SONAME, RPATH and RUNPATH entries of one file
MAX_TEXT = 64 << 10  # the characters those strings may total in one file
MAX_DIRS = 64  # distinct RPATH and RUNPATH directories of one file
STRING = 4096  # the longest string read (PATH_MAX)
MAX_SEARCH = 256  # distinct LD_LIBRARY_PATH and ld.so.conf directories searched (a real image has tens)


class Capture:
    """Fed a file's chunks in order: keeps its first PREFIX bytes, its PT_DYNAMIC bytes and, once
    those are in, the bytes of its NEEDED, SONAME, RPATH and RUNPATH strings that lie further on
    (patchelf, which auditwheel runs on every manylinux wheel's libraries, moves ``.dynstr`` to the
    end of the file: torch's libtorch_cpu.so keeps it 400 MiB in). Memory is bounded whatever the
    file states: MAX_DYN of dynamic section, MAX_STRINGS windows of STRING bytes."""

    def __init__(self) -> None:
        self.head, self.dyn, self.pos = bytearray(), bytearray(), 0
        self.range: tuple[int, int] | None = None
        self.why: str | None = None
        self.windows: list[tuple[int, bytearray]] | None = None  # (file offset, bytes) past the head

    def feed(self, chunk: bytes) -> None:
        if len(self.head) < PREFIX:
            self.head += chunk[: PREFIX - len(self.head)]
        if self.range is None and not self.why:
            self._locate()
        start, end = self.range or (0, 0)
        if end > start:  # the dynamic section, from the head first (the program headers may come later)
            if len(self.dyn) < end - start and start + len(self.dyn) < len(self.head):
                self.dyn += self.head[start + len(self.dyn) : min(end, len(self.head))]
            if len(self.dyn) < end - start and start + len(self.dyn) < self.pos:
                self.why, self.range = "its dynamic section passed before its program headers were read", None
                return
            _take(self.dyn, start + len(self.dyn), end, self.pos, chunk)
        if self.windows is None and end > start and len(self.dyn) == end - start:
            self.windows = _windows(bytes(self.head), bytes(self.dyn), self.pos)
        for at, buf in self.windows or ():
            _take(buf, at + len(buf), at + STRING, self.pos, chunk)
        self.pos += len(chunk)

    def _locate(self) -> None:
        """The dynamic section's place, once the head holds every program header."""
        head = self.head
        if len(head) < 64:
            return
        if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            self.range = (0, 0)
            return
        (phoff,) = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        if phoff + phentsize * phnum > len(head):
            if len(head) >= PREFIX:
                self.why = f"its program headers lie beyond the first {PREFIX >> 20} MiB"
            return
        self.range = _dynamic_range(bytes(head)) or (0, 0)
        if self.range[1] - self.range[0] > MAX_DYN:
            self.why = f"its dynamic section states {self.range[1] - self.range[0]} bytes, over {MAX_DYN}"
            self.range = (0, 0)

    def result(self) -> Dynamic | str | None:
        """The file's dynamic section; None when it has none (not a dynamic ELF64 LE file); a
        string saying why it was not read."""
        if self.why:
            return self.why
        if self.range is None or self.range == (0, 0):
            return None
        return _parse(bytes(self.head), bytes(self.dyn), self.windows or [])


def _take(buf: bytearray, start: int, end: int, pos: int, chunk: bytes) -> None:
    """Append to ``buf`` the part of [start, end) of the file that ``chunk`` (at ``pos``) holds."""
    lo, hi = max(start, pos), min(end, pos + len(chunk))
    if lo < hi:
        buf += chunk[lo - pos : hi - pos]


def _entries(dyn: bytes) -> list[tuple[int, int]]:
    return [struct.unpack_from("<qQ", dyn, i) for i in range(0, len(dyn) - 15, 16)]


def _strtab(head: bytes, entries: list[tuple[int, int]]) -> int | str:
    """The file offset of the dynamic string table, or why there is none."""
    strtab = next((v for t, v in entries if t == DT_STRTAB), None)
    if strtab is None:
        return "its dynamic section names no string table"
    for p_type, off, vaddr, size in _phdrs(head):
        if p_type == PT_LOAD and vaddr <= strtab < vaddr + size:
            return strtab - vaddr + off
    return "its string table is in no load segment"


def _windows(head: bytes, dyn: bytes, pos: int) -> list[tuple[int, bytearray]]:
    """A window for each wanted string that starts past the head and not before ``pos`` (the stream
    has not passed it yet); a string the stream has passed outside the head stays unread."""
    entries = _entries(dyn)
    strtab = _strtab(head, entries)
    if isinstance(strtab, str):
        return []
    wanted = sorted({strtab + v for t, v in entries if t in (DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH)})
    return [(at, bytearray()) for at in wanted[:MAX_STRINGS] if at >= max(pos, len(head) - STRING)]


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


def _parse(head: bytes, dyn: bytes, windows: list[tuple[int, bytearray]]) -> Dynamic | str:
    entries = _entries(dyn)
    strtab = _strtab(head, entries)
    if isinstance(strtab, str):
        return strtab
    found = dict(windows)

    def text(i: int) -> str | None:
        at = strtab + i
        buf, base = (found[at], at) if at in found else (head, 0)
        end = buf.find(b"\0", at - base, at - base + STRING)
        return buf[at - base : end].decode("utf-8", "replace") if at - base < len(buf) and end != -1 else None

    wanted = [(t, v) for t, v in entries if t in (DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH)]
    if len(wanted) > MAX_STRINGS:
        return f"its dynamic section names {len(wanted)} strings, over {MAX_STRINGS}"
    names = {t: text(v) for t, v in wanted if t != DT_NEEDED}
    needed = [text(v) for t, v in wanted if t == DT_NEEDED]
    if None in needed or None in names.values():
        return f"its dynamic strings lie beyond the first {PREFIX >> 20} MiB, before its dynamic section"
    strings = [s for s in [*needed, *names.values()] if s is not None]
    dirs = {d for t in (DT_RPATH, DT_RUNPATH) for d in (names.get(t) or "").split(":")}
    if sum(map(len, strings)) > MAX_TEXT or len(dirs) > MAX_DIRS:
        return f"its dynamic strings total over {MAX_TEXT} characters or {MAX_DIRS} search directories"
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
    # distinct directories, capped: the image's config and ld.so.conf.d files bound the host's time
    # (whether a soname is found anywhere does not depend on their order)
    system = list(dict.fromkeys([*DEFAULT_DIRS, *conf_dirs(files.texts)]))[:MAX_SEARCH]
    env_dirs = list(dict.fromkeys(ld_library_path.split(":")))[:MAX_SEARCH]
    found = []
    for path, dyn in sorted(mine.items()):
        origin = posixpath.dirname(path)
        dirs = ([] if dyn.runpath else dyn.rpath.split(":")) + env_dirs + dyn.runpath.split(":")
        dirs = list(dict.fromkeys(dirs + system))
        for soname in dyn.needed:
            if soname in provided:
                continue
            where = [soname] if "/" in soname else [posixpath.join(d, soname) for d in dirs if d]
            where = [w.replace("${ORIGIN}", origin).replace("$ORIGIN", origin) for w in where]
            if not any((e := files.resolve(w)) is not None and e.kind == "file" for w in where):
                found.append((path, soname))
    return found

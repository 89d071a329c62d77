# Prepended (after _report.py) to the probes that read ELF dynamic sections: DT_NEEDED, DT_SONAME,
# DT_RPATH, DT_RUNPATH of a file, standard library only (the same reading as elf.py's dynamic()).
import struct as _struct

_DT = {1: "needed", 14: "soname", 15: "rpath", 29: "runpath"}


def elf_dynamic(path):
    """{"needed": [...], "soname", "rpath", "runpath", "type"} of an ELF file, or None when it is
    not ELF or has no dynamic section (a static executable)."""
    with open(path, "rb") as fh:
        head = fh.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF":
            return None
        wide, end = head[4] == 2, "<" if head[5] == 1 else ">"
        e_type = _struct.unpack(end + "H", head[16:18])[0]
        if wide:
            phoff, (phentsize, phnum) = (
                _struct.unpack(end + "Q", head[32:40])[0],
                _struct.unpack(end + "HH", head[54:58]),
            )
        else:
            phoff, (phentsize, phnum) = (
                _struct.unpack(end + "I", head[28:32])[0],
                _struct.unpack(end + "HH", head[42:46]),
            )
        loads, dyn, interp = [], None, False
        for i in range(phnum):
            fh.seek(phoff + i * phentsize)
            ph = fh.read(phentsize)
            if wide:
                p_type, _, p_offset, p_vaddr, _, p_filesz = _struct.unpack(end + "IIQQQQ", ph[:40])
            else:
                p_type, p_offset, p_vaddr, _, p_filesz = _struct.unpack(end + "IIIII", ph[:20])
            if p_type == 1:
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == 2:
                dyn = (p_offset, p_filesz)
            elif p_type == 3:
                interp = True
        if dyn is None:
            return None
        fh.seek(dyn[0])
        raw = fh.read(dyn[1])
        size, fmt = (16, end + "qQ") if wide else (8, end + "iI")
        entries = [_struct.unpack(fmt, raw[i : i + size]) for i in range(0, len(raw) - size + 1, size)]
        strtab = next((v for t, v in entries if t == 5), None)
        if strtab is None:
            return None
        for start, off, filesz in loads:
            if start <= strtab < start + filesz:
                strtab = strtab - start + off
                break
        fh.seek(strtab)
        table = fh.read(next((v for t, v in entries if t == 10), 1 << 20))

    def text(i):
        return table[i : table.index(b"\0", i)].decode("utf-8", "replace")

    out = {"needed": [], "soname": None, "rpath": "", "runpath": "", "type": e_type, "interp": interp}
    for tag, val in entries:
        if tag == 1:
            out["needed"].append(text(val))
        elif tag in _DT:
            out[_DT[tag]] = text(val)
    return out


def elf_files(roots):
    """(path, dynamic) of every regular ELF file with a dynamic section under ``roots``, sorted."""
    import os as _os

    for root in roots:
        for top, dirs, files in _os.walk(root):
            dirs.sort()
            for name in sorted(files):
                path = _os.path.join(top, name)
                if _os.path.islink(path) or not _os.path.isfile(path):
                    continue
                try:
                    entry = elf_dynamic(path)
                except (OSError, _struct.error, ValueError, IndexError):
                    continue
                if entry is not None:
                    yield path, entry

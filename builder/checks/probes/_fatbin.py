# Prepended (after _report.py) to the gpucode probe, and imported by the host's reader
# (builder/checks/gpuread.py): the one reading of GPU code, standard library only. The probe reads
# headers only (``decode`` None: no compressed payload is decoded in the image); the host passes
# its decoder, so a compressed entry's own notes and text are judged there.
#
# The layouts (written from what this project's tests pin against cuobjdump 13.x on real
# binaries, tests/unit/test_gpucode.py):
# - a fatbin container: magic 0xBA55ED50, u16 version, u16 header size, u64 size of what follows;
#   then entries back to back, each a header (u16 kind: 1 PTX, 2 ELF; u16; u32 header size; u64
#   payload size; u32 compressed size; u32; u16 minor, u16 major; u32 arch; u32, u32; u64 flags;
#   u64; u64 uncompressed size) and its payload. For PTX major.minor is the ISA; for ELF it is the
#   cubin's ELF ABI version (1.7, 1.8). Flags: 0x1 64-bit, 0x10 Linux, 0x2000 LZ4 compressed,
#   0x8000 ZSTD compressed, 0x100000 ``a``, 0x200000 ``f``.
# - a cubin: ELF, e_machine 190. EI_ABIVERSION 7 keeps the SM in the low byte of e_flags and
#   ``a`` at 0x800; ABI 8 keeps the SM in bits 8-15 and ``a`` at 0x8 (LLVM's EF_CUDA_* constants).
#   ``f`` is not in e_flags: ptxas writes its options (``-arch sm_100f``) into
#   ``.note.nv.tkinfo``, beside "Cuda compilation tools, release 12.9, V12.9.86".
#   ``.note.nv.cuinfo`` (ptxas 13) carries the toolkit as major*10+minor (130); NVRTC 12.9's cubins
#   below sm_100 carry no note at all: their toolkit is unknown ("no note").
# - a cubin with no note whose ELF ABI is 8 below sm_100 can only come from ptxas 13 or later
#   (ptxas 12.x writes ABI 7 there: NVRTC 12.9.86 and NCCL 2.30.7's cubins, tried), reported as
#   "13+ (inferred from ELF ABI 8)".
import re as _re
import struct as _fstruct

FATBIN_MAGIC = 0xBA55ED50
EM_CUDA = 190
KIND_PTX, KIND_ELF = 1, 2
FLAG_LZ4, FLAG_ZSTD, FLAG_A, FLAG_F = 0x2000, 0x8000, 0x100000, 0x200000
RELEASE = _re.compile(rb"release (\d+)\.(\d+), V(\d+\.\d+\.\d+)")
ARCH_OPT = _re.compile(rb"-arch[ =]sm_(\d+)([af]?)")
PTX_VERSION = _re.compile(rb"^\s*\.version\s+(\d+)\.(\d+)", _re.M)
PTX_TARGET = _re.compile(rb"^\s*\.target\s+(?:sm|compute)_(\d+)([af]?)", _re.M)
PTX_HEAD = 16384  # a PTX text's .version and .target lines sit in its first lines
MAGIC_BYTES = _fstruct.pack("<I", FATBIN_MAGIC)
# What an entry's header says, before any decoding: the fields the probe's listing and the host's
# reading are compared on (``listed``); PTX's ISA is the header's (``header_isa`` once a text differs).
LISTED = ("kind", "arch", "isa", "abi", "compressed", "outside")
NOT_DECODED = "not decoded (headers only)"


def sections(buf, base=0):
    """name -> (offset, size) of an ELF64 little-endian image at ``base`` of ``buf``."""
    shoff = _fstruct.unpack_from("<Q", buf, base + 0x28)[0]
    shentsize, shnum, shstrndx = _fstruct.unpack_from("<HHH", buf, base + 0x3A)
    if not shoff or shentsize < 64 or shstrndx >= shnum:
        return {}
    heads = [_fstruct.unpack_from("<IIQQQQ", buf, base + shoff + i * shentsize) for i in range(shnum)]
    names_at = base + heads[shstrndx][4]
    out = {}
    for name_off, sh_type, _, _, offset, size in heads:
        start = names_at + name_off
        end = buf.find(b"\0", start, start + 256)  # a longer name (a kernel's .text.<mangled>) is cut
        name = bytes(buf[start : end if end != -1 else start + 256]).decode("ascii", "replace")
        if sh_type != 8:  # SHT_NOBITS has no bytes in the file
            out[name] = (base + offset, size)
    return out


def cubin(buf, base=0):
    """What a cubin (an EM_CUDA ELF image at ``base``) says of itself."""
    abi, flags = buf[base + 8], _fstruct.unpack_from("<I", buf, base + 48)[0]
    if abi >= 8:
        sm, accel = (flags >> 8) & 0xFF, bool(flags & 0x8)
    else:
        sm, accel = flags & 0xFF, bool(flags & 0x800)
    found = {"kind": "SASS", "sm": sm, "variant": "a" if accel else "", "abi": abi, "compressed": False}
    secs = sections(buf, base)
    tk = secs.get(".note.nv.tkinfo")
    if tk:
        note = bytes(buf[tk[0] : tk[0] + min(tk[1], 4096)])
        rel, opt = RELEASE.search(note), ARCH_OPT.search(note)
        if rel:
            found["toolkit"], found["toolkit_from"] = f"{int(rel.group(1))}.{int(rel.group(2))}", "tkinfo"
        if opt and opt.group(2) and int(opt.group(1)) == sm:
            found["variant"] = opt.group(2).decode()
    note = secs.get(".note.nv.cuinfo")
    if "toolkit" not in found and note and note[1] >= 32:
        # namesz 12 ("NVIDIA Corp\0"), then the descriptor: u16 2, u16 sm, u16 toolkit (130 = 13.0)
        version = _fstruct.unpack_from("<H", buf, note[0] + 28)[0]
        if 10 <= version < 1000:
            found["toolkit"], found["toolkit_from"] = f"{version // 10}.{version % 10}", "cuinfo"
    if "toolkit" not in found:
        found["toolkit"], found["toolkit_from"] = None, "no note"
    return found


def entry(buf, at, decode=None):
    """(object, next offset) of the fatbin entry at ``at``. A compressed payload is judged by
    ``decode(kind, flags, usize, payload, isa, arch, minor)`` (the host's: the fields its decoded
    bytes give, ``unread`` with why); without one it is listed from its header alone."""
    kind, _, hsize, psize, csize, _, minor, major, arch = _fstruct.unpack_from("<HHIQIIHHI", buf, at)
    flags, _, usize = _fstruct.unpack_from("<QQQ", buf, at + 40)
    nxt = at + hsize + psize
    if hsize < 64 or nxt > len(buf):
        raise ValueError(f"fatbin entry at {at} runs past its container")
    variant = "a" if flags & FLAG_A else "f" if flags & FLAG_F else ""
    compressed = bool(flags & (FLAG_LZ4 | FLAG_ZSTD)) or bool(csize)
    obj = {"sm": arch, "variant": variant, "compressed": compressed}
    data_at = at + hsize
    if kind not in (KIND_PTX, KIND_ELF):
        obj.update(kind=f"kind {kind}")
        return obj, nxt
    if kind == KIND_PTX:
        obj.update(kind="PTX", isa=f"{major}.{minor}")
    else:
        obj.update(kind="SASS", abi=minor)
    if compressed and csize > psize:
        obj["unread"] = f"its compressed size {csize} exceeds its payload {psize}"
    elif compressed and decode is None:
        obj["toolkit_from"] = NOT_DECODED
        return obj, nxt
    elif compressed:
        payload = bytes(buf[data_at : data_at + csize])
        obj.update(decode(kind, flags, usize, payload, obj.get("isa"), arch, minor))
    elif kind == KIND_PTX:
        obj.update(ptx_fields(bytes(buf[data_at : data_at + min(psize, PTX_HEAD)]), obj["isa"]))
    elif bytes(buf[data_at : data_at + 4]) == b"\x7fELF" and psize >= 64:
        obj.update(cubin_fields(cubin(buf, data_at), arch, minor))
    else:  # the driver loads an ELF entry's payload as a cubin: other bytes are no code it can run
        obj["unread"] = f"its payload is not an ELF cubin (flags {flags:#x}: compressed by no codec this probe knows?)"
    if obj["kind"] == "SASS" and not obj.get("toolkit"):
        if obj.get("abi") == 8 and arch < 100:
            obj["toolkit"], obj["toolkit_from"] = "13+", "ELF ABI 8 below sm_100"
        else:
            obj["toolkit"] = None
            obj["toolkit_from"] = "unread" if obj.get("unread") else "no note"
    return obj, nxt


def cubin_fields(inner, arch, abi):
    """What a cubin an entry carries adds to the entry: its toolkit, or ``unread`` when the cubin
    contradicts its header."""
    out = {"toolkit": inner.get("toolkit"), "toolkit_from": inner.get("toolkit_from")}
    if inner["sm"] != arch:
        out["unread"] = f"its cubin is for sm_{inner['sm']}, its entry header says sm_{arch}"
    elif inner["abi"] != abi:  # the header's minor is the cubin's ELF ABI (NCCL 2.30.7, cuBLAS 13: tried)
        out["unread"] = f"its cubin's ELF ABI is {inner['abi']}, its entry header says {abi}"
    return out


def ptx_fields(text, isa):
    """The PTX text's own .version (what the driver JIT-compiles), held over the entry header's."""
    try:
        found = ptx_text(text)
    except ValueError as exc:
        return {"unread": f"its PTX has {exc}"}
    return {} if found["isa"] == isa else {"header_isa": isa, "isa": found["isa"]}


def fatbins(buf, start, end, decode=None):
    """Every code object of the containers between ``start`` and ``end``."""
    objs, pos = [], start
    while pos + 16 <= end:
        magic, _, hsize, size = _fstruct.unpack_from("<IHHQ", buf, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # containers are 8-aligned; padding between them
            continue
        at, stop = pos + hsize, min(pos + hsize + size, end)
        while at + 64 <= stop:
            try:
                obj, at = entry(buf, at, decode)
            except (ValueError, _fstruct.error, IndexError) as exc:  # the rest of this container is unread
                why = f"its fatbin container at byte {pos} breaks at byte {at}: {type(exc).__name__}: {exc}"
                objs.append({"kind": "fatbin", "sm": 0, "variant": "", "compressed": False, "unread": why[:200]})
                break
            objs.append(obj)
        pos = max(stop, pos + 16)
    return objs


def container_at(buf, pos):
    """The end of a well-formed fatbin container at ``pos`` (version 1, 16-byte header, a first
    entry of kind PTX or ELF that fits), or None: four magic bytes alone in data are no container."""
    if pos + 16 + 64 > len(buf):
        return None
    _, version, hsize, size = _fstruct.unpack_from("<IHHQ", buf, pos)
    end = pos + hsize + size
    if version != 1 or hsize != 16 or size < 64 or end > len(buf):
        return None
    kind, _, ehsize, psize = _fstruct.unpack_from("<HHIQ", buf, pos + 16)
    if kind not in (KIND_PTX, KIND_ELF) or not 64 <= ehsize <= 4096 or pos + 16 + ehsize + psize > end:
        return None
    return end


def elsewhere(buf, skip, decode=None):
    """The code objects of fatbin containers outside the ``skip`` ranges ((offset, size): the
    .nv_fatbin section): a library can carry a fatbin as data (in .rodata, for cuModuleLoadData)
    and load it itself."""
    objs, ranges, at = [], [], 0
    for start, size in sorted(skip):
        ranges.append((at, start))
        at = max(at, start + size)
    ranges.append((at, len(buf)))
    for start, stop in ranges:
        pos = buf.find(MAGIC_BYTES, start, stop)
        while pos != -1:
            end = container_at(buf, pos)
            if end is not None and end <= stop:
                found = fatbins(buf, pos, end, decode)
                for obj in found:
                    obj["outside"] = True
                objs += found
                pos = buf.find(MAGIC_BYTES, end, stop)
            else:
                pos = buf.find(MAGIC_BYTES, pos + 4, stop)
    return objs


def release(text):
    """The full toolkit version ("12.9.86") a ptxas/nvcc --version or a tkinfo note names, or None."""
    m = RELEASE.search(text)
    return m.group(3).decode() if m else None


def ptx_text(head):
    version, target = PTX_VERSION.search(head), PTX_TARGET.search(head)
    if not version:
        raise ValueError("no .version directive")
    obj = {"kind": "PTX", "isa": f"{int(version.group(1))}.{int(version.group(2))}", "compressed": False}
    obj.update(sm=int(target.group(1)) if target else 0, variant=target.group(2).decode() if target else "")
    return obj


def gpu_shape(name, head):
    """Which reading a file gets from its name and first 64 bytes: "ptx", "fatbin", "elf" (an
    ELF64 little-endian file, a cubin included), or None (no GPU code can be in it)."""
    if name.endswith(".ptx"):
        return "ptx"
    if len(head) >= 4 and _fstruct.unpack_from("<I", head)[0] == FATBIN_MAGIC:
        return "fatbin"
    if len(head) >= 64 and head[:4] == b"\x7fELF" and head[4] == 2 and head[5] == 1:
        return "elf"
    return None


def inspect_buffer(shape, buf, decode=None):
    """(shape, code objects) of a file's bytes ``buf`` read as ``shape`` (gpu_shape's), or None
    when it holds no GPU code."""
    if shape == "ptx":
        return "ptx", [ptx_text(bytes(buf[: 64 + PTX_HEAD]))]
    if shape == "fatbin":
        return "fatbin", fatbins(buf, 0, len(buf), decode)
    if _fstruct.unpack_from("<H", buf, 18)[0] == EM_CUDA:
        return "cubin", [cubin(buf)]
    try:
        secs = sections(buf)
    except (_fstruct.error, IndexError):
        secs = {}  # the loader needs no section table: its fatbins are found by their magic below
    fat = secs.get(".nv_fatbin")
    objs = fatbins(buf, fat[0], fat[0] + fat[1], decode) if fat and fat[1] else []
    # __nv_relfatbin holds relocatable cubins (-rdc) for a later device link: the driver never
    # loads them (cuobjdump does not list them); every other fatbin outside .nv_fatbin is read
    skip = [r for r in (fat, secs.get("__nv_relfatbin")) if r and r[1]]
    objs += elsewhere(buf, skip, decode)
    return ("elf", objs) if objs else None


def summarize(objs):
    """Identical objects counted once: [{kind, arch, isa, toolkit, ..., count}]."""
    counts: dict = {}
    for obj in objs:
        prefix = "compute_" if obj["kind"] == "PTX" else "sm_"
        obj["arch"] = f"{prefix}{obj['sm']}{obj.get('variant', '')}"
        key = tuple(sorted((k, v) for k, v in obj.items() if v is not None))
        counts[key] = counts.get(key, 0) + 1
    return [dict(key, count=n) for key, n in sorted(counts.items())]


def listed(objects):
    """A file's summarized objects as their headers list them ("SASS sm_90a abi=7 compressed" ->
    count): what the probe (headers only) and the host (decoded) both see, so the two compare."""
    out: dict = {}
    for obj in objects:
        fields = dict(obj, isa=obj.get("header_isa", obj.get("isa")))
        key = " ".join(f"{k}={fields[k]}" for k in LISTED if fields.get(k) not in (None, False))
        out[key] = out.get(key, 0) + obj.get("count", 1)
    return out

"""Probe: every piece of GPU code under the given roots, and the run-time assemblers.

GPU code lives in these shapes: the ``.nv_fatbin`` section of an ELF file (every ELF file is
opened, whatever its name), any other well-formed fatbin container in an ELF file (data a library
loads itself; ``__nv_relfatbin``'s relocatable cubins are left out: the driver never loads them), a
standalone cubin (an ELF file of machine EM_CUDA, as FlashInfer ships them), and standalone
``.fatbin``/``.ptx`` files; under the roots, and in every library their NEEDED closure reaches
outside them (``needed_by``). For each code object it reports its kind (SASS or PTX), its
architecture with the variant (``a`` arch-specific, ``f`` family, or generic), the PTX ISA
version, the toolkit that built it and whether it is compressed. Files are mmapped: an
uncompressed entry costs its headers; a compressed one is decoded (pure Python, _unpack.py), within
the request's ``budget`` seconds, and one that cannot be is "unread" with why.

The layouts (written from what this project's tests pin against cuobjdump 13.x on real
binaries, tests/unit/test_gpucode.py):
- a fatbin container: magic 0xBA55ED50, u16 version, u16 header size, u64 size of what follows;
  then entries back to back, each a header (u16 kind: 1 PTX, 2 ELF; u16; u32 header size; u64
  payload size; u32 compressed size; u32; u16 minor, u16 major; u32 arch; u32, u32; u64 flags;
  u64; u64 uncompressed size) and its payload. For PTX major.minor is the ISA; for ELF it is the
  cubin's ELF ABI version (1.7, 1.8). Flags: 0x1 64-bit, 0x10 Linux, 0x2000 LZ4 compressed,
  0x8000 ZSTD compressed, 0x100000 ``a``, 0x200000 ``f``.
- a cubin: ELF, e_machine 190. EI_ABIVERSION 7 keeps the SM in the low byte of e_flags and
  ``a`` at 0x800; ABI 8 keeps the SM in bits 8-15 and ``a`` at 0x8 (LLVM's EF_CUDA_* constants).
  ``f`` is not in e_flags: ptxas writes its options (``-arch sm_100f``) into
  ``.note.nv.tkinfo``, beside "Cuda compilation tools, release 12.9, V12.9.86".
  ``.note.nv.cuinfo`` (ptxas 13) carries the toolkit as major*10+minor (130); NVRTC 12.9's cubins
  below sm_100 carry no note at all: their toolkit is unknown ("no note").
- a compressed entry (0x2000: an LZ4 block; 0x8000: a ZSTD frame) decodes to a cubin or PTX read
  as above; a cubin with no note whose ELF ABI is 8 below sm_100 can only come from ptxas 13 or
  later (ptxas 12.x writes ABI 7 there: NVRTC 12.9.86 and NCCL 2.30.7's cubins, tried), reported
  as "13+ (inferred from ELF ABI 8)".

Request: {"roots": [...], "cuda_home": "/usr/local/cuda" | null, "env": {TRITON_PTXAS_PATH: ...},
"ld_library_path": "...", "budget": seconds | null, "cuda_major": 12 | null}.
"""

import hashlib
import mmap
import os
import re
import struct
import subprocess
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time _report.py, _dyn.py and _unpack.py are prepended
    from builder.checks.probes._dyn import elf_dynamic
    from builder.checks.probes._report import report
    from builder.checks.probes._unpack import UnpackError, lz4_block, lz4_walk, zstd

FATBIN_MAGIC = 0xBA55ED50
EM_CUDA = 190
KIND_PTX, KIND_ELF = 1, 2
FLAG_LZ4, FLAG_ZSTD, FLAG_A, FLAG_F = 0x2000, 0x8000, 0x100000, 0x200000
RELEASE = re.compile(rb"release (\d+)\.(\d+), V(\d+\.\d+\.\d+)")
ARCH_OPT = re.compile(rb"-arch[ =]sm_(\d+)([af]?)")
PTX_VERSION = re.compile(rb"^\s*\.version\s+(\d+)\.(\d+)", re.M)
PTX_TARGET = re.compile(rb"^\s*\.target\s+(?:sm|compute)_(\d+)([af]?)", re.M)
ASSEMBLERS = ("ptxas", "ptxas-blackwell", "nvcc")
TOKENSPEED = "tokenspeed"


def sections(buf, base=0):
    """name -> (offset, size) of an ELF64 little-endian image at ``base`` of ``buf``."""
    shoff = struct.unpack_from("<Q", buf, base + 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", buf, base + 0x3A)
    if not shoff or shentsize < 64 or shstrndx >= shnum:
        return {}
    heads = [struct.unpack_from("<IIQQQQ", buf, base + shoff + i * shentsize) for i in range(shnum)]
    names_at = base + heads[shstrndx][4]
    out = {}
    for name_off, sh_type, _, _, offset, size in heads:
        start = names_at + name_off
        end = buf.find(b"\0", start, start + 256)  # a longer name (a kernel's .text.<mangled>) is cut
        name = bytes(buf[start : end if end != -1 else start + 256]).decode("ascii", "replace")
        if sh_type != 8:  # SHT_NOBITS has no bytes in the file
            out[name] = (base + offset, size)
    return out


def cubin(buf, base=0, size=None):
    """What a cubin (an EM_CUDA ELF image at ``base``) says of itself."""
    abi, flags = buf[base + 8], struct.unpack_from("<I", buf, base + 48)[0]
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
        version = struct.unpack_from("<H", buf, note[0] + 28)[0]
        if 10 <= version < 1000:
            found["toolkit"], found["toolkit_from"] = f"{version // 10}.{version % 10}", "cuinfo"
    if "toolkit" not in found:
        found["toolkit"], found["toolkit_from"] = None, "no note"
    return found


MAX_ENTRY = 256 << 20  # a decompressed entry above this is not decoded (cu129's largest cubins are tens of MB)
PTX_HEAD = 16384  # a PTX text's .version and .target lines sit in its first lines
_DEADLINE: list[float] = []  # the request's time budget for decoding (monotonic), when it sets one
_MAJOR: list[int] = []  # the CUDA major the target claims (the request's cuda_major), when it says
_JUDGED: dict[tuple, dict] = {}  # what each distinct compressed payload said (fields, not bytes)


def unpack(flags, payload, size, stop=None):
    """The decoded payload of a compressed entry; raises ValueError (with why) when it cannot be."""
    codec = flags & (FLAG_LZ4 | FLAG_ZSTD)
    if codec not in (FLAG_LZ4, FLAG_ZSTD):
        raise UnpackError(f"compression flags {flags:#x} name no codec this probe knows (LZ4 0x2000, ZSTD 0x8000)")
    if _DEADLINE and time.monotonic() > _DEADLINE[0]:
        raise UnpackError("the decoding budget of this run is spent (K3_GPUCODE_BUDGET)")
    decode = lz4_block if codec == FLAG_LZ4 else zstd
    try:
        return decode(payload, size, MAX_ENTRY, stop)
    except (IndexError, struct.error) as exc:
        raise UnpackError(f"corrupt: {type(exc).__name__}: {exc}") from None


def judged(kind, flags, usize, payload, judge, context=()):
    """``judge(payload)`` (what a compressed entry says: a few fields, never its bytes), once per
    distinct payload: the same cubin in two containers is decoded once. ``context``: the entry
    header's fields the answer is held to (arch, ABI, ISA), so a cached answer is never another
    header's."""
    key = (kind, flags, usize, hashlib.sha256(payload).digest(), context)
    if key not in _JUDGED:
        _JUDGED[key] = judge(payload)
    return dict(_JUDGED[key])


def entry(buf, at):
    """(object, next offset) of the fatbin entry at ``at``; a compressed payload is decoded first
    (pure Python: _unpack.py), and one that cannot be is "unread", with why."""
    kind, _, hsize, psize, csize, _, minor, major, arch = struct.unpack_from("<HHIQIIHHI", buf, at)
    flags, _, usize = struct.unpack_from("<QQQ", buf, at + 40)
    nxt = at + hsize + psize
    if hsize < 64 or nxt > len(buf):
        raise ValueError(f"fatbin entry at {at} runs past its container")
    variant = "a" if flags & FLAG_A else "f" if flags & FLAG_F else ""
    compressed = bool(flags & (FLAG_LZ4 | FLAG_ZSTD)) or bool(csize)
    obj: dict[str, Any] = {"sm": arch, "variant": variant, "compressed": compressed}
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
    elif compressed:
        payload = bytes(buf[data_at : data_at + csize])
        isa = obj.get("isa")
        obj.update(
            judged(
                kind,
                flags,
                usize,
                payload,
                lambda p: _judge(kind, flags, usize, p, isa, arch, minor),
                (isa, arch, minor),
            )
        )
    elif kind == KIND_PTX:
        obj.update(_ptx_fields(bytes(buf[data_at : data_at + min(psize, PTX_HEAD)]), obj["isa"]))
    elif bytes(buf[data_at : data_at + 4]) == b"\x7fELF" and psize >= 64:
        inner = cubin(buf, data_at)
        obj.update(_cubin_fields(inner, arch, minor))
    else:  # the driver loads an ELF entry's payload as a cubin: other bytes are no code it can run
        obj["unread"] = f"its payload is not an ELF cubin (flags {flags:#x}: compressed by no codec this probe knows?)"
    if obj["kind"] == "SASS" and not obj.get("toolkit"):
        if obj.get("abi") == 8 and arch < 100:
            obj["toolkit"], obj["toolkit_from"] = "13+", "ELF ABI 8 below sm_100"
        else:
            obj["toolkit"] = None
            obj["toolkit_from"] = "unread" if obj.get("unread") else "no note"
    return obj, nxt


def _judge(kind, flags, usize, payload, isa, arch, minor):
    """The fields a compressed entry's decoded payload gives (``unread`` with why when it cannot)."""
    try:
        if kind == KIND_PTX:
            return _ptx_fields(unpack(flags, payload, usize, PTX_HEAD), isa)
        return _cubin_fields(compressed_cubin(flags, payload, usize), arch, minor)
    except ValueError as exc:
        return {"unread": str(exc)[:200]}


def _cubin_fields(inner, arch, abi):
    out = {"toolkit": inner.get("toolkit"), "toolkit_from": inner.get("toolkit_from")}
    if inner["sm"] != arch:
        out["unread"] = f"its cubin is for sm_{inner['sm']}, its entry header says sm_{arch}"
    elif inner["abi"] != abi:  # the header's minor is the cubin's ELF ABI (NCCL 2.30.7, cuBLAS 13: tried)
        out["unread"] = f"its cubin's ELF ABI is {inner['abi']}, its entry header says {abi}"
    return out


def _ptx_fields(text, isa):
    """The PTX text's own .version (what the driver JIT-compiles), held over the entry header's."""
    try:
        found = ptx_text(text)
    except ValueError as exc:
        return {"unread": f"its PTX has {exc}"}
    return {} if found["isa"] == isa else {"header_isa": isa, "isa": found["isa"]}


STEPS = (4096, 65536, 1 << 20)  # decoded prefixes tried before a whole compressed cubin


def compressed_cubin(flags, payload, size):
    """What a compressed cubin says of itself (``cubin``'s answer), from as short a decoded prefix
    as settles it: ptxas writes .shstrtab first, at 0x40, its note names before ".nv.info", and the
    tkinfo note after the symbol table. A prefix that names no note past ".nv.info" is "no note";
    one that holds the tkinfo release line gives the toolkit; else the whole cubin is decoded.
    Pure-Python decoding is slow (about 5 MB/s LZ4): most cubins settle in their first 4 KiB."""
    for stop in STEPS:
        if stop >= size:
            break
        found = cubin_head(unpack(flags, payload, size, stop))
        if found is not None:
            if not _fails(found):  # a verdict that would pass holds only if the rest decodes too
                whole(flags, payload, size)
            return found
    data = unpack(flags, payload, size)
    if data[:4] != b"\x7fELF":
        raise UnpackError("its decoded payload is not an ELF cubin")
    return cubin(data)


def _fails(found):
    """Does this toolkit fail the request's CUDA major whatever the rest of the cubin holds? Then
    decoding the rest could only add a second failure (unread)."""
    major = _MAJOR[0] if _MAJOR else None
    toolkit = found.get("toolkit")
    return major is not None and toolkit is not None and int(toolkit.split(".")[0]) != major


def whole(flags, payload, size):
    """Raise UnpackError unless the whole payload decodes to ``size`` bytes (LZ4: its structure
    walked, nothing written; ZSTD: decoded, as its entropy stages leave no shorter check)."""
    if _DEADLINE and time.monotonic() > _DEADLINE[0]:
        raise UnpackError("the decoding budget of this run is spent (K3_GPUCODE_BUDGET)")
    try:
        if flags & FLAG_LZ4:
            lz4_walk(payload, size)
        else:
            unpack(flags, payload, size)
    except (IndexError, struct.error) as exc:
        raise UnpackError(f"corrupt: {type(exc).__name__}: {exc}") from None


def cubin_head(data):
    """``cubin``'s answer from a cubin's first bytes, or None when they do not settle its notes."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise UnpackError("its decoded payload is not an ELF cubin")
    abi, flags = data[8], struct.unpack_from("<I", data, 48)[0]
    sm, accel = ((flags >> 8) & 0xFF, bool(flags & 0x8)) if abi >= 8 else (flags & 0xFF, bool(flags & 0x800))
    found = {"kind": "SASS", "sm": sm, "variant": "a" if accel else "", "abi": abi, "compressed": False}
    rel = RELEASE.search(data)
    if rel:
        opt = ARCH_OPT.search(data)
        found["toolkit"], found["toolkit_from"] = f"{int(rel.group(1))}.{int(rel.group(2))}", "tkinfo"
        if opt and opt.group(2) and int(opt.group(1)) == sm:
            found["variant"] = opt.group(2).decode()
        return found
    names = data[0x40:]
    if names.startswith(b"\0.shstrtab\0") and b".nv.info" in names and b".note.nv." not in names:
        found["toolkit"], found["toolkit_from"] = None, "no note"
        return found
    return None


def fatbins(buf, start, end):
    """Every code object of the containers between ``start`` and ``end``."""
    objs, pos = [], start
    while pos + 16 <= end:
        magic, _, hsize, size = struct.unpack_from("<IHHQ", buf, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # containers are 8-aligned; padding between them
            continue
        at, stop = pos + hsize, min(pos + hsize + size, end)
        while at + 64 <= stop:
            try:
                obj, at = entry(buf, at)
            except (ValueError, struct.error, IndexError) as exc:  # the rest of this container is unread
                why = f"its fatbin container at byte {pos} breaks at byte {at}: {type(exc).__name__}: {exc}"
                objs.append({"kind": "fatbin", "sm": 0, "variant": "", "compressed": False, "unread": why[:200]})
                break
            objs.append(obj)
        pos = max(stop, pos + 16)
    return objs


MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)


def container_at(buf, pos):
    """The end of a well-formed fatbin container at ``pos`` (version 1, 16-byte header, a first
    entry of kind PTX or ELF that fits), or None: four magic bytes alone in data are no container."""
    if pos + 16 + 64 > len(buf):
        return None
    _, version, hsize, size = struct.unpack_from("<IHHQ", buf, pos)
    end = pos + hsize + size
    if version != 1 or hsize != 16 or size < 64 or end > len(buf):
        return None
    kind, _, ehsize, psize = struct.unpack_from("<HHIQ", buf, pos + 16)
    if kind not in (KIND_PTX, KIND_ELF) or not 64 <= ehsize <= 4096 or pos + 16 + ehsize + psize > end:
        return None
    return end


def elsewhere(buf, skip):
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
                found = fatbins(buf, pos, end)
                for obj in found:
                    obj["outside"] = True
                objs += found
                pos = buf.find(MAGIC_BYTES, end, stop)
            else:
                pos = buf.find(MAGIC_BYTES, pos + 4, stop)
    return objs


def ptx_text(head):
    version, target = PTX_VERSION.search(head), PTX_TARGET.search(head)
    if not version:
        raise ValueError("no .version directive")
    obj = {"kind": "PTX", "isa": f"{int(version.group(1))}.{int(version.group(2))}", "compressed": False}
    obj.update(sm=int(target.group(1)) if target else 0, variant=target.group(2).decode() if target else "")
    return obj


def inspect(path):
    """(shape, code objects) of one file, or None when it holds no GPU code."""
    with open(path, "rb") as fh:
        head = fh.read(64)
        if path.endswith(".ptx"):
            return "ptx", [ptx_text(head + fh.read(16384))]
        is_elf = head[:4] == b"\x7fELF"
        is_fatbin = len(head) >= 4 and struct.unpack_from("<I", head)[0] == FATBIN_MAGIC
        if not (is_elf or is_fatbin) or os.fstat(fh.fileno()).st_size < 64:
            return None
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if is_fatbin:
                return "fatbin", fatbins(buf, 0, len(buf))
            if head[4] != 2 or head[5] != 1:
                return None  # 32-bit or big-endian: no CUDA code object is either
            if struct.unpack_from("<H", head, 18)[0] == EM_CUDA:
                return "cubin", [cubin(buf)]
            try:
                secs = sections(buf)
            except (struct.error, IndexError):
                secs = {}  # the loader needs no section table: its fatbins are found by their magic below
            fat = secs.get(".nv_fatbin")
            objs = fatbins(buf, fat[0], fat[0] + fat[1]) if fat and fat[1] else []
            # __nv_relfatbin holds relocatable cubins (-rdc) for a later device link: the driver never
            # loads them (cuobjdump does not list them); every other fatbin outside .nv_fatbin is read
            skip = [r for r in (fat, secs.get("__nv_relfatbin")) if r and r[1]]
            objs += elsewhere(buf, skip)
            return ("elf", objs) if objs else None


def summarize(objs):
    """Identical objects counted once: [{kind, arch, isa, toolkit, ..., count}]."""
    counts: dict[tuple, int] = {}
    for obj in objs:
        prefix = "compute_" if obj["kind"] == "PTX" else "sm_"
        obj["arch"] = f"{prefix}{obj['sm']}{obj.get('variant', '')}"
        key = tuple(sorted((k, v) for k, v in obj.items() if v is not None))
        counts[key] = counts.get(key, 0) + 1
    return [dict(key, count=n) for key, n in sorted(counts.items())]


def version_of(path):
    try:
        out = subprocess.run([path, "--version"], capture_output=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{type(exc).__name__}: {exc}"[:200]
    m = RELEASE.search(out)
    return (m.group(3).decode(), None) if m else (None, f"no release in: {out[-200:]!r}")


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
    budget = req.get("budget")
    _DEADLINE[:] = [started + budget] if budget else []
    _MAJOR[:] = [req["cuda_major"]] if isinstance(req.get("cuda_major"), int) else []
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

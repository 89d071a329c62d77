"""k3smoke's device pass: what nvcc does for a .cu file's device code, with NVRTC.

No nvcc 12.9 is on PyPI, but its runtime compiler is (nvidia-cuda-nvrtc-cu12 12.9.86, in
build-requirements.txt): it compiles CUDA C++ to SASS (a cubin) for sm_80, sm_90a, sm_100a,
sm_100f, sm_103a ... and to PTX ISA 8.8 on a machine with no GPU. For each -gencode the
source's CMake asks for (vLLM's set_gencode_flags_for_srcs: "9.0a" is code=sm_90a, "8.0+PTX" is
code=sm_80 and code=compute_80), this compiles the file, then does what nvcc's `fatbinary` and
its generated host stub do:

- the cubins and the PTX go into one fat binary container (magic 0xBA55ED50), entries in
  gencode order, laid out as nvcc 12.9 lays them out (described in `entry`);
- a C file puts that container into a `.nv_fatbin` section and the wrapper that points at it
  (magic 0x466243B1, version 1) into `.nvFatBinSegment`, as nvcc's <file>.fatbin.c does, with
  the data written out as `.quad` words, so a compiler cache keys on the device code too;
- each cubin is also written on its own (`<name>.<sm_XX>.cubin`), as FlashInfer's cubin
  package ships its kernels beside the library.

Standard library only: it runs in the build stage with the build venv's Python, network off.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import re
import struct
import sys

FATBIN_MAGIC = 0xBA55ED50
WRAPPER_MAGIC = 0x466243B1  # __fatBinC_Wrapper_t, fatbinary_section.h's FATBINC_MAGIC
KIND_PTX, KIND_ELF = 1, 2
# Entry flags, as nvcc 12.9's fatbinary sets them (read from its containers in CUDA 12.9 libraries
# such as libcurand 10.3.10.19, and from what fatbinary writes for these inputs):
FLAG_64BIT_LINUX = 0x11  # compile_size 64bit, host linux
FLAG_ARCH_SPECIFIC = 0x0010_0000  # an `a` target: sm_90a, sm_100a
FLAG_FAMILY = 0x0020_0000  # an `f` target: sm_100f
FLAG_COMPAT = 0x0100_0000  # the entry's header carries the cubin's .nv.compat records


def libnvrtc() -> ctypes.CDLL:
    """libnvrtc.so.12 of the nvidia-cuda-nvrtc-cu12 wheel in this interpreter's environment."""
    spec = importlib.util.find_spec("nvidia.cuda_nvrtc")
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(location, "lib", "libnvrtc.so.12")
        if os.path.exists(path):
            return ctypes.CDLL(path)
    sys.exit("nvrtc_fatbin: no nvidia-cuda-nvrtc-cu12 (libnvrtc.so.12) in this Python's environment")


def nvrtc_version(lib: ctypes.CDLL) -> str:
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


def _output(lib: ctypes.CDLL, prog: ctypes.c_void_p, what: str) -> bytes:
    size = ctypes.c_size_t()
    _check(lib, getattr(lib, f"nvrtcGet{what}Size")(prog, ctypes.byref(size)), f"nvrtcGet{what}Size")
    buf = ctypes.create_string_buffer(size.value)
    _check(lib, getattr(lib, f"nvrtcGet{what}")(prog, buf), f"nvrtcGet{what}")
    return buf.raw


def _check(lib: ctypes.CDLL, status: int, call: str, log: str = "") -> None:
    if status:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        sys.exit(f"nvrtc_fatbin: {call}: {lib.nvrtcGetErrorString(status).decode()}\n{log}")


def compile_one(lib: ctypes.CDLL, source: bytes, name: str, target: str) -> bytes:
    """A cubin for sm_XX[af], the PTX text for compute_XX[af]."""
    prog = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source, name.encode(), 0, None, None), "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={target}".encode(), b"--std=c++17"]
        status = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        log = _output(lib, prog, "ProgramLog").rstrip(b"\0").decode(errors="replace")
        _check(lib, status, f"compiling {name} for {target}", log)
        return _output(lib, prog, "CUBIN" if target.startswith("sm_") else "PTX")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def gencodes(archs: list[str]) -> list[str]:
    """NVRTC targets for CMake-style archs, in order: 9.0a -> sm_90a; 8.0+PTX -> sm_80, compute_80."""
    out = []
    for arch in archs:
        base = arch.removesuffix("+PTX")
        if not re.fullmatch(r"[0-9]+\.[0-9][af]?", base):
            sys.exit(f"nvrtc_fatbin: {arch!r} is not an arch such as 9.0, 10.0a, 10.0f or 8.0+PTX")
        digits = base.replace(".", "")
        out.append(f"sm_{digits}")
        if arch.endswith("+PTX"):
            out.append(f"compute_{digits}")
    return out


def _arch_fields(target: str) -> tuple[int, int]:
    """(sm number, suffix flag) of sm_100a / compute_80 / sm_103f."""
    m = re.fullmatch(r"(?:sm|compute)_([0-9]+)([af]?)", target)
    assert m, target
    return int(m.group(1)), {"a": FLAG_ARCH_SPECIFIC, "f": FLAG_FAMILY, "": 0}[m.group(2)]


def _section(cubin: bytes, wanted: str) -> bytes | None:
    """The contents of a named section of a 64-bit little-endian ELF file."""
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]
    for name, _, _, _, offset, size in headers:
        end = cubin.index(b"\0", names_at + name)
        if cubin[names_at + name : end].decode() == wanted:
            return cubin[offset : offset + size]
    return None


def _pad8(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 8)


def entry(kind: int, target: str, version: tuple[int, int], payload: bytes, extension: bytes | None) -> bytes:
    """One entry: a header, then the payload padded to 8 bytes.

    The 64-byte header: kind (1 PTX, 2 ELF), 0x0101, header size, payload size; the compressed
    size (0: stored as is) and the offset of the extension (0x40, or 0 without one); the code
    version as minor, major (a cubin's ELF ABI version and 1, cuobjdump's "code version = [1,8]";
    a PTX's ISA, [8,8]); the sm number (100 for sm_100a); the identifier's offset and length (0:
    nvcc passes none); the flags; 8 reserved bytes; the uncompressed size (0, not compressed).
    The extension, when there is one: its data's offset in the header (0x48) and length, the data,
    a NUL, padded to 8. nvcc writes one for every PTX (ptxas options, empty here) and for a cubin
    with a .nv.compat section (sm_100 and later), whose 4-byte records it carries each moved up
    one byte.
    """
    sm, suffix = _arch_fields(target)
    flags = FLAG_64BIT_LINUX | suffix | (FLAG_COMPAT if kind == KIND_ELF and extension else 0)
    ext = b"" if extension is None else _pad8(struct.pack("<II", 0x48, len(extension)) + extension + b"\0")
    size = 64 + len(ext)
    head = struct.pack("<HHIQIIHHIIIQQQ", kind, 0x0101, size, len(payload), 0, 0x40 if ext else 0, version[1],
                       version[0], sm, 0, 0, flags, 0, 0)
    return head + ext + payload


def elf_entry(target: str, cubin: bytes) -> bytes:
    compat = _section(cubin, ".nv.compat")
    moved = None if compat is None else b"".join(b"\0" + compat[i : i + 3] for i in range(0, len(compat), 4))
    return entry(KIND_ELF, target, (1, cubin[8]), _pad8(cubin), moved)


def ptx_entry(target: str, ptx: bytes) -> bytes:
    """nvcc's fatbinary stores PTX without comments and with each run of blanks made one space,
    NUL-terminated and padded to the next 8 bytes past the NUL."""
    text = ptx.rstrip(b"\0").decode()
    isa = re.search(r"^\s*\.version\s+([0-9]+)\.([0-9]+)", text, re.M)
    if not isa:
        sys.exit(f"nvrtc_fatbin: the PTX for {target} has no .version directive")
    lines = (re.sub(r"[ \t]+", " ", line.split("//")[0]).strip(" ") for line in text.split("\n"))
    stored = "\n".join(lines).encode() + b"\0"
    stored += b"\0" * (8 - len(stored) % 8)
    return entry(KIND_PTX, target, (int(isa.group(1)), int(isa.group(2))), stored, b"")


def container(entries: list[bytes]) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body


def host_stub(fatbin: bytes, symbol: str, note: str) -> str:
    """C source putting ``fatbin`` into .nv_fatbin and its wrapper into .nvFatBinSegment."""
    words = struct.unpack(f"<{len(fatbin) // 8}Q", fatbin)
    rows = [",".join(f"0x{w:016x}" for w in words[i : i + 4]) for i in range(0, len(words), 4)]
    quads = "".join(f'".quad {row}\\n"\n' for row in rows)
    return (
        f"/* Generated by tools/nvrtc_fatbin.py: {note}. Like nvcc's <file>.fatbin.c. */\n"
        f'asm(".section .nv_fatbin, \\"a\\"\\n"\n".align 8\\n"\n"{symbol}:\\n"\n{quads}".text\\n");\n'
        f"extern const unsigned long long {symbol}[{len(words)}];\n"
        "typedef struct { int magic; int version; const unsigned long long *data; void *filename_or_fatbins; }"
        f" {symbol}_wrapper_t;\n"
        f'__attribute__((used, aligned(8), section(".nvFatBinSegment")))\n'
        f"static const {symbol}_wrapper_t {symbol}_wrapper = {{0x{WRAPPER_MAGIC:x}, 1, {symbol}, 0}};\n"
    )


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", action="store_true", help="print NVRTC's CUDA version and exit")
    ap.add_argument("--source", help="the .cu file")
    ap.add_argument("--name", help="the kernel's name: <name>.fatbin.c, <name>.<sm_XX>.cubin")
    ap.add_argument("--archs", help="CMake-style archs, ';' or ',' between: 8.0+PTX,9.0a,10.0f")
    ap.add_argument("--out-dir", help="where the host stub and the fat binary go")
    ap.add_argument("--cubin-dir", help="where the standalone cubins go")
    args = ap.parse_args(argv)
    lib = libnvrtc()
    if args.version:
        print(nvrtc_version(lib))
        return 0
    if not (args.source and args.name and args.archs and args.out_dir and args.cubin_dir):
        ap.error("--source, --name, --archs, --out-dir and --cubin-dir are required")
    with open(args.source, "rb") as fh:
        source = fh.read()
    os.makedirs(args.out_dir, exist_ok=True)
    os.makedirs(args.cubin_dir, exist_ok=True)
    entries = []
    for target in gencodes([a for a in re.split(r"[;,]", args.archs) if a]):
        code = compile_one(lib, source, os.path.basename(args.source), target)
        if target.startswith("sm_"):
            entries.append(elf_entry(target, code))
            _write(os.path.join(args.cubin_dir, f"{args.name}.{target}.cubin"), code)
        else:
            entries.append(ptx_entry(target, code))
    fatbin = container(entries)
    _write(os.path.join(args.out_dir, f"{args.name}.fatbin"), fatbin)
    note = f"{os.path.basename(args.source)} for {args.archs} (NVRTC {nvrtc_version(lib)})"
    _write(os.path.join(args.out_dir, f"{args.name}.fatbin.c"), host_stub(fatbin, f"k3_fatbin_{args.name}", note).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())

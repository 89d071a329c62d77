"""GPU code read on the host (issue 49, 51): the facts ``gpu_code`` and ``gpu_coverage`` judge.

Every file that can hold GPU code is read by the tool's own code from the image's files as the
engine exports them (imagefiles.py streams them here): nothing of the image runs, so a replaced
interpreter or standard library cannot hide code from the checks. The reading is the gpucode
probe's own (probes/_fatbin.py, imported here and prepended there: one place per rule); what the
host adds is decoding. Compressed fatbin entries (LZ4 blocks, ZSTD frames) are decoded with the C
decoders of the tool's environment (``lz4``, ``zstandard``), or with the probe's pure-Python ones
(probes/_unpack.py) when those are not importable. Files are spooled to an unnamed temporary file
(no name from the image is ever a path on the host) and mapped; what a file holds is kept per
sha256 (gpucache.py), so identical bytes are read once.
"""

from __future__ import annotations

import importlib
import mmap
import struct
import tempfile
import time
from typing import IO, Any

from builder.checks import gpucache
from builder.checks.probes import _fatbin, _unpack


def _optional(name: str) -> Any:
    """A C decoder module of the tool's environment, or None: the pure-Python decoder stands in."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


zstandard = _optional("zstandard")
lz4block = _optional("lz4.block")

READER = "1"  # the reader's version: a change to what it reports changes it (the cache keys on it)
MAX_FILE = 8 << 30  # bytes of one file spooled on the host (torch's libtorch_cuda.so is about 1.5 GB)
MAX_ENTRY = 256 << 20  # a decompressed entry above this is not decoded (cu129's largest cubins are tens of MB)
STEPS = (4096, 65536, 1 << 20)  # decoded prefixes tried before a whole compressed cubin (pure Python only)
UnpackError = _unpack.UnpackError


class Codecs:
    """The LZ4 block and ZSTD frame decoders: C where importable (``fast``), else pure Python.
    Either returns exactly the ``size`` bytes the entry header states (or its first ``stop``), or
    raises UnpackError; neither writes past ``limit``. Past ``deadline`` (monotonic) nothing more
    is decoded: those entries are unread."""

    def __init__(self, fast: bool = True, deadline: float | None = None) -> None:
        self.c_lz4 = fast and lz4block is not None
        self.c_zstd = fast and zstandard is not None
        self.deadline = deadline
        self.spent = False  # an entry was left unread for the deadline: not an answer to keep

    def name(self) -> str:
        return f"LZ4 {'C' if self.c_lz4 else 'pure Python'}, ZSTD {'C' if self.c_zstd else 'pure Python'}"

    def fast(self, flags: int) -> bool:
        return self.c_lz4 if flags & _fatbin.FLAG_LZ4 else self.c_zstd

    def unpack(self, flags: int, payload: bytes, size: int, stop: int | None = None) -> bytes:
        codec = flags & (_fatbin.FLAG_LZ4 | _fatbin.FLAG_ZSTD)
        if codec not in (_fatbin.FLAG_LZ4, _fatbin.FLAG_ZSTD):
            raise UnpackError(f"compression flags {flags:#x} name no codec this reader knows (LZ4 0x2000, ZSTD 0x8000)")
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.spent = True
            raise UnpackError("the decoding time of this check is spent (K3_CHECK_TIMEOUT)")
        if size > MAX_ENTRY:
            raise UnpackError(f"states {size} bytes, over the {MAX_ENTRY}-byte cap")
        try:
            if codec == _fatbin.FLAG_LZ4:
                return (
                    self._lz4(payload, size, stop) if self.c_lz4 else _unpack.lz4_block(payload, size, MAX_ENTRY, stop)
                )
            return self._zstd(payload, size, stop) if self.c_zstd else _unpack.zstd(payload, size, MAX_ENTRY, stop)
        except (IndexError, struct.error) as exc:
            raise UnpackError(f"corrupt: {type(exc).__name__}: {exc}") from None

    def _lz4(self, src: bytes, size: int, stop: int | None) -> bytes:
        try:
            out = lz4block.decompress(src, uncompressed_size=size)
        except Exception as exc:  # noqa: BLE001 - lz4.block.LZ4BlockError, MemoryError for a size it refuses
            raise UnpackError(f"LZ4 block does not decode: {exc}"[:200]) from None
        if len(out) != size:
            raise UnpackError(f"decodes to {len(out)} bytes, the header states {size}")
        return out[:stop] if stop is not None else out

    def _zstd(self, src: bytes, size: int, stop: int | None) -> bytes:
        out = bytearray()
        for frame in zstd_frames(src):
            reader = zstandard.ZstdDecompressor().stream_reader(frame, read_across_frames=False)
            try:
                out += reader.read(size - len(out) + 1)
            except zstandard.ZstdError as exc:
                raise UnpackError(f"ZSTD frame does not decode: {exc}"[:200]) from None
            if len(out) > size:
                raise UnpackError(f"decodes past the {size} bytes the header states")
        if len(out) != size:
            raise UnpackError(f"decodes to {len(out)} bytes, the header states {size}")
        return bytes(out[:stop] if stop is not None else out)


def zstd_frames(src: bytes) -> list[bytes]:
    """The ZSTD frames of ``src`` as the pure decoder walks them (RFC 8878: skippable frames
    skipped, zero padding after the last frame allowed), each cut at its end by its block headers."""
    frames, pos = [], 0
    while pos + 4 <= len(src):
        magic = int.from_bytes(src[pos : pos + 4], "little")
        if 0x184D2A50 <= magic <= 0x184D2A5F:
            pos += 8 + int.from_bytes(src[pos + 4 : pos + 8], "little")
            continue
        if magic != _unpack.ZSTD_MAGIC:
            if any(src[pos:]):
                raise UnpackError(f"no ZSTD frame at byte {pos} (magic {magic:#x})")
            break
        end = _frame_end(src, pos)
        frames.append(src[pos:end])
        pos = end
    return frames


def _frame_end(src: bytes, pos: int) -> int:
    """Where the ZSTD frame at ``pos`` ends: its header (RFC 8878 3.1.1.1), its blocks, its checksum."""
    if pos + 5 > len(src):
        raise UnpackError("ZSTD frame header runs past the input")
    desc = src[pos + 4]
    fcs, single, checksum, dict_flag = desc >> 6, (desc >> 5) & 1, (desc >> 2) & 1, desc & 3
    at = pos + 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag] + ((1 if single else 0), 2, 4, 8)[fcs]
    while True:
        if at + 3 > len(src):
            raise UnpackError("ZSTD block header runs past the input")
        head = int.from_bytes(src[at : at + 3], "little")
        at += 3 + (1 if (head >> 1) & 3 == 1 else head >> 3)  # an RLE block keeps one byte
        end = at + (4 if checksum and head & 1 else 0)
        if end > len(src):
            raise UnpackError("ZSTD block runs past the input")
        if head & 1:
            return end


class Judge:
    """What compressed entries say, decoded with ``codecs``: the callback probes/_fatbin.py's
    ``entry`` takes. The same payload in two containers is decoded once (a few fields kept,
    never its bytes). ``major``: the target's CUDA major (a cubin of another settles early)."""

    def __init__(self, codecs: Codecs, major: int | None = None) -> None:
        self.codecs, self.major = codecs, major
        self._memo: dict[tuple, dict] = {}

    def __call__(self, kind: int, flags: int, usize: int, payload: bytes, isa, arch: int, minor: int) -> dict:
        import hashlib

        key = (kind, flags, usize, hashlib.sha256(payload).digest(), isa, arch, minor)
        if key not in self._memo:
            self._memo[key] = self._judge(kind, flags, usize, payload, isa, arch, minor)
        return dict(self._memo[key])

    def _judge(self, kind, flags, usize, payload, isa, arch, minor) -> dict:
        try:
            if kind == _fatbin.KIND_PTX:
                return _fatbin.ptx_fields(self.codecs.unpack(flags, payload, usize, _fatbin.PTX_HEAD), isa)
            return _fatbin.cubin_fields(self.compressed_cubin(flags, payload, usize), arch, minor)
        except ValueError as exc:
            return {"unread": str(exc)[:200]}

    def compressed_cubin(self, flags: int, payload: bytes, size: int) -> dict:
        """What a compressed cubin says of itself (``_fatbin.cubin``'s answer). With a C decoder the
        whole cubin is decoded; with pure Python (about 5 MB/s LZ4) from as short a decoded prefix
        as settles it: ptxas writes .shstrtab first, at 0x40, its note names before ".nv.info", and
        the tkinfo note after the symbol table. A prefix that names no note past ".nv.info" is
        "no note"; one that holds the tkinfo release line gives the toolkit; a verdict that would
        pass holds only if the rest decodes too."""
        for stop in () if self.codecs.fast(flags) else STEPS:
            if stop >= size:
                break
            found = cubin_head(self.codecs.unpack(flags, payload, size, stop))
            if found is not None:
                if not self._fails(found):
                    self.whole(flags, payload, size)
                return found
        data = self.codecs.unpack(flags, payload, size)
        if data[:4] != b"\x7fELF":
            raise UnpackError("its decoded payload is not an ELF cubin")
        return _fatbin.cubin(data)

    def _fails(self, found: dict) -> bool:
        """Does this toolkit fail the target's CUDA major whatever the rest of the cubin holds?"""
        toolkit = found.get("toolkit")
        return self.major is not None and toolkit is not None and int(toolkit.split(".")[0]) != self.major

    def whole(self, flags: int, payload: bytes, size: int) -> None:
        """Raise UnpackError unless the whole payload decodes to ``size`` bytes (pure LZ4: its
        structure walked, nothing written)."""
        if flags & _fatbin.FLAG_LZ4 and not self.codecs.c_lz4:
            try:
                _unpack.lz4_walk(payload, size)
            except (IndexError, struct.error) as exc:
                raise UnpackError(f"corrupt: {type(exc).__name__}: {exc}") from None
        else:
            self.codecs.unpack(flags, payload, size)


def cubin_head(data: bytes) -> dict | None:
    """``_fatbin.cubin``'s answer from a cubin's first bytes, or None when they do not settle its notes."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise UnpackError("its decoded payload is not an ELF cubin")
    abi, flags = data[8], struct.unpack_from("<I", data, 48)[0]
    sm, accel = ((flags >> 8) & 0xFF, bool(flags & 0x8)) if abi >= 8 else (flags & 0xFF, bool(flags & 0x800))
    found: dict[str, Any] = {"kind": "SASS", "sm": sm, "variant": "a" if accel else "", "abi": abi, "compressed": False}
    rel = _fatbin.RELEASE.search(data)
    if rel:
        opt = _fatbin.ARCH_OPT.search(data)
        found["toolkit"], found["toolkit_from"] = f"{int(rel.group(1))}.{int(rel.group(2))}", "tkinfo"
        if opt and opt.group(2) and int(opt.group(1)) == sm:
            found["variant"] = opt.group(2).decode()
        return found
    names = data[0x40:]
    if names.startswith(b"\0.shstrtab\0") and b".nv.info" in names and b".note.nv." not in names:
        found["toolkit"], found["toolkit_from"] = None, "no note"
        return found
    return None


def read_bytes(shape: str, buf, judge: Judge) -> dict | None:
    """{"shape", "objects"} of a file's bytes (``shape``: ``_fatbin.gpu_shape``'s), or None when it
    holds no GPU code; raises ValueError (struct.error, IndexError) when its structure cannot be read."""
    found = _fatbin.inspect_buffer(shape, buf, judge)
    if not found or not found[1]:
        return None
    return {"shape": found[0], "objects": _fatbin.summarize(found[1])}


class Spool:
    """One file of the exported stream, kept in an unnamed temporary file as it passes, then read."""

    def __init__(self, shape: str) -> None:
        self.shape = shape
        self._file: IO[bytes] = tempfile.TemporaryFile(dir=gpucache.directory())  # noqa: SIM115 - closed in result
        self.size = 0

    def feed(self, chunk: bytes) -> None:
        """Spool ``chunk``; past MAX_FILE nothing more is written (the file is then unread)."""
        if self.size + len(chunk) <= MAX_FILE:
            self._file.write(chunk)
        self.size += len(chunk)

    def result(self, sha256: str, judge: Judge) -> dict | str | None:
        """What the file holds (None: no GPU code; a string: why it could not be read), from the
        cache when these bytes were read before."""
        try:
            kept = gpucache.load(sha256, READER)
            if kept is not None:
                return kept[0]
            if self.size < 64:
                return None
            if self.size > MAX_FILE:
                return f"{self.size} bytes, over the {MAX_FILE}-byte cap of the host's reading"
            self._file.flush()
            judge.codecs.spent = False
            with mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                try:
                    facts = read_bytes(self.shape, buf, judge)
                except (ValueError, struct.error, IndexError) as exc:
                    return f"{type(exc).__name__}: {exc}"[:200]
            if not judge.codecs.spent and judge.codecs.c_lz4 and judge.codecs.c_zstd:  # pure: see Judge.major
                gpucache.store(sha256, READER, facts)
            return facts
        finally:
            self._file.close()

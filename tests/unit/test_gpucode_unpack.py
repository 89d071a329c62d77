"""Compressed GPU code, wherever it sits (issue 51): the pure-Python LZ4 block and ZSTD frame
decoders the gpucode probe carries (builder/checks/probes/_unpack.py) against the reference
encoders (the lz4 and zstd CLIs) and against nvcc 13's own fatbins in every --compress-mode; an
entry that cannot be decoded is "unread" and fails gpu_code; fatbins outside .nv_fatbin and in a
library an extension NEEDs outside the application prefix are read too."""

from __future__ import annotations

import hashlib
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from builder.checks import gpuread, gpurules, probes
from tests.unit import gpuassets, gpuhost

CUDA129 = (12, 9)
SITE = "venv/lib/python3.12/site-packages"
HERE = Path(probes.__file__).parent


def _codecs() -> dict:
    space: dict = {}
    exec(compile((HERE / "_unpack.py").read_text(), "_unpack.py", "exec"), space)  # noqa: S102 - the probe's own text
    return space


UNPACK = _codecs()


def probe(
    *roots: Path, tree: tuple[Path, ...] = (), budget: float | None = None, cuda_major=12, fast=True, **extra
) -> dict:
    """The facts gpu_code judges, read on the host (C decoders unless not ``fast``; none left when
    ``budget`` is spent); the probe's header listing agrees with them."""
    codecs = gpuread.Codecs(fast=fast, deadline=0.0 if budget is not None else None)
    found = gpuhost.read(*roots, tree=tree, codecs=codecs, major=cuda_major, **extra)
    assert found["mismatches"] == [], found["mismatches"]
    return found


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    """A GPU-code cache of this test's own: an answer kept by an earlier test never stands in for a reading."""
    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path_factory.mktemp("k3cache")))


def pure(major: int | None = None) -> gpuread.Judge:
    """The host's judge with the pure-Python decoders (the fallback where lz4 or zstandard is missing)."""
    return gpuread.Judge(gpuread.Codecs(fast=False), major)


def _cli(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"no {name} CLI here to make reference input")
    return path


def _samples() -> list[bytes]:
    text = (HERE / "gpucode.py").read_bytes()
    machine = Path(sys.executable).resolve().read_bytes()[:1_500_000]
    return [b"", b"k3", b"a" * 100_000, text, machine, bytes(range(256)) * 400]


@pytest.mark.parametrize("level", ["-1", "-19"])
def test_zstd_decodes_what_the_reference_encoder_writes(level):
    zstd = _cli("zstd")
    for i, data in enumerate(_samples()):
        flags = ["--check"] if i % 2 else ["--no-check"]
        frame = subprocess.run([zstd, "-q", "-c", level, *flags], input=data, capture_output=True, check=True).stdout
        assert UNPACK["zstd"](frame, len(data), 1 << 30) == data, (i, level)
        if len(data) > 5000:  # a prefix stops early and is the data's prefix
            assert UNPACK["zstd"](frame, len(data), 1 << 30, 4096)[:4096] == data[:4096]


def _lz4_blocks(frame: bytes) -> list[tuple[bool, bytes]]:
    """The blocks of an LZ4 frame (lz4 CLI): (stored raw?, bytes)."""
    flg, pos, blocks = frame[4], 7, []
    pos += 8 if flg & 8 else 0
    while (n := int.from_bytes(frame[pos : pos + 4], "little")) != 0:
        blocks.append((bool(n >> 31), frame[pos + 4 : pos + 4 + (n & 0x7FFFFFFF)]))
        pos += 4 + (n & 0x7FFFFFFF)
    return blocks


@pytest.mark.parametrize("level", ["-1", "-12"])
def test_lz4_decodes_what_the_reference_encoder_writes(level):
    lz4 = _cli("lz4")
    for data in _samples()[2:]:
        args = [lz4, "-q", "-c", level, "-BI", "-B7", "--no-frame-crc"]
        frame = subprocess.run(args, input=data, capture_output=True, check=True).stdout
        ((raw, block),) = _lz4_blocks(frame)
        assert raw or UNPACK["lz4_block"](block, len(data), 1 << 30) == data


def test_corrupt_or_misstated_input_raises_never_returns_other_bytes():
    zstd, lz4 = _cli("zstd"), _cli("lz4")
    data = (HERE / "gpucode.py").read_bytes()
    frame = subprocess.run([zstd, "-q", "-c", "-3"], input=data, capture_output=True, check=True).stdout
    ((_, block),) = _lz4_blocks(
        subprocess.run([lz4, "-q", "-c", "-BI", "-B7"], input=data, capture_output=True, check=True).stdout
    )
    error = UNPACK["UnpackError"]
    cases = [
        ("zstd", frame[: len(frame) // 2], len(data)),  # truncated
        ("zstd", frame, len(data) + 1),  # the header states another size
        ("zstd", frame, 1 << 40),  # over the cap
        ("zstd", b"\x28\xb5\x2f\xfd\x08" + frame[5:], len(data)),  # reserved bit
        ("zstd", b"\x28\xb5\x2f\xfd\x21\x07\x00\x00", 0),  # reserved block type (3)
        ("zstd", b"\x28\xb5\x2f\xfd\x01\x01\x05" + frame[6:], len(data)),  # needs a dictionary
        ("zstd", b"K3K3" + frame, len(data)),  # not a frame
        ("lz4_block", block[: len(block) // 2], len(data)),
        ("lz4_block", block, len(data) - 1),
        ("lz4_block", b"\x0f\x00\x00", 19),  # a match before any output
        ("lz4_block", b"\xf0", 15),  # literal length runs past the input
    ]
    for codec, src, size in cases:
        with pytest.raises(error):
            UNPACK[codec](src, size, 1 << 30)


def _entries(blob: bytes) -> list[tuple[int, int, dict]]:
    """(offset, header size, fields) of each entry of a one-container fatbin."""
    out, at = [], 16
    while at + 64 <= len(blob):
        kind, _, hsize, psize, csize = struct.unpack_from("<HHIQI", blob, at)
        flags, _, usize = struct.unpack_from("<QQQ", blob, at + 40)
        out.append((at, hsize, {"kind": kind, "psize": psize, "csize": csize, "flags": flags, "usize": usize}))
        at += hsize + psize
    return out


def _fatbin(tmp_path: Path, mode: str) -> Path:
    args = ["-fatbin", "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_100a,code=sm_100a"]
    args += ["-gencode", "arch=compute_90,code=compute_90", f"--compress-mode={mode}"]
    return gpuassets.nvcc13(tmp_path / f"k3_{mode}.fatbin", *args)


@pytest.mark.parametrize(("mode", "codec"), [("size", 0x8000), ("speed", 0x2000)])
def test_nvcc_13_compressed_fatbins_are_decoded_and_judged(tmp_path, mode, codec):
    fat = _fatbin(tmp_path, mode)
    compressed = [e for _, _, e in _entries(fat.read_bytes()) if e["flags"] & (0x2000 | 0x8000)]
    assert compressed and all(e["flags"] & codec for e in compressed)
    found = probe(tmp_path)
    objs = {o["arch"]: o for o in found["files"][str(fat)]["objects"]}
    assert {a: (o.get("toolkit"), o.get("toolkit_from")) for a, o in objs.items() if o["kind"] == "SASS"} == {
        "sm_80": ("13.0", "tkinfo"),
        "sm_100a": ("13.0", "tkinfo"),
    }
    assert objs["compute_90"]["isa"] == "9.0" and not any(o.get("unread") for o in objs.values())
    problems = "; ".join(gpurules.floor(found, CUDA129, {}).problems)
    assert "SASS sm_100a built by CUDA 13.0 (tkinfo), not CUDA 12" in problems  # ABI 8 alone could not say


def _spoil(fat: Path, change) -> None:
    blob = bytearray(fat.read_bytes())
    for at, hsize, e in _entries(bytes(blob)):
        if e["flags"] & (0x2000 | 0x8000) and e["kind"] == 2:
            change(blob, at, hsize, e)
    fat.write_bytes(bytes(blob))


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("garbled", "decodes to|ZSTD|corrupt|not an ELF"),
        ("codec", "name no codec this reader knows"),
        ("size", "exceeds its payload"),
        ("budget", "K3_CHECK_TIMEOUT"),
    ],
)
def test_an_entry_that_cannot_be_decoded_is_unread_and_fails(tmp_path, how, reason):
    fat = _fatbin(tmp_path, "size")

    def change(blob, at, hsize, e):
        if how == "garbled":
            mid = at + hsize + e["csize"] // 2
            blob[mid : mid + 16] = b"\xa5" * 16
        elif how == "codec":
            struct.pack_into("<Q", blob, at + 40, (e["flags"] & ~0x8000) | 0x4000)
        elif how == "size":
            struct.pack_into("<I", blob, at + 16, e["psize"] + 8)

    if how != "budget":
        _spoil(fat, change)
    # libzstd decodes these garbled literals to the stated size (the frame has no checksum): the
    # cubin is then judged as decoded; the pure-Python decoder, stricter, refuses them
    found = probe(tmp_path, budget=1e-9 if how == "budget" else None, fast=how != "garbled")
    objs = found["files"][str(fat)]["objects"]
    sass = [o for o in objs if o["kind"] == "SASS"]
    assert sass and all(o.get("unread") for o in sass), sass
    problems = gpurules.floor(found, CUDA129, {}).problems
    unread = [p for p in problems if " unread: " in p]
    assert len(unread) == sum(1 for o in objs if o.get("unread")), problems
    assert all(re.search(reason, p) for p in unread), problems
    waived = gpurules.floor(found, CUDA129, {str(fat): "read elsewhere"})
    assert not [p for p in waived.problems if " unread: " in p]


def _shared(path: Path, source: str, *args: str) -> Path:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler here")
    src = path.with_suffix(".c")
    src.write_text(source)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(path), str(src), *args], check=True, capture_output=True)
    return path


def _as_rodata(blob: bytes) -> str:
    body = ",".join(str(b) for b in blob)
    return f"__attribute__((aligned(8))) const unsigned char k3_fatbin[{len(blob)}] = {{{body}}};\n"


USES = "extern const unsigned char k3_fatbin[];\nint k3(void) { return k3_fatbin[0]; }\n"  # NEEDED even --as-needed


def test_a_fatbin_carried_as_data_in_a_library_a_module_needs_outside_the_prefix(tmp_path):
    for d in ("make", "opt/k3"):
        (tmp_path / d).mkdir(parents=True)
    fat = _fatbin(tmp_path / "make", "size")
    # libk3gpu.so: no .nv_fatbin section, the fatbin a const array in .rodata (for cuModuleLoadData)
    lib = _shared(tmp_path / "opt" / "k3" / "libk3gpu.so", _as_rodata(fat.read_bytes()))
    ext = tmp_path / "app" / SITE / "k3x" / "_C.abi3.so"
    ext.parent.mkdir(parents=True)
    _shared(ext, USES, f"-L{lib.parent}", "-lk3gpu", f"-Wl,-rpath,{lib.parent}")
    found = probe(tmp_path / "app", tree=(tmp_path,))
    assert set(found["files"]) == {str(lib)} and found["needed_outside"] >= 1
    entry = found["files"][str(lib)]
    assert entry["needed_by"] == str(ext) and entry["shape"] == "elf"
    assert {(o["arch"], o.get("outside"), o.get("toolkit")) for o in entry["objects"] if o["kind"] == "SASS"} == {
        ("sm_80", True, "13.0"),
        ("sm_100a", True, "13.0"),
    }
    assert any("not CUDA 12" in p for p in gpurules.floor(found, CUDA129, {}).problems)
    # found through LD_LIBRARY_PATH too (the image's ENV), with no RUNPATH in the module
    _shared(ext, USES, f"-L{lib.parent}", "-lk3gpu")
    assert str(lib) not in probe(tmp_path / "app", tree=(tmp_path,))["files"]
    assert str(lib) in probe(tmp_path / "app", tree=(tmp_path,), ld_library_path=str(lib.parent))["files"]


def test_four_magic_bytes_in_data_are_no_container(tmp_path):
    blob = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 1 << 20) + b"\0" * 200  # its size runs past the file
    lib = _shared(tmp_path / "libdata.so", _as_rodata(blob))
    assert probe(tmp_path)["files"] == {}
    assert lib.exists()


def test_a_compressed_cubin_is_judged_from_a_prefix_as_from_the_whole(tmp_path):
    """NVRTC 12.9's cubins: sm_80 has no note (settled by its section names in 4 KiB), sm_100a a
    tkinfo note; LZ4 blocks made by the reference encoder; the answer equals whole decoding's."""
    lz4 = _cli("lz4")
    judge = pure()
    for arch in ("sm_80", "sm_100a"):
        raw = gpuassets.nvrtc(arch)
        frame = subprocess.run([lz4, "-q", "-c", "-BI", "-B7"], input=raw, capture_output=True, check=True).stdout
        ((stored, block),) = _lz4_blocks(frame)
        assert not stored
        fast = judge.compressed_cubin(0x2000, block, len(raw))
        whole = gpuread._fatbin.cubin(raw)
        keys = ("sm", "variant", "abi", "toolkit", "toolkit_from")
        assert [fast.get(k) for k in keys] == [whole.get(k) for k in keys], arch
        assert fast["toolkit_from"] == ("no note" if arch == "sm_80" else "tkinfo")
    assert gpuread.cubin_head(gpuassets.nvrtc("sm_100a")[:100]) is None  # names not reached: not settled
    with pytest.raises(ValueError, match="not an ELF cubin"):
        gpuread.cubin_head(b"\0" * 100)


def _container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def _entry(payload: bytes, *, arch: int, abi: int, flags: int = 0x11, usize: int = 0, csize: int = 0) -> bytes:
    head = struct.pack("<HHIQIIHHI", 2, 0x101, 64, len(payload), csize, 0, abi, 1, arch)
    return head + bytes(8) + struct.pack("<QQQ", flags, 0, usize) + payload


def test_a_compressed_cubin_whose_rest_cannot_be_decoded_is_unread(tmp_path):
    """Its 64 KiB prefix settles it (NVRTC 12.9 sm_100a: the tkinfo release line; 200 KB of data
    follow the cubin), and its block is cut at three quarters: judged from the prefix alone it read
    'CUDA 12.9', fine, though no decoder (the driver's included) can decode it; the rest is walked."""
    lz4 = _cli("lz4")
    noise = b"".join(hashlib.sha256(b"%d" % i).digest() for i in range(200_000 // 32))  # incompressible
    raw = gpuassets.nvrtc("sm_100a") + noise
    frame = subprocess.run([lz4, "-q", "-c", "-BI", "-B7"], input=raw, capture_output=True, check=True).stdout
    ((_, block),) = _lz4_blocks(frame)
    assert len(raw) > 65536 and pure().compressed_cubin(0x2000, block, len(raw))["toolkit"] == "12.9"
    cut = block[: len(block) * 3 // 4]
    for judge in (pure(), pure(12), gpuread.Judge(gpuread.Codecs(), 12)):
        with pytest.raises(ValueError, match="decodes to|LZ4"):
            judge.compressed_cubin(0x2000, cut, len(raw))  # a verdict that would pass is held to the whole
    # it fails a CUDA 13 target from its prefix alone (pure Python stops there)
    assert pure(13).compressed_cubin(0x2000, cut, len(raw))["toolkit"] == "12.9"
    fat = tmp_path / "k3.fatbin"
    fat.write_bytes(_container(_entry(cut, arch=100, abi=8, flags=0x2011, usize=len(raw), csize=len(cut))))
    (obj,) = probe(tmp_path)["files"][str(fat)]["objects"]
    assert obj.get("unread"), obj


def test_entries_a_driver_could_not_load_are_unread_never_fine(tmp_path):
    raw = gpuassets.nvrtc("sm_100a")  # ELF ABI 8
    cases = {
        "notelf": _entry(b"\x28\xb5\x2f\xfd" + raw[4:], arch=100, abi=8, flags=0x4011),  # an unknown codec, no csize
        "abi": _entry(raw, arch=100, abi=7),  # the header's ABI is not the cubin's
        "broken": _entry(raw, arch=100, abi=8) + struct.pack("<HHIQ", 2, 0, 8, 1 << 40) + bytes(48),  # past the end
    }
    for name, blob in cases.items():
        (tmp_path / f"{name}.fatbin").write_bytes(_container(blob))
    found = probe(tmp_path)
    problems = "; ".join(gpurules.floor(found, CUDA129, {}).problems)
    for name, why in (("notelf", "not an ELF cubin"), ("abi", "ELF ABI is 8"), ("broken", "breaks at byte")):
        assert f"{tmp_path}/{name}.fatbin: " in problems and why in problems, (name, problems)
    assert not found["errors"], found["errors"]


def test_a_library_with_a_broken_section_table_still_has_its_fatbins_read(tmp_path):
    """The loader needs no section table, so a garbled one cannot hide the GPU code it carries."""
    raw = gpuassets.nvrtc("sm_100a")
    lib = _shared(tmp_path / "libk3.so", _as_rodata(_container(_entry(raw, arch=100, abi=8))))
    blob = bytearray(lib.read_bytes())
    struct.pack_into("<Q", blob, 0x28, 1 << 40)  # e_shoff past the end
    lib.write_bytes(bytes(blob))
    found = probe(tmp_path)
    assert [o["arch"] for o in found["files"][str(lib)]["objects"]] == ["sm_100"], found


def test_the_lz4_walk_refuses_exactly_what_decoding_refuses():
    """The walk that holds a prefix-judged cubin to its whole block makes every check the decoder
    makes: over a thousand mutated and cut blocks, one raises exactly when the other does."""
    import random

    lz4 = _cli("lz4")
    data = (HERE / "gpucode.py").read_bytes() * 2
    ((_, block),) = _lz4_blocks(subprocess.run([lz4, "-q", "-c", "-BI", "-B7"], input=data, capture_output=True).stdout)
    rng, error = random.Random(51), UNPACK["UnpackError"]
    refused = 0
    for _ in range(1000):
        src = bytearray(block)
        for _ in range(rng.choice((0, 0, 1, 2, 4))):
            src[rng.randrange(len(src))] = rng.randrange(256)
        if rng.random() < 0.3:
            src = src[: rng.randrange(len(src) // 2, len(src) + 1)]
        size = len(data) + rng.choice((0, 0, 0, 0, -1, 1))
        outcomes = []
        for fn in (UNPACK["lz4_block"], UNPACK["lz4_walk"]):
            try:
                fn(bytes(src), size, *([1 << 30] if fn is UNPACK["lz4_block"] else []))
                outcomes.append(True)
            except error:
                outcomes.append(False)
        assert outcomes[0] == outcomes[1], bytes(src)
        refused += not outcomes[0]
    assert 100 < refused < 1000  # both kinds of input were tried

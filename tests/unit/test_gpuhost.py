"""GPU code read on the host (issue 49): the C and pure-Python decoders give the same bytes on real
fatbins, what one file holds is kept by its sha256 and a forged entry is refused, and an image
whose interpreter hides GPU code from the gpucode probe fails gpu_code by the host's reading."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest

from builder.checks import gpucache, gpufound, gpuread, gpurules, imagefiles
from builder.checks.probes import _fatbin
from tests.unit import gpuassets, gpuhost

CUDA129 = (12, 9)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path_factory.mktemp("k3cache")))


def compressed_entries(blob: bytes, limit: int) -> list[tuple[int, bytes, int]]:
    """(flags, payload, decoded size) of the first ``limit`` compressed entries of ``blob``'s
    .nv_fatbin section (or of a standalone fatbin)."""
    secs = _fatbin.sections(blob) if blob[:4] == b"\x7fELF" else {}
    start, size = secs.get(".nv_fatbin", (0, len(blob)))
    out, pos = [], start
    while pos + 16 <= start + size and len(out) < limit:
        magic, _, hsize, csize = struct.unpack_from("<IHHQ", blob, pos)
        if magic != _fatbin.FATBIN_MAGIC:
            pos += 8
            continue
        at, end = pos + hsize, pos + hsize + csize
        while at + 64 <= end and len(out) < limit:
            _, _, ehsize, psize, comp = struct.unpack_from("<HHIQI", blob, at)
            flags, _, usize = struct.unpack_from("<QQQ", blob, at + 40)
            if flags & (_fatbin.FLAG_LZ4 | _fatbin.FLAG_ZSTD):
                out.append((flags, blob[at + ehsize : at + ehsize + comp], usize))
            at += ehsize + psize
        pos = max(end, pos + 16)
    return out


def _nvcc13_fatbins(tmp_path: Path) -> list[Path]:
    out = []
    for mode in ("speed", "size", "balance"):
        args = ["-fatbin", "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=compute_90"]
        out.append(gpuassets.nvcc13(tmp_path / f"k3_{mode}.fatbin", *args, f"--compress-mode={mode}"))
    return out


def test_the_c_and_pure_decoders_give_the_same_bytes_on_real_fatbins(tmp_path):
    if gpuread.zstandard is None or gpuread.lz4block is None:
        pytest.skip("lz4 or zstandard is not importable here: the host decodes in pure Python")
    nccl = gpuassets.wheel("nvidia-nccl-cu12", "2.30.7") / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    entries = compressed_entries(nccl.read_bytes(), 12)  # LZ4 blocks (pure Python: seconds each)
    for fat in _nvcc13_fatbins(tmp_path):  # LZ4 (speed) and ZSTD (size, balance)
        entries += compressed_entries(fat.read_bytes(), 50)
    codecs = {fast: gpuread.Codecs(fast=fast) for fast in (True, False)}
    assert {flags & (_fatbin.FLAG_LZ4 | _fatbin.FLAG_ZSTD) for flags, _, _ in entries} == {0x2000, 0x8000}
    for flags, payload, size in entries:
        c = codecs[True].unpack(flags, payload, size)
        assert c == codecs[False].unpack(flags, payload, size) and len(c) == size
        assert c[:4] == b"\x7fELF" or b".version" in c
        assert codecs[True].unpack(flags, payload, size, 4096) == c[:4096]
    for flags, payload, size in entries[:3]:  # cut or misstated, both refuse
        for fast in (True, False):
            with pytest.raises(gpuread.UnpackError):
                codecs[fast].unpack(flags, payload[: len(payload) // 2], size)
            with pytest.raises(gpuread.UnpackError):
                codecs[fast].unpack(flags, payload, size + 1)


def _read_once(tmp_path: Path) -> tuple[Path, dict]:
    fat = gpuassets.nvcc13(tmp_path / "k3.fatbin", "-fatbin", "-gencode", "arch=compute_90a,code=sm_90a")
    return fat, gpuhost.read(tmp_path)


def test_what_one_file_holds_is_kept_by_its_sha256_and_a_second_reading_costs_a_hash(tmp_path, monkeypatch):
    fat, first = _read_once(tmp_path)
    sha = hashlib.sha256(fat.read_bytes()).hexdigest()
    assert gpucache.load(sha, gpuread.READER) == (first["files"][str(fat)],)

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded again: the cache was not used")

    monkeypatch.setattr(gpuread, "read_bytes", no_decoding)
    assert gpuhost.read(tmp_path)["files"] == first["files"]


FORGED = [
    ("another file's sha256", lambda doc, sha: doc.update(sha256="0" * 64)),
    ("another reader", lambda doc, sha: doc.update(reader="0")),
    ("a CUDA 12 answer in a field of another type", lambda doc, sha: doc["gpu"]["objects"][0].update(count=True)),
    ("an unknown field", lambda doc, sha: doc["gpu"]["objects"][0].update(verdict="fine")),
    ("no objects", lambda doc, sha: doc["gpu"].update(objects=[])),
    ("not JSON", None),
]


@pytest.mark.parametrize(("what", "forge"), FORGED, ids=[f[0] for f in FORGED])
def test_a_forged_cache_entry_is_refused_and_the_file_read_again(tmp_path, what, forge):
    fat, first = _read_once(tmp_path)
    assert "built by CUDA 13.0" in "; ".join(gpurules.floor(first, CUDA129, {}).problems)
    sha = hashlib.sha256(fat.read_bytes()).hexdigest()
    (entry,) = gpucache.directory().glob(f"{sha}.*.json")
    doc = json.loads(entry.read_text())
    # the forger's aim: the CUDA 13 cubin passed off as CUDA 12
    doc["gpu"]["objects"][0].update(toolkit="12.9")
    if forge is not None:
        forge(doc, sha)
    entry.write_text(json.dumps(doc) if forge is not None else "{not json")  # where the reader looks
    assert gpucache.load(sha, gpuread.READER) is None
    again = gpuhost.read(tmp_path)
    assert again["files"] == first["files"]


def test_an_interpreter_that_hides_gpu_code_fails_by_the_host_s_reading(tmp_path):
    """The probe's listing (the image's interpreter) without the file: the host's reading names it."""
    fat, found = _read_once(tmp_path)
    told = json.loads(json.dumps(found["probe"]))
    assert found["mismatches"] == [] and str(fat) in told["files"]
    lie = {**told, "files": {}}
    host = {**found, "files": dict(found["files"])}
    (problem,) = gpufound.held_to_host(host, lie, _View(found))
    assert problem.startswith(f"{fat}: the image's interpreter reported no GPU code, its files hold kind=SASS")
    assert "read on the host" in problem
    # an invented entry, or one of another arch, is named the same way
    told["files"][str(fat)]["objects"][0]["arch"] = "sm_100a"
    (problem,) = gpufound.held_to_host(host, told, _View(found))
    assert "arch=sm_100a" in problem and "arch=sm_90a" in problem


class _View:
    def __init__(self, found: dict) -> None:
        self.gpu = found["files"]


def test_a_hard_link_under_the_prefix_to_gpu_code_outside_it_is_not_hidden(tmp_path):
    """A hard link's bytes come with its target, earlier in the stream: a target outside the prefix
    that the reader did not read (not a shared object) leaves the link unread, never empty."""
    outside, app = tmp_path / "opt", tmp_path / "app"
    outside.mkdir(), app.mkdir()
    ptx = outside / "k.ptx"
    ptx.write_text(".version 9.0\n.target sm_100a\n.address_size 64\n" + "// pad\n" * 20)
    (app / "k.ptx").hardlink_to(ptx)
    judge = gpuread.Judge(gpuread.Codecs(), 12)
    with gpuhost.export(outside, app) as stream:
        view = imagefiles.read(stream, (str(app),), judge)
    found = gpufound.host_found(view, (str(app),), "")
    assert str(app / "k.ptx") in {**found["files"], **found["errors"]}


def test_a_file_over_the_spool_cap_is_unread_and_not_written_past_it(monkeypatch):
    """The host spools one file at a time to disk: a file over MAX_FILE is not written past the cap
    and is named unread."""
    monkeypatch.setattr(gpuread, "MAX_FILE", 1000)
    spool = gpuread.Spool("ptx")
    for _ in range(3):
        spool.feed(b".version 9.0\n.target sm_100a\n".ljust(500, b" "))
    assert spool._file.tell() <= 1000
    found = spool.result("0" * 64, gpuread.Judge(gpuread.Codecs(), 12))
    assert isinstance(found, str) and "cap" in found

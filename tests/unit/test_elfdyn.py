"""NEEDED lists read on the host (issue 49): builder/checks/elfdyn.py over shared objects the C
compiler makes here, streamed as the engine exports a container, against readelf; the soname
search on the image's listing; the ELF probe's answer held to it (boundary.static_needed)."""

from __future__ import annotations

import io
import re
import shutil
import struct
import subprocess
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from builder.checks import boundary, elfdyn, imagefiles

PREFIX = "/opt/k3"
SITE = f"{PREFIX}/venv/lib/python3.12/site-packages"


def _cc(out: Path, *args: str, source: str = "int k3(void) { return 1; }\n") -> Path:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler here")
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(src), *args], check=True, capture_output=True)
    return out


def _export(files: dict[str, Path | bytes]) -> imagefiles.ImageFiles:
    """The host's reading of a root file system holding ``files`` (image path -> file or bytes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, src in sorted(files.items()):
            data = src.read_bytes() if isinstance(src, Path) else src
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return imagefiles.read(buf, (PREFIX,))


def _readelf(path: Path) -> list[tuple[str, str]]:
    out = subprocess.run(["readelf", "-dW", str(path)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\((NEEDED|SONAME|RPATH|RUNPATH)\)\s+\S+ \S+: \[([^\]]*)\]", out)


def test_the_dynamic_section_read_from_the_stream_equals_readelf(tmp_path):
    if shutil.which("readelf") is None:
        pytest.skip("no readelf here")
    dep = _cc(tmp_path / "libk3dep.so", "-Wl,-soname,libk3dep.so.1")
    ext = _cc(
        tmp_path / "_C.so",
        "-Wl,--no-as-needed",
        str(dep),
        "-Wl,-soname,k3_C",
        "-Wl,--enable-new-dtags,-rpath,$ORIGIN/../lib:/opt/k3/lib",
    )
    old = _cc(tmp_path / "libold.so", "-Wl,--no-as-needed", str(dep), "-Wl,--disable-new-dtags,-rpath,/x")
    view = _export({f"{SITE}/k3/_C.so": ext, f"{SITE}/k3/libold.so": old, f"{PREFIX}/k3.txt": b"not elf"})
    dyn = view.dynamic[f"{SITE}/k3/_C.so"]
    assert isinstance(dyn, elfdyn.Dynamic)
    want = _readelf(ext)
    assert [("NEEDED", n) for n in dyn.needed] == [w for w in want if w[0] == "NEEDED"]
    assert (dyn.soname, dyn.runpath, dyn.rpath) == ("k3_C", "$ORIGIN/../lib:/opt/k3/lib", "")
    assert view.dynamic[f"{SITE}/k3/libold.so"].rpath == "/x"  # type: ignore[union-attr]
    assert f"{PREFIX}/k3.txt" not in view.dynamic


def test_strings_beyond_the_kept_prefix_are_said_unread(tmp_path, monkeypatch):
    dep = _cc(tmp_path / "libk3dep.so", "-Wl,-soname,libk3dep.so")
    ext = _cc(tmp_path / "_C.so", "-Wl,--no-as-needed", str(dep))
    phoff, (phentsize, phnum) = (
        struct.unpack_from("<Q", ext.read_bytes(), 32)[0],
        struct.unpack_from("<HH", ext.read_bytes(), 54),
    )
    monkeypatch.setattr(elfdyn, "PREFIX", phoff + phentsize * phnum)  # the program headers only: no .dynstr
    capture, data = elfdyn.Capture(), ext.read_bytes()
    for at in range(0, len(data), 256):  # .dynstr has passed when the dynamic section names it
        capture.feed(data[at : at + 256])
    assert "beyond the first" in str(capture.result())


def test_unresolved_searches_the_listing_as_ld_so_does(tmp_path):
    dep = _cc(tmp_path / "libk3dep.so", "-Wl,-soname,libk3dep.so")
    gone = _cc(tmp_path / "libk3gone.so", "-Wl,-soname,libk3gone.so")
    cudart13 = _cc(tmp_path / "libcudart.so.13", "-Wl,-soname,libcudart.so.13")
    link = ("-Wl,--no-as-needed", str(dep), str(gone))
    origin = _cc(tmp_path / "a.so", *link, "-Wl,--enable-new-dtags,-rpath,$ORIGIN/lib")
    plain = _cc(tmp_path / "b.so", *link, "-Wl,--no-as-needed", str(cudart13))
    files = {
        f"{SITE}/k3/a.so": origin,
        f"{SITE}/k3/lib/libk3dep.so": dep,  # a finds it at $ORIGIN/lib; b by the soname the prefix provides
        f"{SITE}/k3/b.so": plain,
        "/usr/local/k3gone/libk3gone.so": gone,  # found only through ld.so.conf.d
        "/usr/lib/x86_64-linux-gnu/libc.so.6": b"libc",  # a listing: its bytes are not read here
        "/usr/lib/aarch64-linux-gnu/libc.so.6": b"libc",
    }
    view = _export(files)
    # libk3dep.so is provided under the prefix: counted as found (an earlier import loads it)
    assert elfdyn.unresolved(view, PREFIX, "") == [
        (f"{SITE}/k3/a.so", "libk3gone.so"),
        (f"{SITE}/k3/b.so", "libk3gone.so"),
        (f"{SITE}/k3/b.so", "libcudart.so.13"),
    ]
    view = _export({**files, "/etc/ld.so.conf.d/k3.conf": b"# the image's\n/usr/local/k3gone\n"})
    assert elfdyn.unresolved(view, PREFIX, "") == [(f"{SITE}/k3/b.so", "libcudart.so.13")]
    expect = SimpleNamespace(app_prefix=PREFIX, cuda_major=12)
    found = boundary.static_needed(view, expect, "", reported=set())
    assert [(p, w.split(",")[0]) for p, w in found] == [
        (f"{SITE}/k3/b.so", "needs libcudart.so.13"),  # found nowhere
        (f"{SITE}/k3/b.so", "needs libcudart.so.13"),  # and a CUDA 13 library
    ]
    assert "read on the host; the probe said not" in found[0][1] and "a CUDA 13 library" in found[1][1]
    # what the probe reported is not said twice
    assert boundary.static_needed(view, expect, "", reported={(f"{SITE}/k3/b.so", "libcudart.so.13")}) == []


def _elf(dyn_size: int | None = None, strings_at: int = 0x10000) -> bytes:
    """An ELF64 shared object laid out as patchelf leaves one (auditwheel's manylinux libraries:
    torch's libtorch_cpu.so): its dynamic section early, its string table in a load segment at the
    end of the file. ``dyn_size`` overstates PT_DYNAMIC's size."""
    strings = b"\0libk3a.so.1\0libk3b.so\0$ORIGIN/lib\0"
    dyn = b"".join(
        struct.pack("<qQ", t, v) for t, v in ((1, 1), (1, 13), (29, 23), (5, 0x200000), (10, len(strings)), (0, 0))
    )
    phdrs = [
        (1, 0, 0, 0x1000),  # PT_LOAD: the headers and the dynamic section
        (2, 0x200, 0x200, dyn_size or len(dyn)),  # PT_DYNAMIC
        (1, strings_at, 0x200000, len(strings)),  # PT_LOAD: the string table, moved to the end
    ]
    head = bytearray(0x1000)
    head[:16] = b"\x7fELF\x02\x01\x01" + bytes(9)
    struct.pack_into("<HHIQQQIHHHHHH", head, 16, 3, 62, 1, 0, 64, 0, 0, 64, 56, len(phdrs), 64, 0, 0)
    for i, (t, off, vaddr, size) in enumerate(phdrs):
        struct.pack_into("<IIQQQQQQ", head, 64 + 56 * i, t, 4, off, vaddr, vaddr, size, size, 8)
    head[0x200 : 0x200 + len(dyn)] = dyn
    return bytes(head) + bytes(strings_at - len(head)) + strings


def test_strings_moved_past_the_kept_prefix_are_read_as_they_pass(monkeypatch):
    monkeypatch.setattr(elfdyn, "PREFIX", 0x1000)  # the strings lie past it, after the dynamic section
    view = _export({f"{SITE}/k3/_C.so": _elf()})
    assert view.dynamic[f"{SITE}/k3/_C.so"] == elfdyn.Dynamic(("libk3a.so.1", "libk3b.so"), None, "", "$ORIGIN/lib")


def test_an_overstated_dynamic_section_is_said_unread_within_bounded_memory(monkeypatch):
    view = _export({f"{SITE}/k3/_C.so": _elf(dyn_size=1 << 40)})
    assert "dynamic section states" in str(view.dynamic[f"{SITE}/k3/_C.so"])
    expect = SimpleNamespace(app_prefix=PREFIX, cuda_major=12)
    assert [p for p, _ in boundary.host_unread(view, expect)] == [f"{SITE}/k3/_C.so"]


def test_too_many_strings_or_search_directories_are_said_unread():
    capture = elfdyn.Capture()
    many = b"".join(struct.pack("<qQ", 1, 1) for _ in range(elfdyn.MAX_STRINGS + 1))
    assert "strings, over" in str(elfdyn._parse(_elf(), many + struct.pack("<qQ", 5, 0x200000), []))
    rpath = ":".join(f"/d{i}" for i in range(elfdyn.MAX_DIRS + 1)).encode()
    head = bytearray(_elf())
    head += b"\0" + rpath + b"\0"
    at = len(head) - len(rpath) - 1 - 0x10000
    struct.pack_into("<Q", head, 64 + 56 * 2 + 32, len(head))  # the segment's file size covers it
    struct.pack_into("<Q", head, 64 + 56 * 2 + 40, len(head))
    dyn = struct.pack("<qQqQ", 15, at, 5, 0x200000)
    assert "search directories" in str(elfdyn._parse(bytes(head), dyn, []))
    assert capture.result() is None  # fed nothing: no dynamic section


def test_the_search_is_bounded_whatever_the_config_and_conf_files_name(tmp_path):
    dep = _cc(tmp_path / "libk3dep.so", "-Wl,-soname,libk3dep.so")
    ext = _cc(tmp_path / "_C.so", "-Wl,--no-as-needed", str(dep))
    conf = "".join(f"/usr/local/k3/{i}\n" for i in range(50_000)).encode()
    libs: dict[str, Path | bytes] = {"/usr/lib/libk3dep.so": dep, "/usr/lib/libc.so.6": b"libc"}
    view = _export({f"{SITE}/k3/_C.so": ext, "/etc/ld.so.conf.d/k3.conf": conf, **libs})
    calls: list[str] = []
    resolve = view.resolve

    def counted(path: str):
        calls.append(path)
        return resolve(path)

    view.resolve = counted  # type: ignore[method-assign]
    ld_path = ":".join(f"/k3/{i % 7}" for i in range(100_000))
    assert elfdyn.unresolved(view, PREFIX, ld_path) == []  # found in a default directory
    assert len(calls) < 2 * elfdyn.MAX_SEARCH


def test_files_the_host_could_not_read_are_named_in_one_line():
    line = boundary.unread_line([(f"/opt/k3/{i}.so", "why") for i in range(7)])
    assert line.startswith("shared_libraries: 7 NEEDED lists not read on the host") and line.endswith("why ...")

"""The ELF probe's library search (builder/checks/probes/elf.py) against ld.so itself, on real ELF
files the C compiler makes here: for each rule the probe claims (DT_RPATH when there is no
DT_RUNPATH, then LD_LIBRARY_PATH, then DT_RUNPATH, $ORIGIN and ${ORIGIN}, the ld.so cache, the
default directories), the path the probe's ``search`` picks is the one this machine's dynamic
loader picks (ld.so with LD_TRACE_LOADED_OBJECTS, what ldd runs). The cache rules, which no test can write into the
machine's /etc/ld.so.cache, are pinned on ``search`` with a given cache. Then the whole probe, run
as the checks run it (`python -c <script> <request>`): other CUDA majors on both sides of 12, a
library found only by the soname a file under the prefix carries (preloaded), and a file whose
RUNPATH hides the RPATH that would have found its library.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from builder.checks import probes
from builder.checks.probes import elf
from builder.config import contract

CC = shutil.which("cc") or shutil.which("gcc")
LDSO = next((p for p in ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1") if os.path.exists(p)), None)
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler on this machine")
DEP = "libk3dep.so.1"


def cc(out: Path, *, soname: str | None = None, needs=(), rpath=None, runpath=None) -> Path:
    """A shared library; ``needs`` are linked by file (NEEDED is each one's soname)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.parent / (out.name.replace(".", "_") + ".c")
    src.write_text(f"int {out.name.replace('.', '_').replace('-', '_')}_fn(void) {{ return 1; }}\n")
    cmd = [CC, "-shared", "-fPIC", "-o", str(out), str(src)]
    if soname:
        cmd.append(f"-Wl,-soname,{soname}")
    for lib in needs:
        cmd += ["-Wl,--no-as-needed", str(lib)]
    if rpath is not None:
        cmd.append(f"-Wl,--disable-new-dtags,-rpath,{rpath}")
    if runpath is not None:
        cmd.append(f"-Wl,--enable-new-dtags,-rpath,{runpath}")
    subprocess.run(cmd, check=True, capture_output=True)
    src.unlink()
    return out


def with_rpath_and_runpath(out: Path, *, needs, rpath: str, runpath: str) -> Path:
    """A library carrying both DT_RPATH and DT_RUNPATH (old linkers wrote both; ld.so then ignores
    DT_RPATH): linked with an RPATH and with ``runpath`` as its DT_SONAME, whose tag is then
    rewritten to DT_RUNPATH in the dynamic section."""
    cc(out, soname=runpath, needs=needs, rpath=rpath)
    data = bytearray(out.read_bytes())
    phoff, phentsize, phnum = struct.unpack_from("<Q", data, 32)[0], *struct.unpack_from("<HH", data, 54)
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 2:  # PT_DYNAMIC
            for at in range(p_offset, p_offset + p_filesz, 16):
                if struct.unpack_from("<q", data, at)[0] == elf.DT_SONAME:
                    struct.pack_into("<q", data, at, elf.DT_RUNPATH)
    out.write_bytes(bytes(data))
    return out


def dep(directory: Path) -> Path:
    return cc(directory / DEP, soname=DEP)


def probe_search(path: Path, env_ldlp: str = "", cache: dict | None = None) -> str | None:
    entry = elf.dynamic(str(path))
    assert entry is not None and DEP in entry[0]
    return elf.search(entry, DEP, str(path.parent), env_ldlp, cache or {})


def loader(path: Path, ldlp: str = "") -> str | None:
    """Where this machine's ld.so finds DEP for ``path`` (None: not found)."""
    if LDSO is None:
        pytest.skip("no x86-64 or aarch64 ld.so here")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env["LD_TRACE_LOADED_OBJECTS"] = "1"  # what ldd sets: list, and say "not found" rather than fail
    if ldlp:
        env["LD_LIBRARY_PATH"] = ldlp
    out = subprocess.run([LDSO, str(path)], capture_output=True, text=True, env=env).stdout
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] == DEP:
            return None if "not found" in line else os.path.realpath(parts[2])
    raise AssertionError(f"ld.so does not list {DEP}: {out}")


def agree(path: Path, ldlp: str = "", expect: Path | None = None) -> None:
    got = probe_search(path, ldlp)
    assert (os.path.realpath(got) if got else None) == loader(path, ldlp)
    assert got == (str(expect) if expect else None)


# --- the order of the search paths, as ld.so has it ----------------------------------------------


def test_dynamic_reads_needed_soname_rpath_and_runpath(tmp_path):
    d = dep(tmp_path / "a")
    old = cc(tmp_path / "old.so", soname="libold.so.3", needs=(d,), rpath="/r1:/r2")
    new = cc(tmp_path / "new.so", needs=(d,), runpath="$ORIGIN/x")
    both = with_rpath_and_runpath(tmp_path / "both.so", needs=(d,), rpath="/r", runpath="/n")
    assert elf.dynamic(str(old)) == ([DEP, "libc.so.6"], "libold.so.3", "/r1:/r2", "")
    assert elf.dynamic(str(new)) == ([DEP, "libc.so.6"], None, "", "$ORIGIN/x")
    assert elf.dynamic(str(both)) == ([DEP, "libc.so.6"], None, "/r", "/n")
    (tmp_path / "text.so").write_text("not an ELF file, only named like one\n")
    assert elf.dynamic(str(tmp_path / "text.so")) is None
    (tmp_path / "short").write_bytes(b"\x7fELF")
    assert elf.dynamic(str(tmp_path / "short")) is None


def test_rpath_without_runpath_is_searched(tmp_path):
    a = dep(tmp_path / "a")
    agree(cc(tmp_path / "c.so", needs=(a,), rpath=str(a.parent)), expect=a)


def test_rpath_is_searched_before_ld_library_path(tmp_path):
    a, b = dep(tmp_path / "a"), dep(tmp_path / "b")
    agree(cc(tmp_path / "c.so", needs=(a,), rpath=str(a.parent)), ldlp=str(b.parent), expect=a)


def test_rpath_lists_are_searched_in_order(tmp_path):
    a, b = dep(tmp_path / "a"), dep(tmp_path / "b")
    agree(cc(tmp_path / "c.so", needs=(a,), rpath=f"{tmp_path / 'none'}:{b.parent}:{a.parent}"), expect=b)


def test_ld_library_path_is_searched_before_runpath(tmp_path):
    a, b = dep(tmp_path / "a"), dep(tmp_path / "b")
    agree(cc(tmp_path / "c.so", needs=(a,), runpath=str(a.parent)), ldlp=f"{tmp_path / 'none'}:{b.parent}", expect=b)


def test_runpath_is_searched(tmp_path):
    a = dep(tmp_path / "a")
    agree(cc(tmp_path / "c.so", needs=(a,), runpath=str(a.parent)), expect=a)


def test_runpath_hides_rpath(tmp_path):
    a, b = dep(tmp_path / "a"), dep(tmp_path / "b")
    both = with_rpath_and_runpath(tmp_path / "c.so", needs=(a,), rpath=str(a.parent), runpath=str(b.parent))
    agree(both, expect=b)
    empty = tmp_path / "empty"
    empty.mkdir()
    # The RPATH has the library, the RUNPATH does not: ld.so does not look in the RPATH at all.
    agree(with_rpath_and_runpath(tmp_path / "d.so", needs=(a,), rpath=str(a.parent), runpath=str(empty)), expect=None)


@pytest.mark.parametrize("origin", ["$ORIGIN", "${ORIGIN}"])
@pytest.mark.parametrize("tag", ["rpath", "runpath"])
def test_origin_is_the_directory_of_the_file_asking(tmp_path, origin, tag):
    a = dep(tmp_path / "pkg" / "lib")
    consumer = cc(tmp_path / "pkg" / "c.so", needs=(a,), **{tag: f"{origin}/lib"})
    agree(consumer, expect=a)
    moved = tmp_path / "elsewhere" / "c.so"  # the same file elsewhere: $ORIGIN moves with it
    moved.parent.mkdir()
    shutil.copy(consumer, moved)
    agree(moved, expect=None)


def test_an_empty_entry_in_a_search_list_is_not_the_current_directory(tmp_path, monkeypatch):
    a = dep(tmp_path / "a")
    consumer = cc(tmp_path / "sub" / "c.so", needs=(a,), runpath=str(tmp_path / "none"))
    monkeypatch.chdir(a.parent)  # DEP is in the working directory: an empty entry must not find it
    assert probe_search(consumer, env_ldlp=":") is None


def test_a_needed_name_with_a_slash_is_a_path(tmp_path):
    a = dep(tmp_path / "a")
    entry = ([str(a)], None, str(tmp_path / "b"), "")
    assert elf.search(entry, str(a), str(tmp_path), "", {}) == str(a)
    assert elf.search(entry, str(tmp_path / "a" / "gone.so"), str(tmp_path), "", {DEP: str(a)}) is None


# --- the cache and the default directories -------------------------------------------------------


def test_the_cache_comes_after_every_search_path(tmp_path):
    a, b = dep(tmp_path / "a"), dep(tmp_path / "b")
    consumer = cc(tmp_path / "c.so", needs=(a,), runpath=str(a.parent))
    assert probe_search(consumer, cache={DEP: str(b)}) == str(a)
    empty_rp = cc(tmp_path / "d.so", needs=(a,), runpath=str(tmp_path / "none"))
    assert probe_search(empty_rp, cache={DEP: str(b)}) == str(b)


def test_a_stale_cache_entry_is_not_a_library(tmp_path):
    a = dep(tmp_path / "a")
    consumer = cc(tmp_path / "c.so", needs=(a,), runpath=str(tmp_path / "none"))
    assert probe_search(consumer, cache={DEP: str(tmp_path / "deleted" / DEP)}) is None


def test_the_default_directories_come_last_in_their_order(tmp_path):
    libc = next(os.path.join(d, "libc.so.6") for d in elf.DEFAULT_DIRS if os.path.isfile(os.path.join(d, "libc.so.6")))
    entry = (["libc.so.6"], None, "", str(tmp_path))
    assert elf.search(entry, "libc.so.6", str(tmp_path), "", {}) == libc
    assert elf.search(entry, "libc.so.6", str(tmp_path), "", {"libc.so.6": "/nonexistent/libc.so.6"}) == libc
    mine = cc(tmp_path / "libc.so.6", soname="libc.so.6")  # a search path wins over the defaults
    assert elf.search(entry, "libc.so.6", str(tmp_path), "", {}) == str(mine)
    assert elf.search(entry, "libk3-nothing-has-this.so.9", str(tmp_path), "", {}) is None


def test_the_ld_cache_is_what_ldconfig_prints():
    cache = elf.ld_cache()
    if not cache:
        pytest.skip("no ldconfig here")
    assert "libc.so.6" in cache and os.path.exists(cache["libc.so.6"])


# --- the whole probe ----------------------------------------------------------------------------


def run_probe(request: dict, env: dict | None = None) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", probes.script("elf"), json.dumps(request)],
        capture_output=True,
        text=True,
        env={**os.environ, "LD_LIBRARY_PATH": "", **(env or {})},
        timeout=120,
    )
    found = probes.parse(proc.stdout)
    assert found is not None, proc.stderr
    return found


def request(root: Path, **kw) -> dict:
    return {
        "roots": [str(root)],
        "ld_library_path": "",
        "cuda_major": 12,
        "tracking": list(contract.CUDA_TRACKING_LIBS),
        **kw,
    }


def test_other_cuda_majors_on_both_sides_are_reported_and_12_is_not(tmp_path):
    lib = tmp_path / "prefix" / "lib"
    libs = [cc(lib / f"libcudart.so.{m}", soname=f"libcudart.so.{m}") for m in (11, 12, 13)] + [
        cc(lib / "libcublasLt.so.11.0", soname="libcublasLt.so.11.0")
    ]
    cc(tmp_path / "prefix" / "ext.so", needs=tuple(libs), runpath="$ORIGIN/lib")
    found = run_probe(request(tmp_path / "prefix"))
    got = sorted((e["needed"], e["major"]) for e in found["other_major"])
    assert got == [("libcublasLt.so.11.0", 11), ("libcudart.so.11", 11), ("libcudart.so.13", 13)]
    assert found["unresolved"] == [] and found["preloaded"] == 0
    assert {e["path"] for e in found["other_major"]} == {str(tmp_path / "prefix" / "ext.so")}
    assert run_probe(request(tmp_path / "prefix", cuda_major=13))["other_major"][0]["major"] in (11, 12)


def test_a_name_only_like_a_tracked_library_is_not_a_cuda_major(tmp_path):
    lib = tmp_path / "prefix" / "lib"
    libs = [cc(lib / n, soname=n) for n in ("libcudart_static.so.11", "libxcudart.so.11", "libcudart.so.x11")]
    cc(tmp_path / "prefix" / "ext.so", needs=tuple(libs), runpath="$ORIGIN/lib")
    assert run_probe(request(tmp_path / "prefix"))["other_major"] == []


def test_a_library_found_only_by_the_soname_a_file_under_the_prefix_carries_is_preloaded(tmp_path):
    prefix = tmp_path / "prefix"
    # pip's auditwheel names vendored libraries with a hash; the NEEDED entry is the soname
    hashed = cc(prefix / "pkg.libs" / "libk3pre-1a2b3c4d.so.1", soname="libk3pre.so.1")
    cc(prefix / "pkg" / "ext.so", needs=(hashed,))
    outside = dep(tmp_path / "outside")  # needed, provided by nothing under the prefix
    cc(prefix / "pkg" / "broken.so", needs=(outside,))
    found = run_probe(request(prefix))
    assert found["preloaded"] == 1
    assert found["unresolved"] == [{"path": str(prefix / "pkg" / "broken.so"), "needed": DEP, "dist": None}]
    assert found["elves"] == 3


def test_runpath_hiding_rpath_leaves_the_library_unresolved(tmp_path):
    prefix = tmp_path / "prefix"
    outside = dep(tmp_path / "outside")
    (prefix / "empty").mkdir(parents=True)
    cc(prefix / "old.so", needs=(outside,), rpath=str(outside.parent))
    with_rpath_and_runpath(prefix / "both.so", needs=(outside,), rpath=str(outside.parent), runpath="$ORIGIN/empty")
    found = run_probe(request(prefix))
    assert [e["path"] for e in found["unresolved"]] == [str(prefix / "both.so")]


def test_the_request_s_ld_library_path_is_searched(tmp_path):
    prefix = tmp_path / "prefix"
    outside = dep(tmp_path / "outside")
    cc(prefix / "c.so", needs=(outside,))
    assert len(run_probe(request(prefix))["unresolved"]) == 1
    assert run_probe(request(prefix, ld_library_path=f"/nonexistent:{outside.parent}"))["unresolved"] == []


def test_symlinks_and_other_files_are_not_elves(tmp_path):
    prefix = tmp_path / "prefix"
    real = cc(prefix / "libk3real.so.1", soname="libk3real.so.1")
    (prefix / "libk3real.so").symlink_to(real.name)
    (prefix / "README").write_text("text\n")
    (prefix / "static.a").write_bytes(b"!<arch>\n")
    assert run_probe(request(prefix))["elves"] == 1


def test_runpath_lists_are_searched_in_order(tmp_path):
    a, b = dep(tmp_path / "a"), dep(tmp_path / "b")
    agree(cc(tmp_path / "c.so", needs=(a,), runpath=f"{tmp_path / 'none'}:{b.parent}:{a.parent}"), expect=b)


def test_a_needed_name_with_a_slash_is_not_looked_up_in_the_search_paths(tmp_path, monkeypatch):
    lib = cc(tmp_path / "dirs" / "sub" / "libx.so", soname="libx.so")
    entry = (["sub/libx.so"], None, "", str(tmp_path / "dirs"))
    monkeypatch.chdir(tmp_path)  # relative to the working directory, as ld.so opens it
    assert elf.search(entry, "sub/libx.so", str(tmp_path), str(tmp_path / "dirs"), {}) is None
    monkeypatch.chdir(tmp_path / "dirs")
    assert elf.search(entry, "sub/libx.so", str(tmp_path), "", {}) == "sub/libx.so"
    assert lib.exists()


def test_every_needed_entry_of_a_file_is_judged_not_only_up_to_the_first_found(tmp_path):
    prefix = tmp_path / "prefix"
    here = dep(prefix / "lib")
    gone = cc(tmp_path / "outside" / "libk3gone.so.2", soname="libk3gone.so.2")
    cc(prefix / "c.so", needs=(here, gone), runpath="$ORIGIN/lib")  # found first, then missing
    found = run_probe(request(prefix))
    assert [e["needed"] for e in found["unresolved"]] == ["libk3gone.so.2"]


def test_the_cache_size_and_the_dlopen_answers_are_reported(tmp_path):
    (tmp_path / "prefix").mkdir()
    found = run_probe(request(tmp_path / "prefix", dlopen=["libc.so.6", "libk3-nothing-has-this.so.9"]))
    assert found["ld_cache"] == len(elf.ld_cache())
    assert found["dlopen"]["libc.so.6"] is None
    assert "libk3-nothing-has-this.so.9" in found["dlopen"]["libk3-nothing-has-this.so.9"]
    assert run_probe(request(tmp_path / "prefix"))["dlopen"] == {}


def test_every_needed_entry_is_judged_after_a_preloaded_one(tmp_path):
    prefix = tmp_path / "prefix"
    pre = cc(prefix / "pkg.libs" / "libk3pre-1a2b3c4d.so.1", soname="libk3pre.so.1")
    gone = cc(tmp_path / "outside" / "libk3gone.so.2", soname="libk3gone.so.2")
    cc(prefix / "pkg" / "c.so", needs=(pre, gone))  # preloaded first, then missing
    found = run_probe(request(prefix))
    assert found["preloaded"] == 1 and [e["needed"] for e in found["unresolved"]] == ["libk3gone.so.2"]

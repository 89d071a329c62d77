"""The ELF probe's rules pinned exactly (builder/checks/probes/elf.py, issue 38), on real ELF files
the C compiler makes here, each result stated whole: RPATH before LD_LIBRARY_PATH and ignored when
RUNPATH is present, RUNPATH not used for the dependencies of a dependency (as this machine's ld.so
has it), CUDA majors on both sides of the target's with the boundaries of the tracked names, a
library found by the soname a file under the prefix carries (preloaded), $ORIGIN and ${ORIGIN}
through the whole probe, and a stale ld.so cache entry (the cache names a file that is gone)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from builder.checks.probes import elf
from tests.unit.test_elf_ld import CC, DEP, LDSO, cc, dep, request, run_probe, with_rpath_and_runpath

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler on this machine")


def traced(path: Path) -> dict[str, str | None]:
    """soname -> where this machine's ld.so finds it when loading ``path`` (None: not found)."""
    if LDSO is None:
        pytest.skip("no x86-64 or aarch64 ld.so here")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env["LD_TRACE_LOADED_OBJECTS"] = "1"
    out = subprocess.run([LDSO, str(path)], capture_output=True, text=True, env=env).stdout
    found: dict[str, str | None] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>":
            found[parts[0]] = None if "not found" in line else os.path.realpath(parts[2])
    return found


# --- RPATH and RUNPATH ---------------------------------------------------------------------------


def test_rpath_wins_over_ld_library_path_and_runpath_loses_to_it_in_the_whole_probe(tmp_path):
    prefix = tmp_path / "prefix"
    a, b = dep(tmp_path / "a"), dep(tmp_path / "b")
    cc(prefix / "old.so", needs=(a,), rpath=str(tmp_path / "none"))  # RPATH misses, LD_LIBRARY_PATH finds
    found = run_probe(request(prefix, ld_library_path=str(b.parent)))
    assert (found["unresolved"], found["preloaded"], found["elves"]) == ([], 0, 1)
    # the same RPATH names a directory without DEP; RUNPATH with it is hidden (both carried)
    with_rpath_and_runpath(prefix / "both.so", needs=(a,), rpath=str(tmp_path / "none"), runpath=str(a.parent))
    assert run_probe(request(prefix))["unresolved"] == [{"path": str(prefix / "old.so"), "needed": DEP, "dist": None}]
    entry = elf.dynamic(str(prefix / "both.so"))
    assert entry is not None
    # with both tags, the RPATH is not searched at all, not even after LD_LIBRARY_PATH and RUNPATH
    assert elf.search(entry, DEP, str(prefix), "", {}) == str(a)
    rp_only = (entry[0], None, str(a.parent), str(tmp_path / "none"))
    assert elf.search(rp_only, DEP, str(prefix), "", {}) is None
    assert elf.search(rp_only, DEP, str(prefix), str(b.parent), {}) == str(b)
    # without RUNPATH the RPATH comes first, LD_LIBRARY_PATH second
    no_rp = (entry[0], None, str(a.parent), "")
    assert elf.search(no_rp, DEP, str(prefix), str(b.parent), {}) == str(a)
    assert elf.search((entry[0], None, str(tmp_path / "none"), ""), DEP, str(prefix), str(b.parent), {}) == str(b)


def test_runpath_is_not_used_for_a_dependency_s_own_dependencies(tmp_path):
    """A's RUNPATH finds B, but not what B needs: ld.so uses DT_RUNPATH for the object's own
    NEEDED entries only. The probe judges B by B's own paths, so B's need is unresolved, exactly
    where ld.so says 'not found'."""
    prefix, outside = tmp_path / "prefix", tmp_path / "outside"
    c = cc(outside / "libk3c.so.1", soname="libk3c.so.1")
    b = cc(prefix / "b" / "libk3b.so.1", soname="libk3b.so.1", needs=(c,))
    a = cc(prefix / "a.so", needs=(b,), runpath=f"{b.parent}:{outside}")
    assert traced(a) == {"libk3b.so.1": str(b), "libk3c.so.1": None, **_libc(a)}
    found = run_probe(request(prefix))
    assert found["unresolved"] == [{"path": str(b), "needed": "libk3c.so.1", "dist": None}]
    assert (found["preloaded"], found["elves"]) == (0, 2)
    # B's own RUNPATH to C's directory is what resolves it
    cc(prefix / "b" / "libk3b.so.1", soname="libk3b.so.1", needs=(c,), runpath=str(outside))
    assert run_probe(request(prefix))["unresolved"] == []


def _libc(path: Path) -> dict[str, str | None]:
    return {k: v for k, v in traced(path).items() if not k.startswith("libk3")}


# --- CUDA majors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "major"),
    [
        ("libcudart.so.11", 11),  # older
        ("libcudart.so.11.8.89", 11),
        ("libcudart.so.13", 13),  # newer
        ("libcublas.so.120", 120),  # a major is a whole number: 120 is not 12
        ("libcudart.so.1", 1),
        ("libcudart.so.12", None),  # the target's own
        ("libcudart.so.12.9.79", None),
        ("libcudart.so", None),  # no major
        ("libcudart.so.11a", None),  # not a version
        ("libcudart.so.11.x", None),
    ],
)
def test_the_cuda_major_of_each_needed_name(tmp_path, name, major):
    prefix = tmp_path / "prefix"
    lib = cc(prefix / "lib" / name, soname=name)
    cc(prefix / "ext.so", needs=(lib,), runpath="$ORIGIN/lib")
    found = run_probe(request(prefix))
    want = [] if major is None else [{"path": str(prefix / "ext.so"), "needed": name, "major": major, "dist": None}]
    assert found["other_major"] == want
    assert found["unresolved"] == []


def test_an_other_major_that_is_also_missing_is_reported_twice(tmp_path):
    prefix = tmp_path / "prefix"
    gone = cc(tmp_path / "outside" / "libcudart.so.11.0", soname="libcudart.so.11.0")
    cc(prefix / "ext.so", needs=(gone,))
    found = run_probe(request(prefix, cuda_major=13))
    path = str(prefix / "ext.so")
    assert found["other_major"] == [{"path": path, "needed": "libcudart.so.11.0", "major": 11, "dist": None}]
    assert found["unresolved"] == [{"path": path, "needed": "libcudart.so.11.0", "dist": None}]


# --- preloaded by soname ---------------------------------------------------------------------------


def test_preloaded_counts_each_need_a_file_under_the_prefix_provides_by_its_soname(tmp_path):
    prefix = tmp_path / "prefix"
    hashed = cc(prefix / "pkg.libs" / "libk3pre-1a2b3c4d.so.1", soname="libk3pre.so.1")
    for ext in ("one.so", "two.so"):
        cc(prefix / "pkg" / ext, needs=(hashed,))
    found = run_probe(request(prefix))
    assert (found["preloaded"], found["unresolved"], found["elves"]) == (2, [], 3)
    # a need nobody under the prefix provides is unresolved, and counts no preload
    other = dep(tmp_path / "outside")
    cc(prefix / "pkg" / "three.so", needs=(other,))
    found = run_probe(request(prefix))
    assert found["preloaded"] == 2
    assert found["unresolved"] == [{"path": str(prefix / "pkg" / "three.so"), "needed": DEP, "dist": None}]
    # the provider outside the roots provides nothing: the same need is then unresolved
    found = run_probe({**request(prefix / "pkg")})
    assert found["preloaded"] == 0 and len(found["unresolved"]) == 3


def test_a_search_path_hit_is_not_counted_as_preloaded(tmp_path):
    prefix = tmp_path / "prefix"
    lib = cc(prefix / "lib" / "libk3pre.so.1", soname="libk3pre.so.1")
    cc(prefix / "ext.so", needs=(lib,), runpath="$ORIGIN/lib")
    assert run_probe(request(prefix))["preloaded"] == 0


# --- $ORIGIN --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("origin", ["$ORIGIN", "${ORIGIN}"])
@pytest.mark.parametrize("tag", ["rpath", "runpath"])
def test_origin_through_the_whole_probe_with_a_parent_step_and_a_list(tmp_path, origin, tag):
    prefix = tmp_path / "prefix"
    lib = dep(prefix / "nvidia" / "lib")
    consumer = cc(prefix / "pkg" / "sub" / "ext.so", needs=(lib,), **{tag: f"/nonexistent:{origin}/../../nvidia/lib"})
    assert run_probe(request(prefix))["unresolved"] == []
    entry = elf.dynamic(str(consumer))
    assert entry is not None
    assert elf.search(entry, DEP, str(consumer.parent), "", {}) == f"{consumer.parent}/../../nvidia/lib/{DEP}"
    assert elf.search(entry, DEP, str(tmp_path), "", {}) is None  # $ORIGIN is the asking file's directory


# --- the ld.so cache ---------------------------------------------------------------------------------


def test_a_stale_cache_entry_falls_through_to_the_default_directories(tmp_path):
    libc = next(os.path.join(d, "libc.so.6") for d in elf.DEFAULT_DIRS if os.path.isfile(os.path.join(d, "libc.so.6")))
    entry = (["libc.so.6"], None, "", "")
    gone = tmp_path / "gone" / "libc.so.6"
    assert elf.search(entry, "libc.so.6", str(tmp_path), "", {"libc.so.6": str(gone)}) == libc
    a = dep(tmp_path / "a")
    dentry = ([DEP], None, "", "")
    assert elf.search(dentry, DEP, str(tmp_path), "", {DEP: str(a)}) == str(a)  # a live entry is used
    a.unlink()  # the cache still names it: stale
    assert elf.search(dentry, DEP, str(tmp_path), "", {DEP: str(a)}) is None
    # another soname's entry is not this one's
    b = dep(tmp_path / "b")
    assert elf.search(dentry, DEP, str(tmp_path), "", {"libk3other.so.1": str(b)}) is None

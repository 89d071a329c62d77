"""The hygiene and trees probes pinned exactly (builder/checks/probes/hygiene.py, trees.py; issue
38). Hygiene: a RELATIVE symlink judged by where it resolves (into a build root by `..` steps,
through a link to a directory, to the root itself, beside it under a longer name), each finding
stated whole; and the ELF search-path rule (hygiene.search_paths), which no test reached: every
DT_RPATH / DT_RUNPATH entry of a real ELF file, relative, under a build root, missing, $ORIGIN or
another $ token, empty. Trees: compiled modules (.so, .pyc) as modules of their package, and
directories that are not packages (no __init__.py) as namespace packages or data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from builder.checks.probes import _dyn, hygiene, trees
from tests.unit.test_elf_ld import CC, cc
from tests.unit.test_probes_links_and_trees import EXT, files, run


@pytest.fixture(autouse=True)
def _hygiene_as_run(monkeypatch):
    """hygiene.py runs with _dyn.py prepended (probes.PRELUDES): its elf_files() is defined there."""
    monkeypatch.setattr(hygiene, "elf_files", _dyn.elf_files, raising=False)


@pytest.fixture()
def tree(tmp_path):
    prefix, build = tmp_path / "prefix", tmp_path / "build"
    (prefix / "lib" / "a" / "b").mkdir(parents=True)
    (build / "wheels").mkdir(parents=True)
    (build / "wheels" / "x.whl").write_text("x")
    (tmp_path / "build-cache").mkdir()
    (tmp_path / "build-cache" / "x.whl").write_text("x")
    return tmp_path, prefix, build


def _hyg(prefix: Path, build_roots: list[str]) -> dict:
    return hygiene.main({"roots": [str(prefix)], "build_roots": build_roots})


# --- hygiene: relative links ------------------------------------------------------------------------


@pytest.mark.parametrize("root_form", ["{b}", "{b}/"], ids=["plain", "trailing-slash"])
def test_relative_links_are_judged_where_they_resolve(tree, root_form):
    tmp, prefix, build = tree
    deep = prefix / "lib" / "a" / "b"
    os.symlink("../../../../build/wheels/x.whl", deep / "into")  # .. steps up and into the root
    os.symlink("../../../../build", deep / "root")  # the root itself
    os.symlink("../../../../build-cache/x.whl", deep / "beside")  # a longer name: not the root
    os.symlink("../../../../build/wheels/gone.whl", deep / "gone")  # dangling, not outside
    os.symlink("b/into", prefix / "lib" / "a" / "via")  # a relative link to a link into the root
    os.symlink("../../a", prefix / "lib" / "a" / "b" / "loopish")  # resolves inside the prefix: fine
    found = _hyg(prefix, [root_form.format(b=build)])
    assert found["outside"] == [
        [str(prefix / "lib" / "a" / "via"), "b/into"],
        [str(deep / "into"), "../../../../build/wheels/x.whl"],
        [str(deep / "root"), "../../../../build"],
    ]
    assert found["dangling"] == [[str(deep / "gone"), "../../../../build/wheels/gone.whl"]]
    assert (found["links"], found["counts"]) == (6, {"dangling": 1, "outside": 3, "named": 0})


def test_a_relative_link_out_of_the_prefix_but_not_into_a_build_root_is_fine(tree):
    tmp, prefix, build = tree
    (tmp / "usr" / "lib").mkdir(parents=True)
    (tmp / "usr" / "lib" / "libz.so.1").write_text("z")
    os.symlink("../../usr/lib/libz.so.1", prefix / "lib" / "libz.so.1")
    found = _hyg(prefix, [str(build), str(tmp / "ctx")])
    assert (found["outside"], found["dangling"], found["links"]) == ([], [], 1)


def test_a_relative_link_into_the_second_build_root_is_outside(tree):
    tmp, prefix, build = tree
    (tmp / "src" / "vllm").mkdir(parents=True)
    os.symlink("../../src/vllm", prefix / "lib" / "vllm-src")
    found = _hyg(prefix, [str(build), str(tmp / "src")])
    assert found["outside"] == [[str(prefix / "lib" / "vllm-src"), "../../src/vllm"]]


def test_under_is_the_root_or_below_it_and_nothing_else():
    roots = ["/build", "/src/"]
    assert [hygiene.under(p, roots) for p in ("/build", "/build/x", "/src", "/src/a/b")] == [True] * 4
    assert [hygiene.under(p, roots) for p in ("/buildx", "/build-cache/x", "/", "/srcs", "/usr/build")] == [False] * 5


# --- hygiene: the ELF search paths --------------------------------------------------------------


pytestmark_cc = pytest.mark.skipif(CC is None, reason="no C compiler on this machine")


@pytestmark_cc
def test_each_bad_search_path_entry_of_an_elf_file_is_named(tree):
    tmp, prefix, build = tree
    there = tmp / "usr" / "lib"
    there.mkdir(parents=True)
    # $ORIGIN, ${ORIGIN} and other $ tokens pass, and the entries after them are still judged
    rpath = f"$ORIGIN/../gone:lib/rel:${{ORIGIN}}/x:{build}/wheels:$LIB/y:{tmp}/nowhere::{there}"
    old = cc(prefix / "lib" / "old.so", rpath=rpath)
    new = cc(prefix / "lib" / "new.so", runpath=f"{build}:./here:{there}")
    found = _hyg(prefix, [str(build)])
    assert found["named"] == [
        [str(new), str(build), f"DT_RUNPATH {build} is under a build-only root"],
        [str(new), "./here", "DT_RUNPATH ./here is relative: resolved against the current directory"],
        [str(old), "lib/rel", "DT_RPATH lib/rel is relative: resolved against the current directory"],
        [str(old), f"{build}/wheels", f"DT_RPATH {build}/wheels is under a build-only root"],
        [str(old), f"{tmp}/nowhere", f"DT_RPATH {tmp}/nowhere does not exist in the image"],
    ]
    assert found["counts"]["named"] == 5


@pytestmark_cc
def test_a_search_path_entry_is_normalised_before_it_is_judged(tree):
    tmp, prefix, build = tree
    (tmp / "usr" / "lib").mkdir(parents=True)
    sneaky = f"{tmp}/usr/../build/wheels"  # names the build root by a detour
    fine = f"{build}/../usr/lib"  # passes through the root's name, lands outside it
    lib = cc(prefix / "lib" / "s.so", runpath=f"{sneaky}:{fine}")
    found = _hyg(prefix, [str(build)])
    assert found["named"] == [[str(lib), sneaky, f"DT_RUNPATH {sneaky} is under a build-only root"]]


@pytestmark_cc
def test_search_paths_through_the_probe_as_the_checks_run_it(tree):
    tmp, prefix, build = tree
    lib = cc(prefix / "lib" / "s.so", rpath=f"{build}/wheels")
    found = run("hygiene", {"roots": [str(prefix)], "build_roots": [str(build)]})
    assert found["named"] == [[str(lib), f"{build}/wheels", f"DT_RPATH {build}/wheels is under a build-only root"]]


# --- trees: compiled modules and directories that are not packages -----------------------------------


def test_compiled_modules_beside_sources_each_once(tmp_path, monkeypatch):
    files(tmp_path, {"k3v/__init__.py": "", "k3v/fast.py": "", "k3v/sub/__init__.py": ""})
    for rel in (f"k3v/fast{EXT}", "k3v/sub/only.pyc", f"k3v/sub/_ops{EXT}", "k3v/__init__.pyc", "k3v/x.so.1"):
        (tmp_path / rel).write_bytes(b"\x7fELF")
    monkeypatch.syspath_prepend(str(tmp_path))
    # fast.py and its compiled twin are one module; __init__ in any form is the package itself;
    # a versioned .so.1 is a library, not a module
    assert trees.modules_of("k3v") == ["k3v", "k3v.fast", "k3v.sub", "k3v.sub._ops", "k3v.sub.only"]


def test_directories_without_init_are_namespace_packages_or_data(tmp_path, monkeypatch):
    files(
        tmp_path,
        {
            "k3w/__init__.py": "",
            "k3w/nspkg/a.py": "",  # no __init__.py, a module in it: a namespace package
            "k3w/nspkg/deeper/b.pyc": "",  # bytecode only, deeper still
            "k3w/data/x.json": "",  # no module file: data, not listed
            "k3w/data/more/c.py": "",  # but a module under it is walked to
            "k3w/kernels/k.cu": "",
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert trees.modules_of("k3w") == [
        "k3w",
        "k3w.data.more",
        "k3w.data.more.c",
        "k3w.nspkg",
        "k3w.nspkg.a",
        "k3w.nspkg.deeper",
        "k3w.nspkg.deeper.b",
    ]

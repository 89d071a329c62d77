"""Links and trees in the hygiene and trees probes (builder/checks/probes/hygiene.py, trees.py), on
trees made here: links relative to where they stand that land in a build-only root, roots named
exactly (not as a prefix of a longer name), each separator that starts a named path; and which files and
directories under a tree are modules: compiled modules (a real one, built with the C compiler
against this interpreter's headers), data-only directories, directories whose names are no
Python identifier, bytecode caches, namespace directories.

Most run the probe's functions in this process (they are plain standard-library modules); one of
each runs as the checks run them (`python -c <script> <request>`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from builder.checks import probes
from builder.checks.probes import _dyn, hygiene, trees

CC = shutil.which("cc") or shutil.which("gcc")
EXT = next(s for s in __import__("importlib.machinery").machinery.EXTENSION_SUFFIXES if s.startswith(".cpython"))


@pytest.fixture(autouse=True)
def _hygiene_as_run(monkeypatch):
    """hygiene.py runs with _dyn.py prepended (probes.PRELUDES): its elf_files() is defined there."""
    monkeypatch.setattr(hygiene, "elf_files", _dyn.elf_files, raising=False)


def run(name: str, request: dict, env: dict | None = None) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", probes.script(name), json.dumps(request)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )
    found = probes.parse(proc.stdout)
    assert found is not None, proc.stderr
    return found


def files(root: Path, spec: dict[str, str]) -> Path:
    for rel, text in spec.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


# --- hygiene: links ------------------------------------------------------------------------------


@pytest.fixture()
def layout(tmp_path):
    """prefix/ (the application prefix) beside build/ (a build-only root that exists here)."""
    prefix, build = tmp_path / "prefix", tmp_path / "build"
    (prefix / "lib" / "deep").mkdir(parents=True)
    (build / "dist").mkdir(parents=True)
    (build / "dist" / "libx.so").write_text("x")
    (tmp_path / "buildx").mkdir()
    (tmp_path / "buildx" / "libx.so").write_text("x")
    return prefix, build


def test_a_relative_link_into_a_build_root_is_outside(layout):
    prefix, build = layout
    os.symlink("../../../build/dist/libx.so", prefix / "lib" / "deep" / "libx.so")
    os.symlink("../../build", prefix / "lib" / "the-root")  # the root itself
    found = hygiene.main({"roots": [str(prefix)], "build_roots": [str(build)]})
    assert found["outside"] == [  # in walk order: a directory's entries before what is under them
        [str(prefix / "lib" / "the-root"), "../../build"],
        [str(prefix / "lib" / "deep" / "libx.so"), "../../../build/dist/libx.so"],
    ]
    assert found["dangling"] == [] and found["links"] == 2


def test_a_chain_of_links_is_judged_by_where_it_ends(layout):
    prefix, build = layout
    os.symlink("../../build/dist", prefix / "lib" / "hop")
    os.symlink("hop/libx.so", prefix / "lib" / "libx.so")  # relative to a link inside the prefix
    found = hygiene.main({"roots": [str(prefix)], "build_roots": [str(build) + "/"]})
    assert sorted(p for p, _ in found["outside"]) == [str(prefix / "lib" / "hop"), str(prefix / "lib" / "libx.so")]


def test_a_root_is_a_whole_name_not_a_prefix(layout):
    prefix, build = layout
    os.symlink("../../buildx/libx.so", prefix / "lib" / "libx.so")
    os.symlink("deep", prefix / "lib" / "inside")
    found = hygiene.main({"roots": [str(prefix)], "build_roots": [str(build)]})
    assert found["outside"] == [] and found["dangling"] == [] and found["links"] == 2


def test_a_dangling_relative_link_is_dangling_not_outside(layout):
    prefix, build = layout
    os.symlink("../../build/dist/gone.so", prefix / "lib" / "gone.so")
    found = hygiene.main({"roots": [str(prefix)], "build_roots": [str(build)]})
    assert found["dangling"] == [[str(prefix / "lib" / "gone.so"), "../../build/dist/gone.so"]]
    assert found["outside"] == []


def test_findings_are_capped_and_counted(layout):
    prefix, build = layout
    for i in range(hygiene.LIMIT + 3):
        os.symlink(f"nowhere-{i:03}", prefix / "lib" / f"l{i:03}")
    found = hygiene.main({"roots": [str(prefix)], "build_roots": [str(build)]})
    assert len(found["dangling"]) == hygiene.LIMIT and found["counts"]["dangling"] == hygiene.LIMIT + 3
    assert found["dangling"][0][1] == "nowhere-000"


def test_a_relative_link_into_a_build_root_through_the_probe_as_the_checks_run_it(layout):
    prefix, build = layout
    os.symlink("../../../build/dist/libx.so", prefix / "lib" / "deep" / "libx.so")
    found = run("hygiene", {"roots": [str(prefix)], "build_roots": [str(build)]})
    assert found["outside"] == [[str(prefix / "lib" / "deep" / "libx.so"), "../../../build/dist/libx.so"]]
    assert found["counts"] == {"dangling": 0, "outside": 1, "named": 0}


# --- hygiene: named paths ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "/build/x",
        "prefix=/build/x",
        "PATH=/usr/bin:/build/bin",
        "a;/build/b",
        "set(X /build/y)",
        "f(/build/y)",
        "a,/build",
        "'/build/y'",
        '"/build/y"',
        "url file:///build/y.whl",
        "tab\t/build/y",
    ],
)
def test_each_separator_before_a_build_path_names_it(tmp_path, line):
    (tmp_path / "x.pth").write_text(f"first line\n{line}\nlast\n")
    found = hygiene.main({"roots": [str(tmp_path)], "build_roots": ["/build"]})
    assert found["named"] == [[str(tmp_path / "x.pth"), "/build", line]]


@pytest.mark.parametrize("line", ["/buildx/y", "vllm/build/y", "${ROOT}/build/y", "x/build", "/build-dir/y", "/builds"])
def test_a_longer_name_or_a_relative_path_is_not_a_build_path(tmp_path, line):
    (tmp_path / "x.pc").write_text(line + "\n")
    assert hygiene.main({"roots": [str(tmp_path)], "build_roots": ["/build"]})["named"] == []


def test_which_files_are_read(tmp_path):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, text, mode in (
        ("script", "#!/build/venv/bin/python\n", 0o755),  # an executable's shebang: read
        ("not-exec", "#!/build/venv/bin/python\n", 0o644),  # not executable: not read
        ("binary", "\x7fELF /build/x\n", 0o755),  # no shebang: not a path a tool follows
        ("late", "#!/bin/sh\n/build/x\n", 0o755),  # only the shebang line counts
    ):
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(mode)
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "script").write_text("#!/build/venv/bin/python\n")
    (tmp_path / "lib" / "script").chmod(0o755)  # executable, but not in a bin directory
    (tmp_path / "lib" / "notes.txt").write_text("/build/x\n")
    (tmp_path / "lib" / "RECORD").write_text("x,,\n/build/y,,\n")
    found = hygiene.main({"roots": [str(tmp_path)], "build_roots": ["/build"]})
    assert sorted(Path(p).name for p, _, _ in found["named"]) == ["RECORD", "script"]
    assert found["files"] == 4  # the three executables in bin/ and RECORD


# --- trees: which names are modules --------------------------------------------------------------


def test_compiled_modules_inside_a_tree_are_modules(tmp_path, monkeypatch):
    files(tmp_path, {"k3t/__init__.py": "", "k3t/ops/__init__.py": "", "k3t/csrc/kernel.cu": ""})
    for rel in (f"k3t/ops/_C{EXT}", "k3t/_ext.abi3.so", "k3t/plain.so", "k3t/only_so/_k.abi3.so"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"\x7fELF")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert trees.modules_of("k3t") == [
        "k3t",
        "k3t._ext",
        "k3t.only_so",
        "k3t.only_so._k",
        "k3t.ops",
        "k3t.ops._C",
        "k3t.plain",
    ]


def test_directories_that_are_not_packages(tmp_path, monkeypatch):
    files(
        tmp_path,
        {
            "k3u/__init__.py": "",
            "k3u/include/k.h": "",  # data only: no module
            "k3u/my-data/helper.py": "",  # no identifier: never importable, not walked
            "k3u/my-data/inner/mod.py": "",
            "k3u/1st/mod.py": "",
            "k3u/__pycache__/x.cpython-311.pyc": "",
            "k3u/ns/mod.py": "",  # no __init__: a namespace package, importable
            "k3u/kernels/src/inner/gen.py": "",  # under data-only directories: still walked
            "k3u/2bad.py": "",
            "k3u/good-name.py": "",
            "k3u/cached.pyc": "",  # sourceless bytecode is a module too
            "k3u/README.md": "",
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert trees.modules_of("k3u") == [
        "k3u",
        "k3u.cached",
        "k3u.kernels.src.inner",
        "k3u.kernels.src.inner.gen",
        "k3u.ns",
        "k3u.ns.mod",
    ]


def test_a_tree_that_is_a_module_not_a_package_is_itself_alone(tmp_path, monkeypatch):
    files(tmp_path, {"k3single.py": "X = 1\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert trees.modules_of("k3single") == ["k3single"]
    with pytest.raises(ModuleNotFoundError, match="no module named 'k3nothing'"):
        trees.modules_of("k3nothing")


@pytest.mark.parametrize(
    "name, pattern, skip",
    [
        ("a.b.c", "a.b.*", True),
        ("a.b", "a.b.*", True),  # "pkg.*" skips pkg itself
        ("a.bc", "a.b.*", False),
        ("a.b.c", "a.b", False),
        ("a.b.c", "*.c", True),
        ("a.B", "a.b", False),  # case matters: module names are case-sensitive
    ],
)
def test_skip_patterns(name, pattern, skip):
    assert trees.skipped(name, pattern) is skip


def test_a_real_compiled_module_inside_a_tree_imports_through_the_probe(tmp_path):
    include = sysconfig.get_paths()["include"]
    if CC is None or not Path(include, "Python.h").exists():
        pytest.skip("no C compiler or no Python headers here")
    files(tmp_path, {"k3c/__init__.py": "", "k3c/ops/__init__.py": "", "k3c/include/k.h": ""})
    src = tmp_path / "good.c"
    src.write_text(
        "#include <Python.h>\n"
        'static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, NULL};\n'
        "PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&m); }\n"
    )
    subprocess.run(
        [CC, "-shared", "-fPIC", f"-I{include}", "-o", str(tmp_path / "k3c" / "ops" / f"_C{EXT}"), str(src)],
        check=True,
        capture_output=True,
    )
    (tmp_path / "k3c" / "ops" / f"_broken{EXT}").write_bytes(b"\x7fELF not really")
    found = run("trees", {"trees": ["k3c"], "skip": [], "setup": []}, env={"PYTHONPATH": str(tmp_path)})
    assert found["trees"] == {"k3c": None}
    assert sorted(found["imported"]) == ["k3c", "k3c.ops", "k3c.ops._C", "k3c.ops._broken"]
    assert [k for k, v in found["imported"].items() if v is not None] == ["k3c.ops._broken"]
    assert found["imported"]["k3c.ops._broken"].startswith("ImportError: ")


def test_a_root_is_matched_by_its_whole_name_whatever_its_letters():
    assert hygiene.under("/X/y", ["/X"]) and hygiene.under("/X/y", ["/X/"]) and hygiene.under("/X", ["/X"])
    assert not hygiene.under("/usr/lib", ["/X"]) and not hygiene.under("/Xy", ["/X"])
    assert hygiene.pattern(["/X"]).search("a=/X/y") is not None
    assert hygiene.pattern(["/X"]).search("a=/Y/y") is None


def test_a_named_path_s_line_is_cut_at_200_characters_and_starts_after_its_newline(tmp_path):
    long = "/build/" + "x" * 300
    (tmp_path / "a.pth").write_text(f"\n{long}\n")
    (found,) = hygiene.main({"roots": [str(tmp_path)], "build_roots": ["/build"]})["named"]
    assert found[2] == long[:200]

"""The relocated CPython's build-time configuration is pointed at where it lives (the shape of
python-build-standalone's install_only tarball: prefix /install, clang)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "builder" / "dockerfile" / "templates" / "relocate_python.py"
spec = importlib.util.spec_from_file_location("relocate_python", SCRIPT)
relocate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(relocate)

PBS_VARS = {
    "prefix": "/install",
    "INCLUDEPY": "/install/include/python3.12",
    "LIBDIR": "/install/lib",
    "DESTDIRS": "/install /install/lib /install/lib/python3.12",
    "CC": "clang -pthread",
    "CXX": "clang++ -pthread",
    "LDSHARED": "/tools/clang-linux64/bin/clang -shared",
    "CFLAGS": "-fdebug-default-version=4 -O3 -I/install/include",
    "AR": "/tools/clang-linux64/bin/llvm-ar",
    "Py_ENABLE_SHARED": 0,
    "SOABI": "cpython-312-x86_64-linux-gnu",
}


def test_sysconfigdata_points_at_the_real_prefix_and_an_existing_compiler(tmp_path):
    data = tmp_path / "_sysconfigdata__linux_x86_64-linux-gnu.py"
    data.write_text(f"# generated\nbuild_time_vars = {PBS_VARS!r}\n")
    assert relocate.rewrite_sysconfigdata(data, "/opt/k3/python") == "/install"
    tree = ast.parse(data.read_text())
    values = ast.literal_eval(tree.body[0].value)
    assert values["INCLUDEPY"] == "/opt/k3/python/include/python3.12"
    assert values["DESTDIRS"] == "/opt/k3/python /opt/k3/python/lib /opt/k3/python/lib/python3.12"
    assert values["CC"] == "cc -pthread" and values["CXX"] == "c++ -pthread"
    assert values["LDSHARED"] == "cc -shared" and values["AR"] == "ar"
    assert values["CFLAGS"] == "-O3 -I/opt/k3/python/include"  # gcc rejects the clang-only flag
    assert values["Py_ENABLE_SHARED"] == 0 and values["SOABI"] == PBS_VARS["SOABI"]
    assert "/install" not in data.read_text()


def test_the_config_makefile_is_rewritten_the_same_way(tmp_path):
    makefile = tmp_path / "Makefile"
    makefile.write_text(
        "prefix=\t\t/install\nCC=\t\tclang -pthread\nINCLUDEPY=\t$(prefix)/include\nall:\n\t$(CC) -o x x.c\n"
    )
    relocate.rewrite_makefile(makefile, "/install", "/opt/k3/python")
    text = makefile.read_text()
    assert "prefix=\t\t/opt/k3/python\n" in text and "CC=\t\tcc -pthread\n" in text
    assert "\t$(CC) -o x x.c\n" in text  # recipes untouched


def test_a_tree_that_is_not_a_cpython_install_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="expected one lib/python3.X"):
        relocate.main(str(tmp_path))

"""The in-build helper that splits the wheel by ELF magic and compiles each layer's bytecode."""

from __future__ import annotations

import importlib.util
import marshal
import os
import shutil
import subprocess
import sys
from pathlib import Path

from builder.config import contract
from builder.deps import buildcontext

SCRIPT = buildcontext.LAYER_SCRIPT
SITE = "opt/k3/venv/lib/python3.11/site-packages"


def _run(*args: str) -> str:
    env = dict(os.environ, PYTHONHASHSEED="0")
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=True, env=env
    ).stdout


def test_script_names_match_the_contract():
    text = SCRIPT.read_text()
    assert f'NATIVE_RECORD = "{contract.NATIVE_RECORD_NAME}"' in text
    assert f'MARKER = "{contract.BYTECODE_MARKER}"' in text


def _stage(tmp_path: Path) -> Path:
    stage = tmp_path / "stage"
    pkg = stage / SITE / "pkg"
    dist = stage / SITE / "pkg-1.0.dist-info"
    pkg.mkdir(parents=True)
    dist.mkdir()
    shutil.copyfile("/bin/true", pkg / "_C.so")  # a real ELF file
    shutil.copyfile(pkg / "_C.so", pkg / "kernels.bin")  # ELF by magic, not by suffix
    (pkg / "fake.so").write_text("not ELF, only named like it\n")
    (pkg / "__init__.py").write_text("X = 1\n")
    (stage / "opt/k3/venv/bin").mkdir(parents=True)
    (stage / "opt/k3/venv/bin/tool").write_text("#!/opt/k3/venv/bin/python\n")
    (dist / "RECORD").write_text(
        "pkg/_C.so,sha256=aaa,10\npkg/kernels.bin,sha256=bbb,10\n"
        "pkg/fake.so,sha256=ccc,29\npkg/__init__.py,sha256=ddd,6\n"
        "../../../bin/tool,sha256=eee,27\npkg-1.0.dist-info/RECORD,,\n"
    )
    return stage


def test_split_by_elf_magic_with_the_elf_hashes_in_record_native(tmp_path):
    stage, native, py = _stage(tmp_path), tmp_path / "native", tmp_path / "py"
    _run("split", str(stage), str(native), str(py))
    files = lambda root: sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())  # noqa: E731
    assert files(native) == [
        f"{SITE}/pkg-1.0.dist-info/{contract.NATIVE_RECORD_NAME}",
        f"{SITE}/pkg/_C.so",
        f"{SITE}/pkg/kernels.bin",
    ]
    assert files(py) == [
        "opt/k3/venv/bin/tool",
        f"{SITE}/pkg-1.0.dist-info/RECORD",
        f"{SITE}/pkg/__init__.py",
        f"{SITE}/pkg/fake.so",
    ]
    assert not files(stage)
    record = (py / SITE / "pkg-1.0.dist-info/RECORD").read_text().splitlines()
    assert record == [
        "pkg/_C.so,,",
        "pkg/kernels.bin,,",
        "pkg/fake.so,sha256=ccc,29",
        "pkg/__init__.py,sha256=ddd,6",
        "../../../bin/tool,sha256=eee,27",
        "pkg-1.0.dist-info/RECORD,,",
    ]
    native_record = (native / SITE / "pkg-1.0.dist-info" / contract.NATIVE_RECORD_NAME).read_text().splitlines()
    assert native_record == ["pkg/_C.so,sha256=aaa,10", "pkg/kernels.bin,sha256=bbb,10"]


def test_bytecode_is_checked_hash_based_with_the_image_path_and_skips_what_does_not_compile(tmp_path):
    root = tmp_path / "layers" / "deps"
    pkg = root / SITE / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "good.py").write_text("VALUES = {'a', 'b', 'c'}\n")
    (pkg / "py2.py").write_text("print 'python 2'\n")
    out = _run("bytecode", str(root))
    assert (
        f"{contract.BYTECODE_MARKER} {root}: 1 compiled, 1 not compilable ({SITE}/pkg/py2.py), "
        "0 not deterministic" in out
    )
    pyc = Path(importlib.util.cache_from_source(str(pkg / "good.py"), optimization=""))
    data = pyc.read_bytes()
    assert data[:4] == importlib.util.MAGIC_NUMBER and int.from_bytes(data[4:8], "little") == 0b11
    assert data[8:16] == importlib.util.source_hash((pkg / "good.py").read_bytes())
    assert marshal.loads(data[16:]).co_filename == f"/{SITE}/pkg/good.py"  # where it lives in the image
    assert sorted(p.name for p in (pkg / "__pycache__").iterdir()) == [pyc.name]  # one optimization level
    before = data
    _run("bytecode", str(root))
    assert pyc.read_bytes() == before


def test_verify_drops_a_pyc_that_does_not_match_a_fresh_compile(tmp_path):
    root = tmp_path / "r"
    (root / "m").mkdir(parents=True)
    (root / "m" / "a.py").write_text("A = 1\n")
    _run("bytecode", str(root))
    pyc = Path(importlib.util.cache_from_source(str(root / "m" / "a.py"), optimization=""))
    pyc.write_bytes(pyc.read_bytes() + b"\0")  # as if a compile had come out different
    assert _run("verify", str(root)).split() == ["m/a.py"]
    assert not pyc.exists()


def test_a_shipped_pyc_of_a_source_that_does_not_compile_is_left_alone(tmp_path):
    root = tmp_path / "r"
    (root / "m").mkdir(parents=True)
    (root / "m" / "py2.py").write_text("print 'python 2'\n")
    shipped = Path(importlib.util.cache_from_source(str(root / "m" / "py2.py"), optimization=""))
    shipped.parent.mkdir()
    shipped.write_bytes(b"shipped by the wheel")
    assert "0 compiled, 1 not compilable" in _run("bytecode", str(root))
    assert shipped.read_bytes() == b"shipped by the wheel"


def test_a_symlinked_directory_moves_as_a_link(tmp_path):
    stage = tmp_path / "stage"
    (stage / "lib" / "real").mkdir(parents=True)
    (stage / "lib" / "real" / "a.txt").write_text("a\n")
    (stage / "lib" / "alias").symlink_to("real")
    _run("split", str(stage), str(tmp_path / "native"), str(tmp_path / "py"))
    alias = tmp_path / "py" / "lib" / "alias"
    assert alias.is_symlink() and os.readlink(alias) == "real" and (alias / "a.txt").read_text() == "a\n"

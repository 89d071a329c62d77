"""Inside the build stage: bytecode for one layer root, and the application split in two.

Runs with the image's own interpreter (``/opt/k3/venv/bin/python``, so the .pyc magic is the
runtime's), standard library only:

    python layer_files.py bytecode ROOT          # .pyc for every .py under ROOT, nothing else
    python layer_files.py split STAGE NATIVE PY  # move an installed wheel into two layer roots

**bytecode.** The image runs as a numeric user over a read-only venv with
PYTHONDONTWRITEBYTECODE=1, so it can never write bytecode itself: without .pyc files every
process compiles every module it imports, every time. Each ``x.py`` under ROOT gets
``__pycache__/x.<cache_tag>.pyc`` (optimization level 0 only: the image does not run with -O),
a *checked* hash-based pyc (PEP 552): it carries the source's hash, not its mtime, so the layer
clamp and SOURCE_DATE_EPOCH cannot make it stale, and a derived image that patches a source file
(``FROM`` this image, ``sed`` a vLLM module) still runs the patched source instead of stale
bytecode; the price is reading and hashing the source at import. The path compiled in is the one
the file has in the image (ROOT stripped). Only ROOT's own files are compiled, so nothing leaks
between layers. Determinism is checked, not assumed: a fresh interpreter (this script again,
``verify``) compiles every file a second time in reverse order and any .pyc whose bytes differ
is deleted and named in the log (that module then compiles at import, as before). Files that do
not compile at all (Python 2 test data, templates named .py) get none and are counted.
PYTHONHASHSEED is fixed by the caller: frozenset constants are marshalled in hash order.

**split.** A wheel installed into STAGE (``pip install --root STAGE``) goes to two roots: NATIVE
gets every ELF file (by its first four bytes, not its suffix: extensions, shared libraries,
executables) and symlinks to them; PY gets everything else, dist-info included. The dist-info
RECORD lists every file with its sha256, so a native change would move PY's RECORD: the RECORD
in PY keeps each ELF file's path with its hash and size left empty (PEP 376 allows it, as for
.pyc files; importlib.metadata and pip uninstall need only the path), and those lines, hashes
intact, go to ``<dist-info>/RECORD.native`` in NATIVE. Every RECORD line is in exactly one of
the two files.
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import subprocess
import sys
import warnings

ELF_MAGIC = b"\x7fELF"
NATIVE_RECORD = "RECORD.native"  # contract.NATIVE_RECORD_NAME
MARKER = "K3-BYTECODE"  # the log line that says what was compiled and what was left out


def sources(root):
    """Every regular .py file under root, sorted (symlinks are compiled where they point)."""
    found = []
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found += [
            os.path.join(top, f)
            for f in sorted(files)
            if f.endswith(".py") and not os.path.islink(os.path.join(top, f))
        ]
    return found


def pyc_bytes(path, root):
    """The checked hash-based pyc of one source, as importlib writes it (PEP 552 layout)."""
    with open(path, "rb") as fh:
        data = fh.read()
    code = compile(data, "/" + os.path.relpath(path, root), "exec", dont_inherit=True, optimize=0)
    flags = 0b11  # hash-based, check_source
    return (
        importlib.util.MAGIC_NUMBER
        + flags.to_bytes(4, "little")
        + importlib.util.source_hash(data)
        + marshal.dumps(code)
    )


def bytecode(root):
    warnings.simplefilter("ignore")  # 3.12 warns on every invalid escape in third-party sources
    done, broken = 0, []
    for path in sources(root):
        try:
            data = pyc_bytes(path, root)
        except (SyntaxError, ValueError, RecursionError):
            broken.append(os.path.relpath(path, root))
            continue
        target = importlib.util.cache_from_source(path, optimization="")
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        with open(target, "wb") as fh:
            fh.write(data)
        os.chmod(target, 0o644)
        done += 1
    proc = subprocess.run([sys.executable, __file__, "verify", root], capture_output=True, text=True, check=True)
    unstable = proc.stdout.split()
    print(
        f"{MARKER} {root}: {done - len(unstable)} compiled, {len(broken)} not compilable"
        f"{' (' + ', '.join(broken[:5]) + (' ...' if len(broken) > 5 else '') + ')' if broken else ''}, "
        f"{len(unstable)} not deterministic{' (' + ', '.join(unstable) + ')' if unstable else ''}"
    )


def verify(root):
    """In a fresh interpreter, in reverse order: delete and print every pyc that comes out different."""
    warnings.simplefilter("ignore")
    for path in reversed(sources(root)):
        target = importlib.util.cache_from_source(path, optimization="")
        if not os.path.exists(target):
            continue
        try:
            fresh = pyc_bytes(path, root)
        except (SyntaxError, ValueError, RecursionError):
            fresh = None  # a pyc the package shipped for a source that does not compile: not ours
        with open(target, "rb") as fh:
            if fresh is not None and fh.read() != fresh:
                os.unlink(target)
                print(os.path.relpath(path, root))


def is_elf(path):
    if not os.path.isfile(path):  # follows symlinks: a link to a library goes with the library
        return False
    with open(path, "rb") as fh:
        return fh.read(4) == ELF_MAGIC


def split(stage, native, py):
    moved = {}
    for top, dirs, files in os.walk(stage):
        dirs.sort()
        for name in sorted(files):
            src = os.path.join(top, name)
            rel = os.path.relpath(src, stage)
            moved[rel] = native if is_elf(src) else py
        for name in dirs:  # empty directories the wheel installs stay (in PY); links move as files
            rel = os.path.relpath(os.path.join(top, name), stage)
            if os.path.islink(os.path.join(top, name)):
                moved[rel] = py
            else:
                os.makedirs(os.path.join(py, rel), exist_ok=True)
    for rel, dest in moved.items():
        os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
        os.rename(os.path.join(stage, rel), os.path.join(dest, rel))
    for rel in [r for r in moved if r.endswith(".dist-info/RECORD")]:
        split_record(rel, {r for r, d in moved.items() if d == native}, native, py)
    print(
        f"K3-APP-SPLIT native {sum(d == native for d in moved.values())} files, "
        f"python {sum(d == py for d in moved.values())} files"
    )


def split_record(rel, native_files, native, py):
    """RECORD in PY without the ELF files' hashes; those lines, whole, in NATIVE's RECORD.native."""
    site = os.path.dirname(os.path.dirname(rel))
    with open(os.path.join(py, rel), newline="") as fh:
        lines = fh.read().splitlines()
    keep, elf = [], []
    for line in lines:
        path = line.rsplit(",", 2)[0]
        if os.path.normpath(os.path.join(site, path.strip('"'))) in native_files:
            elf.append(line)
            keep.append(path + ",,")
        else:
            keep.append(line)
    with open(os.path.join(py, rel), "w", newline="") as fh:
        fh.write("".join(ln + "\n" for ln in keep))
    if elf:
        os.makedirs(os.path.join(native, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(native, os.path.dirname(rel), NATIVE_RECORD), "w", newline="") as fh:
            fh.write("".join(ln + "\n" for ln in elf))


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"bytecode": bytecode, "verify": verify, "split": split}[command](*args)

"""Point a relocated python-build-standalone CPython's build-time configuration at where it lives.

Runs inside the build stage with the relocated interpreter: ``python relocate.py PREFIX``.
python-build-standalone's ``install_only`` tarball keeps the values of the machine that built it
in ``_sysconfigdata_*.py`` and ``config-3.X-*/Makefile``: the prefix ``/install`` (so INCLUDEPY
names a directory that does not exist) and ``clang`` as the compiler. Anything compiling against
sysconfig (vLLM's tools/build_deepgemm_C.py uses ``-I$INCLUDEPY``) then fails. This rewrites
every path under the old prefix to PREFIX and the compiler commands to ``cc``/``c++``, and fails
loudly if INCLUDEPY still has no Python.h afterwards. (uv rewrites the same values for the
Pythons it installs itself; this does it for a tarball pinned by sha256 in the matrix.)
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

# Compiler variables and the command their first word becomes. Clang-only flags go too: gcc
# rejects them.
COMPILERS = {
    "CC": "cc",
    "CXX": "c++",
    "LDSHARED": "cc",
    "LDCXXSHARED": "c++",
    "BLDSHARED": "cc",
    "LINKCC": "cc",
    "MAINCC": "cc",
    "CPP": "cc",
    "AR": "ar",
}
CLANG_ONLY = re.compile(r"^-fdebug-default-version=\d+$")


def _old_prefix(values: dict) -> str:
    prefix = values.get("prefix")
    if not isinstance(prefix, str) or not prefix.startswith("/"):
        raise SystemExit("relocate: sysconfig data has no absolute 'prefix'")
    return prefix


def rewrite_value(key: str, value: str, old: str, new: str) -> str:
    # The old prefix as a whole path component, bare or after a flag: /install, -I/install/include.
    value = re.sub(
        r"(?:^|(?<=[\s=:;,'\"])|(?<=-I)|(?<=-L)|(?<=-R))" + re.escape(old) + r"(?=/|$|[\s:;,'\"])", new, value
    )
    words = [w for w in value.split(" ") if not CLANG_ONLY.match(w)]
    if key in COMPILERS and words and ("clang" in os.path.basename(words[0]) or words[0].startswith("/tools/")):
        words[0] = COMPILERS[key]
    return " ".join(words)


def rewrite_sysconfigdata(path: Path, new: str) -> str:
    tree = ast.parse(path.read_text())
    assign = next(node for node in tree.body if isinstance(node, ast.Assign))
    values = ast.literal_eval(assign.value)
    old = _old_prefix(values)
    fixed = {k: rewrite_value(k, v, old, new) if isinstance(v, str) else v for k, v in values.items()}
    path.write_text(
        f"# build-time configuration, relocated to {new} by relocate.py\n"
        f"build_time_vars = {dict(sorted(fixed.items()))!r}\n"
    )
    return old


def rewrite_makefile(path: Path, old: str, new: str) -> None:
    out = []
    for line in path.read_text().splitlines(keepends=True):
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)(\s*=\s*)(.*?)(\r?\n)?$", line)
        if m:
            line = m.group(1) + m.group(2) + rewrite_value(m.group(1), m.group(3), old, new) + (m.group(4) or "")
        out.append(line)
    path.write_text("".join(out))


def main(prefix: str) -> int:
    root = Path(prefix).resolve()
    libdirs = sorted(p for p in (root / "lib").glob("python3.*") if p.is_dir())
    if len(libdirs) != 1:
        raise SystemExit(f"relocate: expected one lib/python3.X in {root}, found {len(libdirs)}")
    datas = sorted(libdirs[0].glob("_sysconfigdata_*.py"))
    if not datas:
        raise SystemExit(f"relocate: no _sysconfigdata_*.py in {libdirs[0]}")
    for data in datas:
        old = rewrite_sysconfigdata(data, str(root))
    for makefile in libdirs[0].glob("config-*/Makefile"):
        rewrite_makefile(makefile, old, str(root))
    for pc in (root / "lib" / "pkgconfig").glob("*.pc"):
        rewrite_makefile(pc, old, str(root))
    # Check with a fresh interpreter: this one imported the old values already.
    include = subprocess.run(
        [sys.executable, "-c", "import sysconfig; print(sysconfig.get_config_var('INCLUDEPY'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not (Path(include) / "Python.h").is_file():
        raise SystemExit(f"relocate: INCLUDEPY={include} has no Python.h after relocation")
    print(f"relocate: {old} -> {root}; INCLUDEPY={include}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

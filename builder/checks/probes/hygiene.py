"""Probe: does anything under the application prefix point at a path only the build had?

Every symlink must resolve to something that exists in the image, and outside the build-only
roots; no installed file that tools read paths from (.pth files, dist-info RECORD and
direct_url.json, shebangs of executables, *.cmake, *.pc) may name a build-only root as an
absolute path (/third_party, /src, /build, /ctx, /layers: where the build stages kept sources,
wheels and layer roots). Every ELF file's DT_RPATH and DT_RUNPATH entries are read too (_dyn.py):
an absolute entry under a build-only root, or one that does not exist in the image, or a relative
one (resolved against whatever the current directory is) is reported with the others; $ORIGIN
entries resolve beside the file and pass (ld.so skips a missing one; wheels carry several layouts).
Request: {"roots": [...], "build_roots": [...]}.
"""

import os
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time _report.py and _dyn.py are prepended: report(), elf_files() are defined
    from builder.checks.probes._dyn import elf_files
    from builder.checks.probes._report import report

NAMED_FILES = ("RECORD", "direct_url.json")
SUFFIXES = (".pth", ".cmake", ".pc")
LIMIT = 50  # findings reported per kind; the count says how many there were


def pattern(build_roots):
    # An absolute path starts a line or follows a separator a tool would put before one (space,
    # quote, '=', ':', ';', '(', ',', a shebang's '!', a file:// URL), so vllm/third_party/... or
    # ${ROOT}/src/... do not count.
    roots = "|".join(re.escape(r.strip("/")) for r in build_roots)
    return re.compile(rf"(?:^|[\s\"'=:;(,!]|file://)(/(?:{roots}))(?=/|$|[\s\"'),;])", re.M)


def under(path, build_roots):
    # a root given as "/build/" is "/build" too: the root itself, not only what is below it
    return any(path == r.rstrip("/") or path.startswith(r.rstrip("/") + "/") for r in build_roots)


def scanned(path, name):
    if name in NAMED_FILES or name.endswith(SUFFIXES):
        return True
    return os.path.basename(os.path.dirname(path)) == "bin" and os.access(path, os.X_OK)


def text_of(path, name):
    with open(path, "rb") as fh:
        if name in NAMED_FILES or name.endswith(SUFFIXES):
            data = fh.read(4 << 20)
        else:  # an executable: only its shebang line is a path a tool follows
            data = fh.read(512)
            if not data.startswith(b"#!"):
                return None
            data = data.split(b"\n", 1)[0]
    return data.decode("utf-8", "replace")


def search_paths(roots, build_roots):
    """[path, entry, what is wrong] for each bad DT_RPATH/DT_RUNPATH entry of an ELF file under roots."""
    found = []
    for path, dyn in elf_files(roots):
        for tag in ("rpath", "runpath"):
            for entry in [e for e in dyn[tag].split(":") if e]:
                what = f"DT_{tag.upper()} {entry}"
                if entry.startswith(("$ORIGIN", "${ORIGIN}")) or "$" in entry:
                    # beside the file: ld.so skips a directory that is not there, and wheels carry
                    # entries for every layout they may be installed in (torch's for cu12 and cu13)
                    continue
                if not entry.startswith("/"):
                    found.append([path, entry, f"{what} is relative: resolved against the current directory"])
                elif under(os.path.normpath(entry), build_roots):
                    found.append([path, entry, f"{what} is under a build-only root"])
                elif not os.path.isdir(entry):
                    found.append([path, entry, f"{what} does not exist in the image"])
    return found


def main(req):
    rx, roots = pattern(req["build_roots"]), req["build_roots"]
    out: dict[str, Any] = {"links": 0, "files": 0, "dangling": [], "outside": [], "named": [], "counts": {}}
    for root in req["roots"]:
        for top, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(dirs + files):
                path = os.path.join(top, name)
                if os.path.islink(path):
                    out["links"] += 1
                    target = os.readlink(path)
                    real = os.path.realpath(path)
                    if not os.path.exists(path):
                        out["dangling"].append([path, target])
                    elif under(real, roots):
                        out["outside"].append([path, target])
                    continue
                if name in files and os.path.isfile(path) and scanned(path, name):
                    out["files"] += 1
                    try:
                        text = text_of(path, name)
                    except OSError:
                        continue
                    m = rx.search(text) if text else None
                    if m:
                        start = text.rfind("\n", 0, m.start(1)) + 1
                        end = text.find("\n", m.end(1))
                        out["named"].append([path, m.group(1), text[start : end if end >= 0 else None][:200]])
    out["named"] += search_paths(req["roots"], roots)
    for kind in ("dangling", "outside", "named"):
        out["counts"][kind] = len(out[kind])
        out[kind] = out[kind][:LIMIT]
    return out


if __name__ == "__main__":
    report(main)

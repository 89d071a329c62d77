"""Start-up hooks (issue 51): code the image's interpreter runs before the program, read from the
image's files on the host (imagefiles.py), never by the image's interpreter.

What CPython runs at start-up (Lib/site.py): in each site directory (site-packages, and Debian's
dist-packages), every ``.pth`` file's lines that start with ``import`` followed by a space or a tab
are executed (``addpackage``: lines starting with ``#`` and blank lines skipped, other lines are
directories appended to sys.path); then ``import sitecustomize`` and, when the user site is
enabled, ``import usercustomize``, found anywhere on sys.path: the standard library directory
included (Debian's python3.x ships /usr/lib/python3.x/sitecustomize.py, a link to
/etc/python3.x/sitecustomize.py, its apport hook).

A hook is reported always. It passes only when an OS package of the image installed it and its
bytes still have that package's recorded md5 (dpkg's md5sums, or the conffile md5 in
/var/lib/dpkg/status), or when ``runtime.waivers.startup_hooks`` names its path. The md5 is the
image's own record (rewritable with the hook) and the hook's __pycache__ bytecode, which Python may
run instead of the source, is not judged: the pass is evidence against an edit of the hook alone.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from dataclasses import dataclass

from builder.checks import imagefiles

SITE_DIRS = ("site-packages", "dist-packages")
_STDLIB = re.compile(r"/lib/python3\.[0-9]+$")
_HOOK_NAME = re.compile(r"(site|user)customize(\.py|\.pyc|(\.[A-Za-z0-9_-]+)?\.so|/__init__\.py)$")


@dataclass(frozen=True)
class Hook:
    path: str
    what: str  # "a .pth line", "sitecustomize", "usercustomize"
    code: str  # the first executable line, or "" for a module


def executable_lines(text: bytes) -> list[str]:
    """The lines of a .pth file site.py executes: those starting with 'import ' or 'import\\t'."""
    lines = text.decode("utf-8-sig", "replace").splitlines()
    return [ln for ln in lines if ln.startswith(("import ", "import\t"))]


def _in_site_dir(path: str) -> bool:
    return posixpath.basename(posixpath.dirname(path)) in SITE_DIRS


def _search_dirs(files: imagefiles.ImageFiles, pythonpath: str) -> list[str]:
    """Directories sitecustomize/usercustomize can be imported from: every site directory, every
    standard library directory (lib/python3.N) and its lib-dynload, and the config's PYTHONPATH."""
    dirs = {e.path for e in files.entries.values() if e.kind == "dir" and posixpath.basename(e.path) in SITE_DIRS}
    dirs |= {e.path for e in files.entries.values() if e.kind == "dir" and _STDLIB.search(e.path)}
    dirs |= {d + "/lib-dynload" for d in list(dirs) if _STDLIB.search(d)}
    dirs |= {posixpath.normpath(d) for d in pythonpath.split(":") if d.startswith("/")}
    return sorted(dirs)


def hooks(files: imagefiles.ImageFiles, pythonpath: str = "") -> list[Hook]:
    """Every start-up hook in the image's files."""
    found = []
    for path, text in sorted(files.texts.items()):
        if path.endswith(".pth") and _in_site_dir(path):
            lines = executable_lines(text)
            if lines:
                found.append(Hook(path, f"a .pth file with {len(lines)} executable line(s)", lines[0][:200]))
    found += _linked_pth(files)
    for directory in _search_dirs(files, pythonpath):
        top = directory.rstrip("/") + "/"
        for path in sorted(p for p in files.entries if p.startswith(top)):
            rest = path[len(top) :]
            if "/" in rest.replace("/__init__.py", "", 1) or not _HOOK_NAME.fullmatch(rest):
                continue
            if files.resolve(path) is None:
                continue  # a dangling link imports nothing
            found.append(Hook(path, rest.split(".")[0].split("/")[0], ""))
    return found


def _linked_pth(files: imagefiles.ImageFiles) -> list[Hook]:
    """Hooks in .pth files that are links: site.py opens them through the link, so the target's
    bytes are what runs; a target whose bytes the host did not keep (or a hard link) fails closed."""
    found = []
    for path, entry in sorted(files.entries.items()):
        if not (path.endswith(".pth") and _in_site_dir(path) and entry.kind in ("link", "hardlink")):
            continue
        target = files.resolve(path) if entry.kind == "link" else None
        held = files.texts.get(target.path) if target is not None else None
        lines = executable_lines(held) if held is not None else ["(its target's bytes not read here)"]
        if lines:
            found.append(Hook(path, f"a .pth file that is a {entry.kind} with executable line(s)", lines[0][:200]))
    return found


def dpkg_md5(files: imagefiles.ImageFiles) -> dict[str, str]:
    """path -> md5 the base's dpkg records for it: every info/*.md5sums line and every conffile."""
    known: dict[str, str] = {}
    for path, text in files.texts.items():
        if path.startswith("/var/lib/dpkg/info/") and path.endswith(".md5sums"):
            for line in text.decode("utf-8", "replace").splitlines():
                digest, _, name = line.partition("  ")
                if len(digest) == 32 and name:
                    known["/" + name.lstrip("/")] = digest
    status = files.texts.get("/var/lib/dpkg/status", b"").decode("utf-8", "replace")
    for m in re.finditer(r"^ (/\S+) ([0-9a-f]{32})(?: \S+)?$", status, re.M):
        known[m.group(1)] = m.group(2)
    return known


def from_os_package(files: imagefiles.ImageFiles, hook: Hook, known: dict[str, str]) -> str | None:
    """Why ``hook`` is an OS package's own file, unchanged (None: it is not, or it changed)."""
    entry = files.resolve(hook.path)
    if entry is None or entry.kind != "file" or entry.path not in files.texts:
        return None
    want = known.get(entry.path)
    if want and hashlib.md5(files.texts[entry.path], usedforsecurity=False).hexdigest() == want:
        shown = hook.path if entry.path == hook.path else f"{hook.path} -> {entry.path}"
        return f"{shown}: an OS package's file, with dpkg's md5 (read on the host)"
    return None

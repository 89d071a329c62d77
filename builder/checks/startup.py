"""Start-up hooks (issue 51): code the image's interpreter runs before the program, read from the
image's files on the host (imagefiles.py), never by the image's interpreter.

What CPython runs at start-up (Lib/site.py): in each site directory (site-packages, and Debian's
dist-packages), every ``.pth`` file's lines that start with ``import`` followed by a space or a tab
are executed (``addpackage``: lines starting with ``#`` and blank lines skipped, other lines are
directories appended to sys.path); then ``import sitecustomize`` and, when the user site is
enabled, ``import usercustomize``, found anywhere on sys.path: the standard library directory
included (Debian's python3.x ships /usr/lib/python3.x/sitecustomize.py, a link to
/etc/python3.x/sitecustomize.py, its apport hook).

A hook is reported always. It passes only when ``runtime.waivers.startup_hooks`` names its path,
or when an OS package of the pinned runtime base installed it: its bytes have that package's
recorded md5 (dpkg's md5sums, or the conffile md5 in /var/lib/dpkg/status) AND the layer that last
wrote it (the link and the file it leads to) is one of the pinned base's layers (``layers.py``:
``PinnedBase``, the bottom layers whose diff_ids are the base's). The md5 alone proves nothing: it
is the image's own record, which a later layer can rewrite with the hook. The bytecode Python may
run instead of a hook's source (``bytecode``) is held to the same rule, file by file.
"""

from __future__ import annotations

import ast
import hashlib
import posixpath
import re
from dataclasses import dataclass

from builder.checks import imagefiles
from builder.checks.layers import Layers, PinnedBase

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


def _search_dirs(files: imagefiles.ImageFiles, pythonpath: str) -> list[tuple[str, str]]:
    """(directory as Python names it, the directory its links lead to) of every directory
    sitecustomize/usercustomize can be imported from: every site directory, every standard library
    directory (lib/python3.N) and its lib-dynload, and the config's PYTHONPATH; one that is a link
    is searched where it leads (Python opens through it). A directory reached twice is searched once,
    under its own name first."""
    named = {e.path for e in files.entries.values() if e.kind in ("dir", "link") and _searched(e.path)}
    named |= {d + "/lib-dynload" for d in list(named) if _STDLIB.search(d)}
    named |= {posixpath.normpath(d) for d in pythonpath.split(":") if d.startswith("/")}
    resolved = {seen: files.resolve(seen) for seen in named}
    found: dict[str, str] = {}  # the directory searched -> the name it is shown by
    for seen, real in sorted(resolved.items(), key=lambda d: (d[1] is None or d[1].path != d[0], d[0])):
        if real is not None and real.kind == "dir":
            found.setdefault(real.path, seen)
    return sorted(((seen, real) for real, seen in found.items()), key=lambda d: d[0])


def _searched(path: str) -> bool:
    return posixpath.basename(path) in SITE_DIRS or _STDLIB.search(path) is not None


def hooks(files: imagefiles.ImageFiles, pythonpath: str = "") -> list[Hook]:
    """Every start-up hook in the image's files, each at the path Python finds it by."""
    found = []
    sites = {real: seen for seen, real in _search_dirs(files, "") if posixpath.basename(seen) in SITE_DIRS}
    for path, text in sorted(files.texts.items()):
        seen = sites.get(posixpath.dirname(path))
        if path.endswith(".pth") and (seen or _in_site_dir(path)):
            lines = executable_lines(text)
            if lines:
                shown = f"{seen}/{posixpath.basename(path)}" if seen else path
                found.append(Hook(shown, f"a .pth file with {len(lines)} executable line(s)", lines[0][:200]))
    found += _linked_pth(files)
    for directory, real in _search_dirs(files, pythonpath):
        top = real.rstrip("/") + "/"
        for path in sorted(p for p in files.entries if p.startswith(top)):
            rest = path[len(top) :]
            if "/" in rest.replace("/__init__.py", "", 1) or not _HOOK_NAME.fullmatch(rest):
                continue
            if files.resolve(path) is None:
                continue  # a dangling link imports nothing
            found.append(Hook(f"{directory.rstrip('/')}/{rest}", rest.split(".")[0].split("/")[0], ""))
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


@dataclass(frozen=True)
class Judged:
    """One hook, or one file of its bytecode, judged: passed (shown) or a finding, and why."""

    path: str
    passed: bool
    why: str


def bytecode(files: imagefiles.ImageFiles, hook: Hook) -> list[str]:
    """The files Python may run instead of ``hook``'s source: every ``__pycache__/NAME.*.pyc`` beside
    the path it is found at (NAME: the module's, ``__init__`` for a package), the cache directory
    when it is a link, and what a pyc that is a link leads to. CPython 3.11 loads such a pyc instead
    of the source when its header names the source's mtime and size, when it is a checked hash-based
    pyc with the source's hash (the code in it is not compared), always when it is an unchecked
    hash-based pyc, and an ``.opt-N`` one under -O; a pyc of another interpreter's tag only by that
    interpreter: all kept, as the host does not know every interpreter of the image."""
    if not hook.path.endswith(".py"):
        return []
    directory, name = posixpath.split(hook.path)
    cache = directory + "/__pycache__"
    held = files.resolve(cache)
    if held is None or held.kind != "dir":
        return []
    link = files.entries.get(cache)
    found = [cache] if link is not None and link.kind == "link" else []
    top, stem = held.path + "/", name[: -len(".py")] + "."
    for path, entry in sorted(files.entries.items()):
        rest = path[len(top) :] if path.startswith(top) else ""
        if "/" in rest or not (rest.startswith(stem) and rest.endswith(".pyc")):
            continue
        found.append(path)
        target = files.resolve(path) if entry.kind == "link" else None
        if target is not None and target.path != path:
            found.append(target.path)
    return found


def judge(
    files: imagefiles.ImageFiles, layers: Layers, base: PinnedBase, hook: Hook, known: dict[str, str]
) -> list[Judged]:
    """``hook`` and each file of its bytecode, judged: the hook passes only as an OS package's file
    with dpkg's md5 that the pinned base's layers wrote; its bytecode only when they wrote it."""
    count = layers.base_count(base)
    found = [_judge_hook(files, layers, count, hook, known)]
    for path in bytecode(files, hook):
        why = _not_the_base(layers, count, [path])
        shown = f"bytecode Python may run instead of {hook.path}"
        found.append(Judged(path, not why, f"{shown}: {why}" if why else f"{path}: {shown}, the pinned base's"))
    return found


def _judge_hook(
    files: imagefiles.ImageFiles, layers: Layers, count: int | str, hook: Hook, known: dict[str, str]
) -> Judged:
    what = hook.what + (f": {hook.code}" if hook.code else "")
    package = from_os_package(files, hook, known)
    if package is None:
        return Judged(hook.path, False, what)
    entry = files.resolve(hook.path)
    why = _not_the_base(layers, count, sorted({hook.path, entry.path if entry else hook.path}))
    if why:
        return Judged(hook.path, False, f"{what}: dpkg's md5 matches (the image's own record), but {why}")
    return Judged(hook.path, True, f"{package}, written by the pinned base's layers")


def _not_the_base(layers: Layers, count: int | str, paths: list[str]) -> str:
    """Why ``paths`` are not all the pinned base's files ("" when the base's layers last wrote each)."""
    if isinstance(count, str):
        return count
    for path in paths:
        index = layers.last_writer(path)
        if index is None:
            return f"no layer of the saved image writes {path}"
        if index >= count:
            layer = layers.ordered[index]
            return (
                f"{path} is written by layer {index + 1} of {len(layers.ordered)} "
                f"({(layer.diff_id or layer.digest)[:19]}), after the pinned base's {count}"
            )
    return ""


def imported_at_start(
    files: imagefiles.ImageFiles,
    layers: Layers,
    base: PinnedBase,
    pythonpath: str = "",
    imports: set[str] | None = None,
) -> list[Judged]:
    """What the pinned base's own hooks can import before the program where no check of installed
    files looks: every file, at the path Python opens it by, that a layer above the base writes on
    the sys.path of an interpreter whose standard library directory (lib/python3.N, by the name
    Python opens it at) the base made (``_base_paths``), or under a Debian dist-packages directory
    the base made. Debian's sitecustomize (the base's, unchanged) imports ``apport_python_hook``
    from there when it exists: a later layer that adds one runs it in every process of that
    interpreter. site-packages are held to their RECORDs (installed_files); a directory a later
    layer makes under a name of its own (a standalone CPython of the build's) is no base hook's.
    The config's PYTHONPATH comes first on every interpreter's sys.path: there, an entry named as
    a module the hooks import (``imports``, from ``hook_imports``; None: any) that a later layer
    writes is one too."""
    count = layers.base_count(base)
    if isinstance(count, str):
        return []  # every OS package's hook already fails, saying why
    made, written = layers.written(0, count), layers.written(count)
    found, walked = [], set()
    for name in _base_paths(files, pythonpath, made):
        entry, real = files.entries.get(name), files.resolve(name)
        if entry is not None and entry.kind != "dir" and name in written:
            found.append(name)  # the directory (or the zip) itself put there by a later layer
        if real is None or real.kind != "dir" or real.path in walked:
            continue
        walked.add(real.path)
        top = real.path.rstrip("/") + "/"
        for path in (e.path for e in files.under(real.path) if e.kind != "dir"):
            if path in written and "/site-packages/" not in path[len(top) - 1 :]:
                found.append(f"{name.rstrip('/')}/{path[len(top) :]}")
    found += _on_pythonpath(files, pythonpath, written, imports)
    why = f"a file the base's start-up hooks can import, written by a layer after the pinned base's {count}"
    return [Judged(path, False, why) for path in dict.fromkeys(found)]


def _base_paths(files: imagefiles.ImageFiles, pythonpath: str, made: set[str]) -> list[str]:
    """The sys.path entries of the base's interpreters, by the names Python opens them at: for each
    standard library directory the base made (PREFIX/lib/python3.N), the directory, its lib-dynload,
    PREFIX/lib/python3N.zip (first on sys.path) and Debian's site directories
    (PREFIX/local/lib/python3.N/dist-packages, PREFIX/lib/python3/dist-packages,
    PREFIX/lib/python3.N/dist-packages: site.py adds each that exists, whoever made it); and every
    other dist-packages directory the base made. Checked on Debian 12's python3.11."""
    found: list[str] = []
    for seen, _real in _search_dirs(files, pythonpath):
        stdlib = _STDLIB.search(seen)
        if stdlib is not None and seen in made:
            prefix, version = seen[: stdlib.start()], stdlib.group(0).rsplit("/", 1)[1]
            found += [seen, f"{seen}/lib-dynload", f"{prefix}/lib/{version.replace('.', '')}.zip"]
            found += [f"{prefix}/local/lib/{version}/dist-packages", f"{prefix}/lib/python3/dist-packages"]
            found.append(f"{seen}/dist-packages")
        elif posixpath.basename(seen) == "dist-packages" and seen in made:
            found.append(seen)
    return list(dict.fromkeys(found))


def _on_pythonpath(
    files: imagefiles.ImageFiles, pythonpath: str, written: set[str], imports: set[str] | None
) -> list[str]:
    """The entries of the PYTHONPATH directories, by the names Python opens, whose module name (a
    file's name up to its first dot, a package's directory) is one the hooks import, written by a
    layer after the base."""
    found = []
    for name in dict.fromkeys(posixpath.normpath(d) for d in pythonpath.split(":") if d.startswith("/")):
        real = files.resolve(name)
        if real is None or real.kind != "dir":
            continue
        top = real.path.rstrip("/") + "/"
        for path in (e.path for e in files.under(real.path) if "/" not in e.path[len(top) :]):
            module = path[len(top) :].split(".")[0]
            if (imports is None or module in imports) and path in written:
                found.append(f"{name.rstrip('/')}/{path[len(top) :]}")
    return found


def hook_imports(files: imagefiles.ImageFiles, hooks: list[Hook]) -> set[str] | None:
    """The top-level modules ``hooks`` import, read from their source on the host (parsed, never
    run); None when one is not Python source this can read or imports by a name made at run time."""
    names: set[str] = set()
    for hook in hooks:
        entry = files.resolve(hook.path)
        text = files.texts.get(entry.path) if entry is not None else None
        try:
            tree = ast.parse(text or b"") if text is not None and hook.path.endswith(".py") else None
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            tree = None
        if tree is None:
            return None
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
            elif isinstance(node, ast.Name | ast.Attribute) and _name_of(node) in ("__import__", "import_module"):
                return None
    return names


def _name_of(node: ast.Name | ast.Attribute) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr

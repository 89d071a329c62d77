"""The export of an untrusted git tree into a directory, without trusting any path check.

A commit's tree is upstream input, and git stores whatever tree object it is handed: a symlink
``a`` and a tree ``a/`` side by side (duplicate entries), links that climb out of the tree, a chain
of links whose resolved path passes PATH_MAX. ``git archive | tarfile`` judged each member with
``os.path.realpath``, which, when not strict, stops resolving past PATH_MAX while the kernel keeps
following the links: CVE-2025-4517, present in Python 3.11.7 and in 3.11.2, the Pythons these
machines run; a duplicate entry then wrote through the link to anywhere on the host.

So nothing here asks the filesystem where a path leads. The tree is listed with plumbing
(``git ls-tree``), every rule is checked on that listing before anything is written (no duplicate,
no ``..``/``.``/``.git`` component, each entry's parent a directory of the tree itself, every
symlink resolved inside the tree on the listing, as the kernel would resolve it; the size and file
caps), and then every directory, file and link is created relative to an open handle of its
parent directory (``dir_fd``, ``O_NOFOLLOW``, ``O_EXCL``), a handle the export made itself. A
link is written as a link and never followed. Blobs are read with ``git cat-file --batch``: the
object's bytes, so no ``.gitattributes`` applies (no ``export-subst``, no filter driver from the
host's git config, no ``export-ignore``) and the export is a function of the commit alone. No
tarfile filter is involved, so the behaviour does not depend on the Python patch level.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from builder.errors import SourceError

if TYPE_CHECKING:
    import git

# Linux's own limits: a name longer than NAME_MAX cannot be created, and links are followed at
# most MAXSYMLINKS (40) times; a tree that needs more is refused rather than half written.
NAME_MAX = 255
MAX_SYMLINK_HOPS = 40
# A path inside a tree stays far below PATH_MAX (4096), leaving room for the build directory in
# front of it, so every later path-based walk of the export (mtimes, the engine's context) works.
MAX_PATH_BYTES = 2048

_TREE, _LINK, _GITLINK = 0o040000, 0o120000, 0o160000


@dataclass(frozen=True)
class Limits:
    """Caps on one exported tree (a third-party tree counts with its submodules): exceeding
    either is bad upstream input, refused before anything is written."""

    max_bytes: int
    max_files: int


@dataclass
class Budget:
    """What one export has spent of its Limits so far (shared by a tree and its submodules)."""

    limits: Limits
    files: int = 0
    size: int = 0

    def spend(self, files: int, size: int, where: str) -> None:
        self.files += files
        self.size += size
        if self.files > self.limits.max_files:
            raise SourceError(
                f"{where}: {self.files} files exceed the export cap of {self.limits.max_files} "
                "(source.export.max_files); refused: raise it in the matrix if the tree really is that large"
            )
        if self.size > self.limits.max_bytes:
            raise SourceError(
                f"{where}: {self.size} bytes exceed the export cap of {self.limits.max_bytes} "
                "(source.export.max_bytes); refused: raise it in the matrix if the tree really is that large"
            )


@dataclass(frozen=True)
class Entry:
    mode: int
    oid: str
    size: int
    path: bytes


@dataclass
class ExportPlan:
    """A tree's entries, checked, with each symlink's target read."""

    entries: list[Entry]
    kinds: dict[bytes, int] = field(default_factory=dict)  # path -> mode
    links: dict[bytes, bytes] = field(default_factory=dict)  # symlink path -> its target


def _shown(path: bytes) -> str:
    from builder.log import shown

    return shown(path.decode("utf-8", "replace"), 120)


def list_tree(repo: git.Repo, commit: str, where: str) -> list[Entry]:
    """Every entry of ``commit``'s tree (trees before what they hold), as git stores it."""
    import git

    try:
        out = repo.git.ls_tree(
            "-r", "-t", "-l", "-z", "--full-tree", "--end-of-options", commit, stdout_as_string=False
        )
    except git.GitCommandError as exc:
        fatal = [ln for ln in str(exc.stderr or "").splitlines() if "fatal:" in ln]
        reason = fatal[-1].split("fatal:", 1)[1].strip().rstrip("'") if fatal else f"git exited {exc.status}"
        raise SourceError(f"{where}: git ls-tree failed: {_shown(reason.encode())}") from None
    entries = []
    for record in bytes(out).split(b"\0"):
        if not record:
            continue
        meta, _, path = record.partition(b"\t")
        mode, _kind, oid, size = meta.split()
        entries.append(Entry(int(mode, 8), oid.decode(), 0 if size == b"-" else int(size), path))
    return entries


def _check_name(path: bytes, where: str) -> None:
    parts = path.split(b"/")
    if path.startswith(b"/") or len(path) > MAX_PATH_BYTES:
        raise SourceError(f"{where}: path {_shown(path)} is absolute or longer than {MAX_PATH_BYTES} bytes; refused")
    for part in parts:
        if part in (b"", b".", b"..") or part.lower() == b".git" or len(part) > NAME_MAX or b"\0" in part:
            raise SourceError(
                f"{where}: path {_shown(path)} has a component git itself would not check out "
                f"(empty, '.', '..', '.git' or over {NAME_MAX} bytes); refused: a tree is untrusted input"
            )


def plan(
    repo: git.Repo, commit: str, budget: Budget, where: str, replaced: frozenset[bytes] = frozenset()
) -> ExportPlan:
    """The checked listing of ``commit``'s tree: refused (SourceError) on a duplicate path, an
    entry whose parent is not a directory of the tree, a link leaving the tree, or a cap exceeded.
    ``replaced``: top-level files the export writes itself (a tree's own copy is left out)."""
    result = ExportPlan([])
    files = size = 0
    for entry in list_tree(repo, commit, where):
        _check_name(entry.path, where)
        if entry.path in result.kinds:
            raise SourceError(
                f"{where}: {_shown(entry.path)} appears twice in the tree (a malformed tree git fsck "
                "refuses); refused: a tree is untrusted input"
            )
        parent = posixpath.dirname(entry.path)
        if parent and result.kinds.get(parent) != _TREE:
            raise SourceError(
                f"{where}: {_shown(entry.path)} lies under {_shown(parent)}, which is not a directory of the "
                "tree (a symlink, a file or nothing); refused: a tree is untrusted input"
            )
        kind = entry.mode & 0o170000
        if entry.mode not in (_TREE, _LINK, _GITLINK) and kind != 0o100000:
            raise SourceError(f"{where}: {_shown(entry.path)} has mode {entry.mode:o}, not one git writes; refused")
        result.kinds[entry.path] = entry.mode if kind != 0o100000 else kind
        if entry.path in replaced:
            if entry.mode == _TREE:
                raise SourceError(f"{where}: {_shown(entry.path)} is a directory in the tree; refused")
            result.kinds[entry.path] = 0o100000  # the tool's own file stands there, whatever the tree had
            continue
        if entry.mode in (_LINK,) or kind == 0o100000:
            files, size = files + 1, size + entry.size
        result.entries.append(entry)
    budget.spend(files, size, where)
    for entry in result.entries:
        if entry.mode == _LINK:
            result.links[entry.path] = _link_target(repo, entry, where)
    for path in result.links:
        _resolve_inside(result, path, where)
    return result


def _is_blob(kind: str | bytes) -> bool:
    return kind in ("blob", b"blob")  # GitPython hands the type over as bytes


def _link_target(repo: git.Repo, entry: Entry, where: str) -> bytes:
    if entry.size == 0 or entry.size >= 4096:
        raise SourceError(f"{where}: symlink {_shown(entry.path)} has an empty or over-long target; refused")
    _, kind, size, stream = repo.git.stream_object_data(entry.oid)
    target = stream.read()
    if not _is_blob(kind) or size != entry.size or b"\0" in target:
        raise SourceError(f"{where}: symlink {_shown(entry.path)}: its target is not a plain path; refused")
    return target


def _resolve_inside(tree: ExportPlan, link: bytes, where: str) -> None:
    """Follow ``link`` on the listing exactly as the kernel would on disk (every link along the way,
    ``..`` after a link applied to where the link led), refusing it when it leaves the tree, is
    absolute, or needs more than MAX_SYMLINK_HOPS links. A missing component is taken as a
    directory (stricter than the kernel, which would stop there)."""
    here: list[bytes] = [p for p in posixpath.dirname(link).split(b"/") if p]
    todo = [tree.links[link]]
    hops = 1
    while todo:
        target = todo.pop()
        if target.startswith(b"/"):
            raise SourceError(f"{where}: symlink {_shown(link)} leads to an absolute path; refused")
        parts = [p for p in target.split(b"/") if p not in (b"", b".")]
        for i, part in enumerate(parts):
            if part == b"..":
                if not here:
                    raise SourceError(f"{where}: symlink {_shown(link)} points outside the tree; refused")
                here.pop()
                continue
            path = b"/".join([*here, part])
            if tree.kinds.get(path) == _LINK:
                hops += 1
                if hops > MAX_SYMLINK_HOPS:
                    raise SourceError(
                        f"{where}: symlink {_shown(link)} needs more than {MAX_SYMLINK_HOPS} links to "
                        "resolve (a loop or a chain); refused"
                    )
                rest = b"/".join(parts[i + 1 :])
                todo.append(tree.links[path] + (b"/" + rest if rest else b""))
                break
            here.append(part)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class _Handles:
    """Open handles of the directories along the current path, each opened relative to its parent
    with O_NOFOLLOW: a component that is not a directory the export made fails, never leads on."""

    def __init__(self, root_fd: int) -> None:
        self.stack: list[tuple[bytes, int]] = [(b"", root_fd)]

    def parent(self, path: bytes) -> int:
        want = posixpath.dirname(path)
        while len(self.stack) > 1 and not (want == self.stack[-1][0] or want.startswith(self.stack[-1][0] + b"/")):
            os.close(self.stack.pop()[1])
        have = self.stack[-1][0]
        rest = want[len(have) :].lstrip(b"/")
        for part in rest.split(b"/") if rest else []:
            fd = os.open(part, _DIR_FLAGS, dir_fd=self.stack[-1][1])
            self.stack.append(((have + b"/" + part).lstrip(b"/"), fd))
            have = self.stack[-1][0]
        return self.stack[-1][1]

    def close(self) -> None:
        while len(self.stack) > 1:
            os.close(self.stack.pop()[1])


def open_dir(root: Path, under: str, where: str) -> int:
    """A handle on ``root/under`` reached one component at a time without following a link;
    missing directories are made (a submodule's gitlink is one, made by its parent's export)."""
    fd = os.open(root, _DIR_FLAGS)
    for part in [p for p in under.split("/") if p]:
        try:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                os.mkdir(part, 0o755, dir_fd=fd)
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            os.close(fd)
            raise SourceError(
                f"{where}: {under!r} is not a directory of the parent tree ({exc.strerror}); refused"
            ) from None
        os.close(fd)
        fd = nxt
    return fd


class _Blobs:
    """``git cat-file --batch --buffer`` fed every blob id up front by a thread, read in the same
    order: one process and no round trip per file (a round trip each cost ~2 ms on a loaded host)."""

    def __init__(self, repo: git.Repo, oids: list[str]) -> None:
        import subprocess
        import threading

        self.proc = repo.git.cat_file("--batch", "--buffer", as_process=True, istream=subprocess.PIPE)
        self.out = self.proc.stdout
        stdin = self.proc.proc.stdin

        def feed() -> None:
            try:
                for oid in oids:
                    stdin.write(f"{oid}\n".encode())
                stdin.close()
            except (BrokenPipeError, ValueError):  # the reader stopped early (a refusal): nothing to feed
                pass

        self.feeder = threading.Thread(target=feed, daemon=True)
        self.feeder.start()

    def copy(self, oid: str, out, where: str, path: bytes) -> None:
        """The next blob (which must be ``oid``) streamed into ``out``."""
        header = self.out.readline().split()
        if len(header) != 3 or header[0].decode() != oid or header[1] != b"blob":
            raise SourceError(f"{where}: {_shown(path)} is not a readable blob in the mirror; refused")
        left = int(header[2])
        while left:
            chunk = self.out.read(min(left, 1 << 20))
            if not chunk:
                raise SourceError(f"{where}: git cat-file stopped in {_shown(path)}")
            out.write(chunk)
            left -= len(chunk)
        self.out.read(1)  # the newline after each object

    def close(self) -> None:
        self.proc.proc.kill()  # done or refused: nothing more is read either way
        self.proc.proc.wait()
        self.out.close()
        self.feeder.join(timeout=5)


def write(repo: git.Repo, tree: ExportPlan, root_fd: int, where: str) -> None:
    """Create every planned entry under ``root_fd``: directories 0755, files 0644 or 0755 (git
    records only the execute bit), links as links; each relative to its parent's handle."""
    handles = _Handles(root_fd)
    blobs = _Blobs(repo, [e.oid for e in tree.entries if e.mode & 0o170000 == 0o100000])
    try:
        for entry in tree.entries:
            parent = handles.parent(entry.path)
            name = posixpath.basename(entry.path)
            if entry.mode in (_TREE, _GITLINK):  # a gitlink is an empty directory, as git archive writes it
                os.mkdir(name, 0o755, dir_fd=parent)
                made = os.open(name, _DIR_FLAGS, dir_fd=parent)
                os.fchmod(made, 0o755)  # the umask does not decide an image's modes
                os.close(made)
            elif entry.mode == _LINK:
                os.symlink(tree.links[entry.path], name, dir_fd=parent)
            else:
                _write_blob(blobs, entry, name, parent, where)
    except FileExistsError as exc:  # the plan refuses duplicates; a second guard costs nothing
        raise SourceError(f"{where}: {_shown(entry.path)} exists already ({exc.strerror}); refused") from None
    except OSError as exc:
        from builder.errors import RESOURCE_ERRNOS

        if exc.errno in RESOURCE_ERRNOS:
            raise
        raise SourceError(f"{where}: cannot write {_shown(entry.path)}: {exc.strerror}; refused") from None
    finally:
        handles.close()
        blobs.close()


def _write_blob(blobs: _Blobs, entry: Entry, name: bytes, parent: int, where: str) -> None:
    mode = 0o755 if entry.mode & 0o111 else 0o644
    fd = os.open(name, _FILE_FLAGS, mode, dir_fd=parent)
    try:
        with os.fdopen(os.dup(fd), "wb", closefd=True) as out:
            blobs.copy(entry.oid, out, where, entry.path)
        os.fchmod(fd, mode)  # the umask does not decide an image's file modes
    finally:
        os.close(fd)


def export_tree(
    repo: git.Repo,
    commit: str,
    root: Path,
    budget: Budget,
    where: str,
    under: str = "",
    extra: dict[str, bytes] | None = None,
) -> None:
    """Write ``commit``'s tree into ``root/under`` (root exists and is the export's own), with
    ``extra`` top-level files written by the tool in place of any the tree carries."""
    replaced = frozenset(name.encode() for name in extra or {})
    tree = plan(repo, commit, budget, where, replaced)
    fd = open_dir(root, under, where)
    try:
        write(repo, tree, fd, where)
        for name, data in (extra or {}).items():
            out = os.open(name, _FILE_FLAGS, 0o644, dir_fd=fd)
            try:
                os.write(out, data)
                os.fchmod(out, 0o644)
            finally:
                os.close(out)
    finally:
        os.close(fd)


def export_trees(parts: list[tuple[git.Repo, str, str, str]], root: Path, budget: Budget) -> None:
    """Trees assembled into one under ``root`` (a third-party tree and its submodules), each part
    ``(repo, commit, under, where)``: every tree checked on its listing, then every link resolved on
    the assembled listing (a parent's link through a submodule's ``l -> .`` leaves the whole tree
    though each tree alone holds it), and only then anything written."""
    plans = [(repo, under, where, plan(repo, commit, budget, where)) for repo, commit, under, where in parts]
    assembled = ExportPlan([])
    for _, under, _, tree in plans:
        prefix = under.encode() + b"/" if under else b""
        assembled.kinds.update({prefix + path: kind for path, kind in tree.kinds.items()})
        assembled.links.update({prefix + path: target for path, target in tree.links.items()})
    for _, under, where, tree in plans:
        prefix = under.encode() + b"/" if under else b""
        for path in tree.links:
            _resolve_inside(assembled, prefix + path, where)
    for repo, under, where, tree in plans:
        fd = open_dir(root, under, where)
        try:
            write(repo, tree, fd, where)
        finally:
            os.close(fd)

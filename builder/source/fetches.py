"""The fetch inventory: every place in the source's build files that downloads something while the
build runs, and whether the matrix pins it (``source.third_party``) or waives it
(``kernels.fetch_waivers``). An unpinned fetch would fail deep into a compile under
``--network=none``, or quietly reach the network in the remote-cache stage; here it fails `build
plan`, `build track --check` and the build's preflight in seconds, with its file and line.

Read as text, never run: CMake files as commands (builder/source/cmakefile.py), Python files with
``ast`` (parsed, not executed). What counts as a fetch:

- CMake (``CMakeLists.txt``, ``cmake/**``): ``FetchContent_Declare``, ``FetchContent_Populate`` and
  ``ExternalProject_Add`` with a repository or URL (a ``SOURCE_DIR``-only declaration fetches
  nothing), ``file(DOWNLOAD ...)``, and ``execute_process`` running curl, wget or a git command that
  talks to a remote (clone, fetch, pull, submodule, ls-remote);
- Python (``setup.py``, ``tools/**.py``): ``urlopen``/``urlretrieve``, ``requests``/``httpx`` calls,
  and commands (lists or strings) that run curl, wget or such a git command.

A fetch is pinned when a ``source.third_party`` entry has the same ``declared_in`` file and names it
(its key or ``fetchcontent``, ``-``/``_`` and case ignored) or the file reads that entry's ``env``.
"""

from __future__ import annotations

import ast
import posixpath
import re
from dataclasses import dataclass

from builder.config.matrix import Target
from builder.source.cmakefile import Command, commands, printable
from builder.source.requirements import SourceTree

MAX_PY_BYTES = 2 * 1024 * 1024
_REMOTE_KEYS = {"GIT_REPOSITORY", "URL", "SVN_REPOSITORY", "HG_REPOSITORY", "CVS_REPOSITORY"}
_GIT_REMOTE = {"clone", "fetch", "pull", "submodule", "ls-remote"}
_DOWNLOADERS = {"curl", "wget"}
_EXEC_KEYWORDS = set(
    "WORKING_DIRECTORY TIMEOUT RESULT_VARIABLE RESULTS_VARIABLE OUTPUT_VARIABLE ERROR_VARIABLE INPUT_FILE "
    "OUTPUT_FILE ERROR_FILE OUTPUT_QUIET ERROR_QUIET COMMAND_ECHO OUTPUT_STRIP_TRAILING_WHITESPACE "
    "ERROR_STRIP_TRAILING_WHITESPACE ENCODING ECHO_OUTPUT_VARIABLE ECHO_ERROR_VARIABLE COMMAND_ERROR_IS_FATAL".split()
)
_PY_URL_CALLS = {"urlopen", "urlretrieve"}
_PY_HTTP_MODULES = {"requests", "httpx", "urllib3"}


@dataclass(frozen=True)
class Fetch:
    file: str
    line: int
    kind: str  # FetchContent_Declare, ExternalProject_Add, file(DOWNLOAD), execute_process, python
    name: str  # what the waiver key names: the FetchContent name, the program, the function
    detail: str = ""  # the URL or command as written (shown escaped)
    pinned_by: str | None = None  # the source.third_party entry
    waived: str | None = None  # the waiver's reason

    @property
    def key(self) -> str:
        return f"{self.file}:{self.name}"

    @property
    def status(self) -> str:
        return "pinned" if self.pinned_by else "waived" if self.waived else "UNPINNED"

    def describe(self) -> str:
        how = (
            f"-> source.third_party.{self.pinned_by}"
            if self.pinned_by
            else f"waived: {self.waived}"
            if self.waived
            else f"not in source.third_party and no kernels.fetch_waivers entry {printable(self.key)!r}"
        )
        detail = f" {printable(self.detail, 100)}" if self.detail else ""
        return f"{self.file}:{self.line}: {self.kind} {printable(self.name, 60)}{detail} {how}"

    def to_json(self) -> dict:
        return {
            "file": self.file,
            "line": self.line,
            "kind": self.kind,
            "name": self.name,
            "detail": self.detail[:200],
            "status": self.status,
            "pinned_by": self.pinned_by,
            "waived": self.waived,
        }


def build_files(tree: SourceTree, listing: list[str]) -> tuple[list[str], list[str]]:
    """The CMake files and the Python files of the tree that the inventory reads, sorted."""
    cmake = [p for p in listing if p == "CMakeLists.txt" or (p.startswith("cmake/") and p.endswith(".cmake"))]
    python = [p for p in listing if p == "setup.py" or (p.startswith("tools/") and p.endswith(".py"))]
    return sorted(cmake), sorted(python)


def _kw_value(c: Command, keys: set[str]) -> str | None:
    words = c.words()
    for i, w in enumerate(words[:-1]):
        if w in keys:
            return words[i + 1]
    return None


def _program(word: str) -> str:
    """``git`` for git, ``${GIT_EXECUTABLE}``, /usr/bin/git ...: the program a command word runs."""
    m = re.fullmatch(r"\$\{([A-Za-z0-9_]+?)(?:_EXECUTABLE|_COMMAND|_BIN)?\}", word)
    return (m.group(1) if m else posixpath.basename(word)).lower()


def _runs_fetch(argv: list[str]) -> str | None:
    """The fetching program an argv runs (curl, wget, git-<remote subcommand>), if any."""
    if not argv:
        return None
    prog = _program(argv[0])
    if prog in _DOWNLOADERS:
        return prog
    if prog == "git":
        sub = next((a for a in argv[1:] if not a.startswith("-")), "")
        return f"git-{sub}" if sub in _GIT_REMOTE else None
    return None


def _cmake_fetches(path: str, data: bytes) -> list[Fetch]:
    found = []
    for c in commands(data, path):
        words = c.words()
        if c.name in ("fetchcontent_declare", "fetchcontent_populate", "externalproject_add") and words:
            remote = _kw_value(c, _REMOTE_KEYS)
            if remote is not None:
                kind = {
                    "fetchcontent_declare": "FetchContent_Declare",
                    "fetchcontent_populate": "FetchContent_Populate",
                }
                found.append(Fetch(path, c.line, kind.get(c.name, "ExternalProject_Add"), words[0], remote))
        elif c.name == "file" and words[:1] == ["DOWNLOAD"]:
            found.append(Fetch(path, c.line, "file(DOWNLOAD)", "DOWNLOAD", words[1] if len(words) > 1 else ""))
        elif c.name == "execute_process":
            for argv in _cmake_argvs(words):
                prog = _runs_fetch(argv)
                if prog:
                    found.append(Fetch(path, c.line, "execute_process", prog, " ".join(argv)))
    return found


def _cmake_argvs(words: list[str]) -> list[list[str]]:
    """The COMMAND argument lists of an execute_process call (``-E env VAR=x prog ...`` unwrapped)."""
    argvs: list[list[str]] = []
    for w in words:
        if w == "COMMAND":
            argvs.append([])
        elif w in _EXEC_KEYWORDS:
            argvs.append([])  # an execute_process keyword ends the command
        elif argvs:
            argvs[-1].append(w)
    out = []
    for argv in argvs:
        if argv[1:3] == ["-E", "env"]:
            argv = [a for a in argv[3:] if "=" not in a or a.startswith("-")]
        out.append(argv)
    return out


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _argv_of(node: ast.AST) -> list[str] | None:
    """A command's words when a call passes it as a literal list or string."""
    if isinstance(node, (ast.List, ast.Tuple)):
        words = [e.value if isinstance(e, ast.Constant) and isinstance(e.value, str) else "?" for e in node.elts]
        return words or None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.split()
    return None


def _py_call(node: ast.Call) -> tuple[str, str] | None:
    """(name, detail) when the call fetches: a URL call, an HTTP library, or a fetching command."""
    func = _dotted(node.func)
    last = func.rsplit(".", 1)[-1]
    if last in _PY_URL_CALLS:
        return last, ast.unparse(node.args[0])[:200] if node.args else ""
    head = func.split(".", 1)[0]
    if head in _PY_HTTP_MODULES and "." in func and last in ("get", "post", "head", "request", "stream", "urlopen"):
        return func, ast.unparse(node.args[0])[:200] if node.args else ""
    for arg in node.args[:1]:
        if isinstance(arg, ast.Constant):  # a command line as one string (os.system, shell=True)
            argv = _argv_of(arg)
            prog = _runs_fetch(argv) if argv else None
            if prog:
                return prog, " ".join(argv or [])[:200]
    return None


def _python_fetches(path: str, data: bytes) -> list[Fetch]:
    if len(data) > MAX_PY_BYTES:
        return [Fetch(path, 1, "python", "unreadable", f"{len(data)} bytes, over {MAX_PY_BYTES}")]
    try:
        tree = ast.parse(data, filename=path)
    except (SyntaxError, ValueError) as exc:
        # Unread is not "fetches nothing": it needs a waiver like any fetch.
        return [Fetch(path, getattr(exc, "lineno", None) or 1, "python", "unreadable", "not parseable as Python")]
    found = []
    for node in ast.walk(tree):
        hit = None
        if isinstance(node, ast.Call):
            hit = _py_call(node)
        elif isinstance(node, (ast.List, ast.Tuple)):  # an argv, run here or kept in a variable first
            argv = _argv_of(node)
            prog = _runs_fetch(argv) if argv else None
            hit = (prog, " ".join(argv or [])[:200]) if prog else None
        if hit:
            found.append(Fetch(path, getattr(node, "lineno", 1), "python", hit[0], hit[1]))
    return sorted(found, key=lambda f: f.line)


def _norm(name: str) -> str:
    return name.lower().replace("_", "-")


def _resolve(f: Fetch, target: Target, text: str) -> Fetch:
    from dataclasses import replace

    if f.kind.startswith(("FetchContent", "ExternalProject")):
        for tp_name, tp in sorted(target.source.third_party.items()):
            if tp.declared_in != f.file:
                continue
            names = {_norm(tp_name), _norm(tp.fetchcontent or "")}
            if _norm(f.name) in names or (tp.env and re.search(rf"\b{re.escape(tp.env)}\b", text)):
                return replace(f, pinned_by=tp_name)
    reason = target.kernels.fetch_waivers.get(f.key)
    return replace(f, waived=reason) if reason else f


def inventory(tree: SourceTree, listing: list[str], target: Target) -> list[Fetch]:
    """Every fetch in the tree's build files, each resolved to its pin, its waiver, or neither."""
    cmake, python = build_files(tree, listing)
    out: list[Fetch] = []
    for path in cmake + python:
        data = tree.read(path)
        if data is None:
            continue
        found = _cmake_fetches(path, data) if path in cmake else _python_fetches(path, data)
        text = data.decode("utf-8", "replace")
        out += [_resolve(f, target, text) for f in found]
    return out


def stale_waivers(fetches: list[Fetch], target: Target) -> list[str]:
    """Waivers that match no fetch: the upstream change that made them moot should drop them too."""
    keys = {f.key for f in fetches}
    return sorted(k for k in target.kernels.fetch_waivers if k not in keys)


def listing(tree: SourceTree) -> list[str]:
    """The paths the inventory and the plan read from: every file of an sdist, or the build files of
    a git tree (``CMakeLists.txt``, ``setup.py``, ``cmake/**``, ``tools/**``)."""
    files = getattr(tree, "files", None)
    if isinstance(files, dict):
        return sorted(files)
    out = [p for p in ("CMakeLists.txt", "setup.py") if tree.read(p) is not None]
    for directory in ("cmake", "tools"):
        out += sorted(tree.files_under(directory))  # type: ignore[attr-defined]
    return out


def check(tree: SourceTree, target: Target) -> list[Fetch]:
    """The build's preflight: refuse (exit 2, before any third-party fetch or engine work) a source
    whose build files fetch something neither pinned nor waived."""
    from builder.errors import SourceError

    fetches = inventory(tree, listing(tree), target)
    unpinned = [f for f in fetches if f.status == "UNPINNED"]
    if unpinned:
        more = f" (and {len(unpinned) - 1} more: `build plan` lists them)" if len(unpinned) > 1 else ""
        raise SourceError(
            f"source: unpinned fetch in the build files: {unpinned[0].describe()}{more}; pin it in "
            f"targets.{target.name}.source.third_party or waive it in kernels.fetch_waivers"
        )
    return fetches

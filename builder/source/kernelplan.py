"""The kernel plan: for each arch selection in the source's build files, the archs it yields under
the target's CUDA version and arch list, computed by upstream's own CMake functions.

Nothing here re-implements upstream's selection. The build files are read as commands
(builder/source/cmakefile.py); a script is made of the commands that select archs, in order, with
the ``if``/``elseif``/``else`` around them: calls of the ``cmake/utils.cmake`` functions whose first
argument is an ``*ARCHS*`` variable (``cuda_archs_loose_intersection``, ``cuda_archs_sm90plus``,
``extract_unique_cuda_archs_ascending``), and ``set``/``list``/``unset`` of such variables (vLLM
builds ``FLASH_KDA_SUPPORT_ARCHS`` so). ``include()`` of another file of the tree is followed in
place. CMake runs that script in script mode (``cmake -P``), with ``cmake/utils.cmake`` included as
it is, and reports each selection's value where the build would compute it.

The tree is untrusted, so CMake never runs it on the build host (issue 49): the script runs in the
engine's sandbox container (builder/engine/sandbox.py: the tool's own cmake, no network, a
read-only root, no capability, no host file; the script, ``cmake/utils.cmake`` inlined, on stdin),
handed in as a ``Sandbox``. And as a second line, before anything runs: ``utils.cmake`` must hold
nothing but function and macro definitions at top level, and every function the script calls (and
each it calls, at any depth) may use only the commands in ``_SAFE`` (no ``execute_process``,
``file``, ``include``...). Commands inside ``foreach``/``while``/``function`` blocks of the build
files are not replayed; a selection there is reported as not computed.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Protocol

from builder.errors import ConfigError, SourceError
from builder.source.cmakefile import Command, commands, printable
from builder.source.requirements import SourceTree

UTILS = "cmake/utils.cmake"
ROOT_FILE = "CMakeLists.txt"
CMAKE_MIN = (3, 26)  # vLLM's cmake_minimum_required; IN_LIST and the policies utils.cmake relies on
TIMEOUT_SECONDS = 120  # the container's start included
MAX_OUTPUT = 1024 * 1024
_ARCH_VAR = re.compile(r"[A-Za-z0-9_]*ARCHS[A-Za-z0-9_]*")
_SAFE = frozenset(
    "set unset list string foreach endforeach if elseif else endif while endwhile break continue return "
    "message math cmake_parse_arguments function endfunction macro endmacro".split()
)
_BLOCKS = {"foreach": "endforeach", "while": "endwhile", "function": "endfunction", "macro": "endmacro"}
_MARK = "K3PLAN"
_CUDA_GATE = re.compile(r"CUDA_COMPILER_VERSION|CUDA_VERSION")


class SandboxRun(Protocol):
    @property
    def rc(self) -> int | None: ...  # None: killed at its timeout

    @property
    def stdout(self) -> str: ...

    @property
    def stderr(self) -> str: ...


class Sandbox(Protocol):
    """Where the script runs: ``cmake -P`` of ``script`` (from stdin), never on the build host."""

    def run(self, script: bytes, timeout: float) -> SandboxRun: ...


@dataclass(frozen=True)
class Gate:
    """One ``if`` branch a selection sits in: its condition as written, and whether the selection is
    in the condition's own branch (``taken``) or in a later ``elseif``/``else`` of it."""

    condition: str
    line: int
    file: str
    negated: bool

    def describe(self) -> str:
        cond = printable(" ".join(self.condition.split()), 120)
        return f"{'NOT ' if self.negated else ''}({cond}) at {self.file}:{self.line}"

    @property
    def cuda(self) -> bool:
        """A CUDA-version gate (``CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 13.0``)."""
        return bool(_CUDA_GATE.search(self.condition))


@dataclass(frozen=True)
class Selection:
    """One call that selects archs: its variable, where it is, the list it starts from, its gates."""

    var: str
    file: str
    line: int
    ordinal: int  # the n-th selection of ``var`` in ``file`` (1-based): a name that survives line moves
    function: str
    wanted: str  # the arch list upstream wrote (the call's second argument), as written
    gates: tuple[Gate, ...]
    extension: str | None  # the define_extension_target that follows it in the file (by position)

    @property
    def key(self) -> str:
        return f"{self.file}:{self.var}#{self.ordinal}"


@dataclass
class Result:
    selection: Selection
    archs: tuple[str, ...] | None  # None: not reached (a gate is false) or not computed
    reached: bool
    note: str = ""


@dataclass
class Replay:
    script: list[str] = field(default_factory=list)
    selections: list[Selection] = field(default_factory=list)
    skipped: list[tuple[str, int, str]] = field(default_factory=list)  # (file, line, why)
    called: set[str] = field(default_factory=set)
    files: list[str] = field(default_factory=list)


def _functions(utils: list[Command]) -> dict[str, list[Command]]:
    """Function and macro bodies of utils.cmake by lower-case name; any other top-level command refuses."""
    defs: dict[str, list[Command]] = {}
    current: list[Command] | None = None
    for c in utils:
        if current is None:
            if c.name not in ("function", "macro") or not c.args:
                raise SourceError(
                    f"source: {UTILS}:{c.line}: top-level command {printable(c.name, 40)}(): the kernel plan "
                    "includes this file only while it defines functions and nothing else"
                )
            current = defs.setdefault(c.args[0].text.lower(), [])
        elif c.name in ("endfunction", "endmacro"):
            current = None
        else:
            current.append(c)
    return defs


def _check_safe(defs: dict[str, list[Command]], called: set[str]) -> None:
    """Every command the called functions run (transitively) is in _SAFE or another defined function."""
    todo, seen = list(called), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for c in defs.get(name, []):
            if c.name in defs:
                todo.append(c.name)
            elif c.name not in _SAFE:
                raise SourceError(
                    f"source: {UTILS}:{c.line}: {printable(name, 60)}() runs {printable(c.name, 40)}(), which the "
                    "kernel plan does not run from an untrusted tree; the plan cannot be computed"
                )


def _include_target(c: Command, tree: SourceTree, current: str) -> str | None:
    """The tree file an ``include(...)`` names, when it is one (relative, or under the list dir)."""
    if not c.args:
        return None
    raw = c.args[0].text
    for prefix in ("${CMAKE_CURRENT_LIST_DIR}/", "${CMAKE_SOURCE_DIR}/", "${CMAKE_CURRENT_SOURCE_DIR}/"):
        raw = raw.removeprefix(prefix)
    if "$" in raw or raw.startswith("/") or not raw.endswith(".cmake"):
        return None
    path = str(PurePosixPath(raw))
    if ".." in PurePosixPath(path).parts or path == UTILS:
        return None
    return path if tree.read(path) is not None else None


def _extensions(cmds: list[Command]) -> list[tuple[int, str]]:
    return [(c.line, c.args[0].text) for c in cmds if c.name == "define_extension_target" and c.args]


def _branch_gates(frame: list[tuple[str, int]], file: str) -> list[Gate]:
    """The gates of the current branch of one ``if`` frame: earlier conditions negated, its own as is
    (an ``else`` branch has the marker condition "")."""
    *before, (cond, line) = frame
    gates = [Gate(c, ln, file, True) for c, ln in before]
    if cond:
        gates.append(Gate(cond, line, file, False))
    return gates


def _walk(path: str, tree: SourceTree, funcs: dict, out: Replay, outer: list[Gate], depth: int = 0) -> None:
    data = tree.read(path)
    if data is None or depth > 8 or path in out.files:
        return
    out.files.append(path)
    cmds = commands(data, path)
    exts = _extensions(cmds)
    frames: list[list[tuple[str, int]]] = []
    skip: list[str] = []  # the end commands of the blocks being skipped
    ordinals: dict[str, int] = {}
    for c in cmds:
        if skip:
            if c.name in _BLOCKS:
                skip.append(_BLOCKS[c.name])
            elif c.name == skip[-1]:
                skip.pop()
            elif c.name in funcs and c.args and _ARCH_VAR.fullmatch(c.args[0].text):
                out.skipped.append((path, c.line, f"{c.args[0].text}: inside a foreach/while/function block"))
            continue
        if c.name in _BLOCKS:
            skip.append(_BLOCKS[c.name])
            continue
        cond = " ".join(a.text if not a.quoted else f'"{a.text}"' for a in c.args)
        if c.name == "if":
            frames.append([(cond, c.line)])
        elif c.name == "elseif" and frames:
            frames[-1].append((cond, c.line))
        elif c.name == "else" and frames:
            frames[-1].append(("", c.line))
        elif c.name == "endif" and frames:
            frames.pop()
        elif c.name == "include":
            target = _include_target(c, tree, path)
            if target:
                gates = outer + [g for f in frames for g in _branch_gates(f, path)]
                _walk(target, tree, funcs, out, gates, depth + 1)
            continue
        elif not _replayed(c, funcs):
            continue
        if c.legacy_quotes:
            raise SourceError(
                f"source: {path}:{c.line}: {printable(c.name, 40)}() quotes inside an unquoted argument; the kernel "
                "plan hands CMake no command it may read differently from this tool, so it cannot be computed"
            )
        out.script.append(c.source)
        if c.name in funcs:
            around = tuple(outer + [g for f in frames for g in _branch_gates(f, path)])
            _select(c, path, around, exts, ordinals, out)


def _select(c: Command, path: str, gates: tuple[Gate, ...], exts: list, ordinals: dict[str, int], out: Replay) -> None:
    """Record the arch selection ``c`` makes, and have the script report its value right after it."""
    out.called.add(c.name)
    var = c.args[0].text
    ordinals[var] = ordinals.get(var, 0) + 1
    sel = Selection(
        var=var,
        file=path,
        line=c.line,
        ordinal=ordinals[var],
        function=c.name,
        wanted=c.args[1].text if len(c.args) > 1 else "",
        gates=gates,
        extension=next((name for line, name in exts if line > c.line), None),
    )
    out.script.append(f'message(STATUS "{_MARK} {len(out.selections)} [${{{var}}}]")')
    out.selections.append(sel)


def _replayed(c: Command, funcs: dict) -> bool:
    """A call of a utils.cmake function on an *ARCHS* variable, or a set/unset/list of one."""
    if not c.args:
        return False
    if c.name in funcs:
        return bool(_ARCH_VAR.fullmatch(c.args[0].text))
    if c.name in ("set", "unset"):
        return bool(_ARCH_VAR.fullmatch(c.args[0].text)) and "CACHE" not in c.words()[1:]
    if c.name == "list" and len(c.args) > 1:
        ops = ("APPEND", "PREPEND", "REMOVE_ITEM", "REMOVE_DUPLICATES", "INSERT", "SORT", "FILTER")
        return c.args[0].text in ops and bool(_ARCH_VAR.fullmatch(c.args[1].text))
    return False


@functools.cache  # one `cmake --version` per process: track plans two commits
def cmake_binary() -> tuple[str, str]:
    """The pinned cmake (the ``cmake`` wheel in the tool's lock) and its version, >= CMAKE_MIN."""
    try:
        import cmake  # the PyPI wheel: the binary lives in the package, pinned by ci/requirements.lock

        path = str(Path(cmake.CMAKE_BIN_DIR) / "cmake")
    except (ImportError, AttributeError):
        path = shutil.which("cmake") or ""
    if not path or not os.access(path, os.X_OK):
        raise ConfigError("cmake: not installed; the kernel plan needs cmake >= 3.26 (`pip install cmake`)")
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"version (\d+)\.(\d+)(\.\S+)?", out)
    if not m or (int(m.group(1)), int(m.group(2))) < CMAKE_MIN:
        raise ConfigError(f"cmake: {path} is {printable(out.strip()[:60])}; the kernel plan needs cmake >= 3.26")
    return path, m.group(0).removeprefix("version ")


def _prelude(cuda_version: str, arch_list: tuple[str, ...]) -> list[str]:
    """What the build would know at the first selection. CUDA_ARCH_FLAGS is what torch hands vLLM for
    TORCH_CUDA_ARCH_LIST (one ``-gencode arch=compute_XY,code=sm_XY`` per entry, as vLLM's
    clear_cuda_gencode_flags leaves them); vLLM's own extract_unique_cuda_archs_ascending turns it
    into CUDA_ARCHS. TORCH_CUDA_ARCH_LIST itself is in the compile's environment too (the Dockerfile
    sets it), so build files that read ``$ENV{TORCH_CUDA_ARCH_LIST}`` (the smoke's) see the list."""
    flags = ";".join(f"-gencode arch=compute_{a.replace('.', '')},code=sm_{a.replace('.', '')}" for a in arch_list)
    major_minor = ".".join(cuda_version.split(".")[:2])
    return [
        f"cmake_minimum_required(VERSION {CMAKE_MIN[0]}.{CMAKE_MIN[1]})",
        "set(VLLM_GPU_LANG CUDA)",
        f"set(CMAKE_CUDA_COMPILER_VERSION {cuda_version})",
        f"set(CUDA_VERSION {major_minor})",
        f'set(CUDA_ARCH_FLAGS "{flags}")',
        f'set(CUDA_ARCHS "{";".join(arch_list)}")',
        f'set(ENV{{TORCH_CUDA_ARCH_LIST}} "{" ".join(arch_list)}")',
    ]


def replay(tree: SourceTree) -> tuple[Replay, bytes]:
    """The selections of the tree's build files and the script that computes them (without prelude)."""
    utils = tree.read(UTILS)
    if utils is None or tree.read(ROOT_FILE) is None:
        raise SourceError(f"source: no {ROOT_FILE} or {UTILS} at the pinned commit; no kernel plan can be computed")
    funcs = _functions(commands(utils, UTILS))
    out = Replay()
    _walk(ROOT_FILE, tree, funcs, out, [])
    _check_safe(funcs, out.called)
    return out, utils


def cmake_data() -> Path:
    """The directory the sandbox image is made from: the pinned cmake's bin/ and share/cmake-X.Y/."""
    return Path(cmake_binary()[0]).resolve().parent.parent


def script(rp: Replay, utils: bytes, cuda_version: str, arch_list: tuple[str, ...]) -> bytes:
    """What the sandbox runs: the prelude, utils.cmake's definitions inlined (the sandbox has no file
    of the tree; top level holds only definitions, so inlining reads as include() would), the replay."""
    body = "\n".join(_prelude(cuda_version, arch_list)) + "\n"
    return body.encode() + utils + b"\n" + "\n".join(rp.script).encode() + b"\n"


def run_cmake(
    rp: Replay, utils: bytes, cuda_version: str, arch_list: tuple[str, ...], sandbox: Sandbox
) -> dict[int, tuple[str, ...]]:
    """Run the script with ``cmake -P`` in ``sandbox``; selection index -> its value where it was reached."""
    ran = sandbox.run(script(rp, utils, cuda_version, arch_list), TIMEOUT_SECONDS)
    if ran.rc is None:
        raise SourceError(f"source: the kernel plan's cmake -P ran over {TIMEOUT_SECONDS} s")
    if ran.rc != 0:
        err = ran.stderr[-2000:].strip().splitlines()
        raise SourceError(f"source: cmake -P on the build files failed: {printable(' / '.join(err[-4:]), 400)}")
    values: dict[int, tuple[str, ...]] = {}
    for line in ran.stdout[:MAX_OUTPUT].splitlines():
        m = re.fullmatch(rf"-- {_MARK} (\d+) \[(.*)\]", line)
        if m:
            values[int(m.group(1))] = tuple(a for a in m.group(2).split(";") if a)
    return values

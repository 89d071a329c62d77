"""Probe: does every module of the named Python trees import in the image?

The trees are what CMake install steps and third-party sources put into the wheel (vLLM:
vllm.vllm_flash_attn with FA4's cute files, vllm.third_party, the K3 model package). Every module
found on disk under a tree (.py files, packages, compiled modules) is imported in a process of
its own, forked from one that ran the set-up entries (a module to import, or module:callable to
call: the heavy common imports and the package's own run-time set-up), so one module's side
effects cannot fail another: vLLM's unused flash_linear_attention.ops.fused_norm_gate registers
the same custom-op name as ops.kda, and fmha_sm100 puts its own import root on sys.path. A
module matching a skip pattern is listed, not imported. Run with the compat driver library on
the library path. Request: {"trees": [...], "skip": [...], "setup": [...], "timeout": seconds}.

Report-only (issue 34, rule 8): an audit hook records what the set-up and each import do besides
importing (network connects, writes outside /tmp, /dev and /proc, subprocesses), per module; the
same rule as the loaded probe's for the entrypoint's imports (builder/checks/probes/loaded.py).
"""

import fnmatch
import importlib
import importlib.machinery
import importlib.util
import json
import os
import select
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time builder/checks/probes/_report.py is prepended: report() is defined
    from builder.checks.probes._report import report


def call(ref):
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    if not attr:
        return obj
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj()


def described(exc):
    """The error, and the first one behind it when a package re-raised it with its own message
    (vllm.vllm_flash_attn turns a missing libcuda.so.1 into "requires the extensions")."""
    text = f"{type(exc).__name__}: {exc}"
    inner = exc.__cause__ or exc.__context__
    if inner is not None and str(inner) not in text:
        text += f" (from {type(inner).__name__}: {inner})"
    return text[:400]


EFFECTS: list = []  # this process's side effects; a forked child starts from an empty list
SPAWNS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.startfile")


def audit(event, args):
    if len(EFFECTS) >= 20:
        return
    if event == "socket.connect":
        EFFECTS.append(["connect", repr(args[1])[:200]])
    elif event in SPAWNS:
        EFFECTS.append(["subprocess", repr(args[:2])[:200]])
    elif event == "open" and isinstance(args[0], str):
        path = os.path.abspath(args[0])  # "/tmp/../etc/x" is no write under /tmp
        mode, flags = args[1], args[2] if len(args) > 2 else 0
        writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(flags & (os.O_WRONLY | os.O_RDWR))
        if writes and not path.startswith(("/tmp/", "/dev/", "/proc/")):
            EFFECTS.append(["write", path[:200]])


def start(name):
    """Fork a child that imports ``name`` and writes its outcome (None or the error) to a pipe."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        del EFFECTS[:]
        try:
            importlib.import_module(name)
            outcome = None
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: the child always reports
            outcome = described(exc)
        os.write(write, json.dumps([outcome, EFFECTS]).encode())
        os._exit(0)  # no atexit handlers, no flush of what the parent had buffered
    os.close(write)
    return pid, read


def finish(pid, read, killed=False):
    """(None or why the import failed, its side effects)."""
    chunks = []
    while True:
        chunk = os.read(read, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    if chunks:
        outcome, effects = json.loads(b"".join(chunks))
        return outcome, effects
    if killed:
        return "timed out", []
    if os.WIFSIGNALED(status):
        return f"the import crashed the interpreter (signal {os.WTERMSIG(status)})", []
    return f"the import ended the interpreter (exit {os.WEXITSTATUS(status)})", []


def import_each(names, timeout, workers, effects=None):
    """{name: None or why} with every import in its own forked child, ``workers`` at a time; what
    each import did besides importing goes to ``effects`` (name -> [[kind, what], ...])."""
    results: dict[str, Any] = {}
    effects = {} if effects is None else effects
    queue = list(names)
    running: dict[int, tuple[str, int, float]] = {}  # the pipe it reports on -> (name, pid, started)
    while queue or running:
        while queue and len(running) < workers:
            name = queue.pop(0)
            pid, read = start(name)
            running[read] = (name, pid, time.monotonic())
        ready, _, _ = select.select(list(running), [], [], 1.0)
        for read in list(running):
            name, pid, began = running[read]
            late = time.monotonic() - began > timeout
            if read in ready or late:
                if late and read not in ready:
                    os.kill(pid, signal.SIGKILL)
                results[name], found = finish(pid, read, killed=late and read not in ready)
                if found:
                    effects[name] = found
                del running[read]
    return results


def modules_of(tree):
    """Every module name on disk under ``tree`` (a package), the package itself first."""
    spec = importlib.util.find_spec(tree)
    if spec is None:
        raise ModuleNotFoundError(f"no module named {tree!r}")
    found = [tree]
    suffixes = tuple(importlib.machinery.all_suffixes())
    for location in spec.submodule_search_locations or ():
        for top, dirs, files in os.walk(location):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and d.isidentifier())
            rel = os.path.relpath(top, location)
            prefix = tree if rel == "." else tree + "." + rel.replace(os.sep, ".")
            if rel != "." and not any(f.endswith(suffixes) for f in files):
                continue  # data-only directory (headers, kernels' sources)
            if rel != ".":
                found.append(prefix)
            for name in sorted(files):
                suffix = next((s for s in suffixes if name.endswith(s)), None)
                stem = name[: -len(suffix)] if suffix else ""
                if suffix and stem != "__init__" and stem.isidentifier():
                    found.append(f"{prefix}.{stem}")
    return sorted(set(found))


def skipped(name, pattern):
    """fnmatch on the dotted name; "pkg.*" also skips pkg itself."""
    return fnmatch.fnmatchcase(name, pattern) or (pattern.endswith(".*") and name == pattern[:-2])


def main(req):
    out: dict[str, dict[str, Any]] = {"setup": {}, "trees": {}, "imported": {}, "skipped": {}, "side_effects": {}}
    sys.addaudithook(audit)
    for ref in req["setup"]:
        try:
            call(ref)
            out["setup"][ref] = None
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: a probe never exits early
            out["setup"][ref] = f"{type(exc).__name__}: {exc}"
    if EFFECTS:
        out["side_effects"]["(set-up)"] = list(EFFECTS)
    wanted = []
    for tree in req["trees"]:
        try:
            names = modules_of(tree)
            out["trees"][tree] = None
        except BaseException as exc:  # noqa: BLE001
            out["trees"][tree] = f"{type(exc).__name__}: {exc}"
            continue
        for name in names:
            pattern = next((p for p in req["skip"] if skipped(name, p)), None)
            if pattern:
                out["skipped"][name] = pattern
            elif name not in wanted:
                wanted.append(name)
    sys.stdout.flush()
    sys.stderr.flush()
    workers = max(1, min(8, os.cpu_count() or 1))
    out["imported"] = import_each(wanted, req.get("timeout", 300), workers, out["side_effects"])
    return out


if __name__ == "__main__":
    report(main)

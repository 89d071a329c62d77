"""Probe: does the image start?

Entrypoint + Cmd: the program resolves (absolute, or through the image's PATH) to an executable
regular file; a script's shebang names an interpreter that exists and is executable; the
entrypoint with ``--help`` exits 0 (no GPU here). Every ``console_scripts``/``gui_scripts`` entry
of every installed distribution: its script is in the interpreter's scripts directory, executable,
its shebang names an existing interpreter, and its ``module:attr`` resolves (imported in a forked
child). Request: {"argv": [...], "help": [...], "timeout": 120}.
"""

import importlib
import importlib.metadata as md
import os
import shutil
import subprocess
import sysconfig
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time _report.py and _fork.py are prepended: report(), in_child() are defined
    from builder.checks.probes._fork import in_child
    from builder.checks.probes._report import report


def interpreter(path):
    """None when ``path`` is an executable whose shebang (if any) names an existing interpreter."""
    if not os.path.isfile(path):
        return f"{path} does not exist"
    if not os.access(path, os.X_OK):
        return f"{path} is not executable"
    with open(path, "rb") as fh:
        head = fh.read(512)
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if not words:
        return f"{path}: empty shebang"
    exe = words[0] if words[0] != "/usr/bin/env" or len(words) < 2 else shutil.which(words[1]) or words[1]
    if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        return f"{path}: its shebang names {exe}, which is no executable in the image"
    return None


def resolve(value):
    module, _, attr = value.partition(":")
    obj = importlib.import_module(module.strip())
    for part in [p for p in attr.split("[")[0].strip().split(".") if p]:
        obj = getattr(obj, part)
    return None


def entrypoint(req):
    argv = req["argv"]
    if not argv:
        return {"error": "the config has neither Entrypoint nor Cmd"}
    program = argv[0] if "/" in argv[0] else shutil.which(argv[0])
    if not program:
        return {"error": f"{argv[0]} is not on PATH ({os.environ.get('PATH', '')})"}
    why = interpreter(program)
    if why:
        return {"program": program, "error": why}
    try:
        proc = subprocess.run([program, *req["help"]], capture_output=True, text=True, timeout=req.get("timeout", 120))
    except (OSError, subprocess.SubprocessError) as exc:
        return {"program": program, "error": f"{' '.join(req['help'])}: {exc}"}
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])[-300:]
        return {"program": program, "error": f"`{' '.join([argv[0], *req['help']])}` exited {proc.returncode}: {tail}"}
    return {"program": program, "error": None}


def main(req):
    out: dict[str, Any] = {"entrypoint": entrypoint(req), "scripts": {}}
    scripts = sysconfig.get_path("scripts")
    seen = set()
    for dist in md.distributions():
        for ep in dist.entry_points:
            if ep.group not in ("console_scripts", "gui_scripts") or ep.name in seen:
                continue
            seen.add(ep.name)
            path = os.path.join(scripts, ep.name)
            why = interpreter(path) or in_child(resolve, ep.value, quiet=True)
            out["scripts"][path] = {"dist": f"{dist.metadata['Name']} {dist.version}", "value": ep.value, "error": why}
    return out


if __name__ == "__main__":
    report(main)

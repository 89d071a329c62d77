"""Probe: least privilege, checked as the image's runtime user (the container's user).

No setuid or setgid file under the roots. Nothing on sys.path (recursively) or on PATH (each
directory and what it holds) is writable by this user: write access by mode for the user or one of
its groups, or owned by it (an owner can chmod). Each cache directory the environment names (a
variable whose name matches the request's pattern: CUDA_CACHE_PATH, TRITON_CACHE_DIR, XDG_CACHE_HOME)
is an absolute path this user can write (or create: its nearest existing ancestor is a directory it
can write), neither on nor holding a sys.path or PATH entry (one that does not exist yet too):
what lands in a cache must not be importable or run.
Request: {"roots": [...], "caches": "<regex of the variable names>"}.
"""

import os
import re
import stat
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time builder/checks/probes/_report.py is prepended: report() is defined
    from builder.checks.probes._report import report

LIMIT = 200


def writable(path, st, uid):
    return st.st_uid == uid or os.access(path, os.W_OK, follow_symlinks=False)


def cache_problem(path, code_dirs):
    """Why the cache directory ``path`` is unfit, or None."""
    if not os.path.isabs(path):
        return "is not an absolute path"
    real = os.path.realpath(path)
    for d in code_dirs:
        if real == d or real.startswith(d.rstrip("/") + "/"):
            return f"is on sys.path or PATH ({d})"
        if d.startswith(real.rstrip("/") + "/"):
            return f"holds the sys.path or PATH directory {d}"
    existing = real
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"cannot be a directory: {existing} is not one"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"is not writable by uid {os.getuid()}" + (
            f" ({existing} is the nearest that exists)" if existing != real else ""
        )
    return None


def caches(pattern, code_dirs):
    """{variable: [its value, why it is unfit or None]} for each cache variable set here."""
    names = sorted(n for n in os.environ if pattern and re.fullmatch(pattern, n))
    return {n: [os.environ[n], cache_problem(os.environ[n], code_dirs)] for n in names}


def main(req):
    uid = os.getuid()
    out: dict[str, Any] = {"uid": uid, "gids": sorted({os.getgid(), *os.getgroups()}), "setid": [], "writable": []}
    for root in req["roots"]:
        for top, _dirs, files in os.walk(root):
            for name in files:
                path = os.path.join(top, name)
                st = os.lstat(path)
                if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                    out["setid"].append([path, oct(st.st_mode & 0o7777)])
    seen = set()
    py = [p for p in sys.path if p and os.path.isdir(p)]
    path_dirs = [p for p in os.environ.get("PATH", "").split(":") if p and os.path.isdir(p)]
    for base, deep in [(p, True) for p in py] + [(p, False) for p in path_dirs]:
        for top, dirs, files in os.walk(base):
            if not deep:
                dirs[:] = []
            for path in [top] + [os.path.join(top, n) for n in dirs + files]:
                if path in seen:
                    continue
                seen.add(path)
                st = os.lstat(path)
                if not stat.S_ISLNK(st.st_mode) and writable(path, st, uid):
                    out["writable"].append([path, oct(st.st_mode & 0o7777), st.st_uid, st.st_gid])
    out["scanned"] = len(seen)
    # Every entry, made or not: a cache directory created later at a sys.path or PATH entry that
    # does not exist yet is importable or run from the moment it exists.
    entries = [p for p in sys.path if p] + [p for p in os.environ.get("PATH", "").split(":") if p]
    out["caches"] = caches(req.get("caches"), sorted({os.path.realpath(p) for p in entries}))
    out["count"] = len(out["writable"]) + len(out["setid"]) + sum(1 for _, why in out["caches"].values() if why)
    out["writable"] = out["writable"][:LIMIT]
    return out


if __name__ == "__main__":
    report(main)

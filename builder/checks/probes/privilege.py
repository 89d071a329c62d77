"""Probe: least privilege, checked as the image's runtime user (the container's user).

No setuid or setgid file under the roots. Nothing on sys.path (recursively) or on PATH (each
directory and what it holds) is writable by this user: write access by mode for the user or one of
its groups, or owned by it (an owner can chmod). Request: {"roots": [...]}.
"""

import os
import stat
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time builder/checks/probes/_report.py is prepended: report() is defined
    from builder.checks.probes._report import report

LIMIT = 200


def writable(path, st, uid):
    return st.st_uid == uid or os.access(path, os.W_OK, follow_symlinks=False)


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
    out["count"] = len(out["writable"]) + len(out["setid"])
    out["writable"] = out["writable"][:LIMIT]
    return out


if __name__ == "__main__":
    report(main)

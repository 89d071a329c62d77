"""Probe: which files does the installed package hold, and which may be executed?

Request: {"distribution": "vllm", "package": "vllm", "blobs": [...]}. The package's directory is found through
the distribution's metadata (nothing is imported: importing vLLM would start CUDA probing), and
every regular file under it is listed relative to the directory that holds the package
("vllm/utils/numa_wrapper.sh"), with whether its mode has an execute bit (whoever runs the probe). __pycache__ is left
out: bytecode is the image's own, not the source's. For each path in ``blobs`` (the files the source
has at the pinned commit) the installed file's git blob id is computed (sha1 of ``blob <size>``,
NUL, the bytes: what a git tree names a file's content by), so the check compares contents with
the pinned commit's tree without shipping the tree into the image.
"""

import hashlib
import importlib.metadata
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time builder/checks/probes/_report.py is prepended: report() is defined
    from builder.checks.probes._report import report


def main(req):
    dist = importlib.metadata.distribution(req["distribution"])
    root = os.path.realpath(str(dist.locate_file(req["package"])))
    out: dict[str, Any] = {"root": root, "files": {}}
    if not os.path.isdir(root):
        out["error"] = f"{req['package']}: no such directory beside {req['distribution']}'s metadata ({root})"
        return out
    parent = os.path.dirname(root)
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            path = os.path.join(top, name)
            if os.path.isfile(path) and not os.path.islink(path):
                out["files"][os.path.relpath(path, parent)] = bool(os.stat(path).st_mode & 0o111)
    out["blobs"] = {}
    for rel in req.get("blobs", []):
        path = os.path.join(parent, rel)
        if rel in out["files"]:
            try:
                with open(path, "rb") as fh:
                    data = fh.read()
            except OSError as exc:
                out["blobs"][rel] = f"unreadable: {exc}"
                continue
            out["blobs"][rel] = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: S324 - git's id
    return out


if __name__ == "__main__":
    report(main)

"""Probe: does the bytecode under the roots match its source?

The build writes a checked hash-based .pyc (PEP 552) beside every source
(builder/dockerfile/templates/layer_files.py). Every ``__pycache__/<name>.<this interpreter's cache
tag>.pyc`` (what an import without -O reads) whose source exists must be checked-hash (flags 0b11) with the source's
SipHash; one without a source is never imported and is counted. A ``<name>.pyc`` outside
``__pycache__`` is imported when ``<name>.py`` is absent (a sourceless module): it fails. Request:
{"roots": [...]}.
"""

import importlib.util
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time builder/checks/probes/_report.py is prepended: report() is defined
    from builder.checks.probes._report import report

LIMIT = 200
KINDS = {0: "timestamp-based", 1: "unchecked hash-based", 3: "checked hash-based"}


def judge(pyc, source):
    with open(pyc, "rb") as fh:
        head = fh.read(16)
    if head[:4] != importlib.util.MAGIC_NUMBER:
        return "written by another Python (magic differs)"
    flags = int.from_bytes(head[4:8], "little")
    if flags != 0b11:
        return f"{KINDS.get(flags, f'flags {flags}')}, not checked hash-based"
    with open(source, "rb") as fh:
        if importlib.util.source_hash(fh.read()) != head[8:16]:
            return "its hash differs from the source's (stale bytecode)"
    return None


def main(req):
    tag = sys.implementation.cache_tag
    out: dict[str, Any] = {"checked": 0, "orphans": 0, "other_tag": 0, "problems": []}
    for root in req["roots"]:
        for top, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(f for f in files if f.endswith(".pyc")):
                pyc = os.path.join(top, name)
                if os.path.basename(top) != "__pycache__":
                    if not os.path.exists(pyc[:-1]):
                        out["problems"].append([pyc, "sourceless: imported in place of a missing source"])
                    continue
                stem, _, rest = name.partition(".")
                if rest != tag + ".pyc":  # another interpreter's, or -O's .opt-N (the image runs without -O)
                    out["other_tag"] += 1
                    continue
                source = os.path.join(os.path.dirname(top), stem + ".py")
                if not os.path.exists(source):
                    out["orphans"] += 1
                    continue
                out["checked"] += 1
                try:
                    why = judge(pyc, source)
                except OSError as exc:
                    why = f"unreadable: {exc}"
                if why:
                    out["problems"].append([pyc, why])
    out["count"] = len(out["problems"])
    out["problems"] = out["problems"][:LIMIT]
    return out


if __name__ == "__main__":
    report(main)

"""Probe: is every installed file what was installed?

Every ``*.dist-info/RECORD`` in a sys.path directory under the roots is read (with the
``RECORD.native`` beside it, where the application's ELF files keep their hashes:
builder/dockerfile/templates/layer_files.py) and each file it lists must exist with that
sha256. Every file in those sys.path directories (site-packages) must be listed by some RECORD,
except bytecode (the bytecode_matches check owns it). For the base's OS packages, every file a
``/var/lib/dpkg/info/*.md5sums`` lists that is present must have that md5 (dpkg's path-exclude
drops docs from slim bases, so a missing file is counted, not failed; configuration under /etc
is the admin's to change).

Each RECORD is also held to the locked wheel's, as the build recorded it (``wheels``: normalized
name -> {version, entries, sha256}, builder/deps/buildcontext.py wheel_records): the digest of the
lines pip copies unchanged must be the wheel's, so a file edited after the install whose RECORD
line was re-hashed to match is found too. What pip adds (INSTALLER, REQUESTED, direct_url.json,
bytecode, scripts and headers outside site-packages) is counted as such. The rule repeats
buildcontext.canonical_entries (this file runs in the image, standard library only).

Request: {"roots": [...], "dpkg_info": "/var/lib/dpkg/info", "wheels": {...} or null}.
"""

import base64
import csv
import glob
import hashlib
import json
import os
import re
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time builder/checks/probes/_report.py is prepended: report() is defined
    from builder.checks.probes._report import report

LIMIT = 200
PIP_WRITES = ("INSTALLER", "REQUESTED", "direct_url.json", "RECORD", "RECORD.jws", "RECORD.p7s")


def canonical(rows, added):
    """buildcontext.canonical_entries: the sorted "path,hash,size" lines pip copies from the wheel;
    what else the RECORD lists is counted in ``added`` by kind."""
    kept = set()
    for row in rows:
        if not row or not row[0]:
            continue
        parts = row[0].split("/")
        if parts[0].endswith(".data"):
            if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                continue
            parts = parts[2:]
        if parts[0] == "..":
            added["outside"] += 1  # scripts (the console scripts pip generates too), headers, data
        elif len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] in PIP_WRITES:
            added["metadata"] += parts[1] != "RECORD"
        elif "__pycache__" in parts and parts[-1].endswith(".pyc"):
            added["bytecode"] += 1
        else:
            kept.add(",".join(["/".join(parts), *(row[1:3] + ["", ""])[:2]]))
    return sorted(kept)


def dist_name(dist_info):
    name = version = None
    try:
        with open(os.path.join(dist_info, "METADATA"), encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                if key == "Name" and name is None:
                    name = value.strip()
                elif key == "Version" and version is None:
                    version = value.strip()
    except OSError:
        return None, None
    return (re.sub(r"[-_.]+", "-", name).lower() if name else None), version


def against_wheel(dist_info, wheels, out):
    """The installed RECORD against the locked wheel's digest (wheels: None when not recorded)."""
    name, version = dist_name(dist_info)
    want = (wheels or {}).get(name)
    if want is None or want.get("version") != version:
        out["wheel_unmatched"] += 1  # not a locked wheel at its version (lock_contents judges it), or the source's
        return
    if want.get("error"):
        out["problems"].append([dist_info, f"the build could not read the locked wheel's RECORD: {want['error']}"])
        return
    try:
        with open(os.path.join(dist_info, "RECORD"), newline="", encoding="utf-8") as fh:
            entries = canonical(csv.reader(fh), out["pip_added"])
    except (OSError, csv.Error, UnicodeDecodeError) as exc:
        out["problems"].append([dist_info, f"RECORD unreadable: {exc}"])
        return
    out["wheel_checked"] += 1
    got = hashlib.sha256("".join(e + "\n" for e in entries).encode()).hexdigest()
    if got != want["sha256"]:
        out["problems"].append(
            [
                os.path.join(dist_info, "RECORD"),
                f"not the locked wheel's RECORD ({name} {version}): the build recorded {want['entries']} entries "
                f"(sha256 {want['sha256'][:12]}), found {len(entries)} (sha256 {got[:12]}); a file was changed, "
                "added or dropped and its RECORD line rewritten to match",
            ]
        )


def digest(path, algorithm):
    h = hashlib.new(algorithm)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h


def record_lines(dist_info):
    rows = {}
    for name in ("RECORD", "RECORD.native"):  # RECORD.native's hashes fill RECORD's empty ones
        try:
            with open(os.path.join(dist_info, name), newline="", encoding="utf-8") as fh:
                for row in csv.reader(fh):
                    if row and (row[0] not in rows or (len(row) > 1 and row[1])):
                        rows[row[0]] = row[1] if len(row) > 1 else ""
        except OSError:
            if name == "RECORD":
                return None
    return rows


def verify(dist_info, out, listed, wheels=None):
    site = os.path.dirname(dist_info)
    rows = record_lines(dist_info)
    if rows is None:  # lock_contents judges a distribution nothing installed; nothing to verify here
        out["unrecorded"].append(dist_info)
        return
    against_wheel(dist_info, wheels, out)
    for rel, hashed in rows.items():
        path = os.path.normpath(os.path.join(site, rel))
        listed.add(path)
        if not hashed:
            continue
        out["hashed"] += 1
        algorithm, _, want = hashed.partition("=")
        try:
            got = base64.urlsafe_b64encode(digest(path, algorithm).digest()).rstrip(b"=").decode()
        except FileNotFoundError:
            out["problems"].append([path, f"missing (listed in {dist_info}/RECORD)"])
            continue
        except (OSError, ValueError) as exc:
            out["problems"].append([path, f"unreadable: {exc}"])
            continue
        if got != want:
            out["problems"].append([path, f"sha256 differs from {os.path.basename(dist_info)}/RECORD"])


def unowned(sites, listed, out):
    for site in sorted(sites):
        for top, dirs, files in os.walk(site):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            if os.path.relpath(top, site).split(os.sep)[0].endswith(".dist-info"):
                continue  # RECORD.native, licenses/ and what an installer writes beside RECORD
            for name in sorted(files):
                path = os.path.join(top, name)
                if path not in listed and not name.endswith(".pyc"):
                    out["problems"].append([path, "listed by no RECORD"])


def dpkg_part(sums_files, out):
    for sums in sums_files:
        package = os.path.basename(sums)[: -len(".md5sums")]
        with open(sums, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                want, _, rel = line.strip().partition("  ")
                path = "/" + rel
                if not rel or path.startswith("/etc/"):
                    continue
                try:
                    got = digest(path, "md5").hexdigest()
                except OSError:
                    out["dpkg_absent"] += 1
                    continue
                out["dpkg_checked"] += 1
                if got != want:
                    out["problems"].append([path, f"md5 differs from dpkg's record of {package}"])


def read_all(fd):
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def dpkg(info_dir, out, jobs):
    """The base's md5sums, split over ``jobs`` forked children (hashing a CUDA base is GBs)."""
    files = sorted(glob.glob(os.path.join(info_dir, "*.md5sums")))
    children = []
    for i in range(jobs):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            part: dict[str, Any] = {"problems": [], "dpkg_checked": 0, "dpkg_absent": 0}
            dpkg_part(files[i::jobs], part)
            os.write(w, json.dumps(part).encode())
            os._exit(0)
        os.close(w)
        children.append((pid, r))
    for pid, r in children:
        data = read_all(r)
        os.waitpid(pid, 0)
        part = json.loads(data) if data else {"problems": [["(dpkg)", "a hashing process died"]]}
        out["problems"] += part["problems"]
        out["dpkg_checked"] += part.get("dpkg_checked", 0)
        out["dpkg_absent"] += part.get("dpkg_absent", 0)


WHEEL_COUNTS = ("wheel_checked", "wheel_unmatched")


def verify_all(dist_infos, jobs, wheels=None):
    """verify() over ``dist_infos``, split over ``jobs`` forked children (a CUDA image is GBs)."""
    children = []
    for i in range(jobs):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            part: dict[str, Any] = {"hashed": 0, "problems": [], "unrecorded": [], "wheel_checked": 0}
            part.update(wheel_unmatched=0, pip_added={"metadata": 0, "bytecode": 0, "outside": 0})
            listed: set = set()
            for d in dist_infos[i::jobs]:
                verify(d, part, listed, wheels)
            part["listed"] = sorted(listed)
            os.write(w, json.dumps(part).encode())
            os._exit(0)
        os.close(w)
        children.append((pid, r))
    out: dict[str, Any] = {"hashed": 0, "problems": [], "unrecorded": [], "listed": set()}
    out.update({k: 0 for k in WHEEL_COUNTS}, pip_added={"metadata": 0, "bytecode": 0, "outside": 0})
    for pid, r in children:
        data = read_all(r)
        os.waitpid(pid, 0)
        part = json.loads(data) if data else {"problems": [["(RECORD)", "a hashing process died"]]}
        out["hashed"] += part.get("hashed", 0)
        out["problems"] += part["problems"]
        out["unrecorded"] += part.get("unrecorded", [])
        out["listed"].update(part.get("listed", []))
        for k in WHEEL_COUNTS:
            out[k] += part.get(k, 0)
        for k, n in part.get("pip_added", {}).items():
            out["pip_added"][k] += n
    return out


def main(req):
    jobs = max(1, min(os.cpu_count() or 1, 4))
    # The installed distributions: dist-info directories in a sys.path directory under the roots.
    # One vendored inside a package (setuptools/_vendor/wheel-*.dist-info) describes an install
    # that never happened here: counted, not verified.
    roots = [os.path.realpath(r) for r in req["roots"]]
    sites = sorted(
        {os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)}
        & {os.path.realpath(p) for r in roots for p in sys.path if p and os.path.realpath(p).startswith(r + "/")}
    )
    dist_infos, vendored = [], 0
    for root in roots:
        for top, dirs, _ in os.walk(root):
            dirs.sort()
            for d in [d for d in dirs if d.endswith(".dist-info")]:
                if os.path.realpath(top) in sites:
                    dist_infos.append(os.path.join(top, d))
                else:
                    vendored += 1
    out: dict[str, Any] = verify_all(dist_infos, jobs, req.get("wheels"))
    out.update(dists=len(dist_infos), vendored=vendored, dpkg_checked=0, dpkg_absent=0)
    unowned(sites, out.pop("listed"), out)
    if req.get("dpkg_info"):
        dpkg(req["dpkg_info"], out, jobs)
    out["count"] = len(out["problems"])
    out["problems"] = out["problems"][:LIMIT]
    return out


if __name__ == "__main__":
    report(main)

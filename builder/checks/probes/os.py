"""Probe: are the OS lock's packages in the image as locked, and do they work?

Each locked package's dpkg record (in the OS layer's status directory, the way distroless
images keep them) must name the locked version and architecture, and every file its md5sums
list must be there with that md5; each package the matrix lists must be in the OS layer or the
base; each library in ``loads`` (a name, or an absolute glob) must load; each command in
``runs`` must exit 0. Request: {"status_dir": ..., "locked": [[name, version, arch]...],
"listed": [...], "loads": [...], "runs": [[argv...]...]}.
"""

import ctypes
import glob
import hashlib
import os
import re
import subprocess
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # at run time builder/checks/probes/_report.py is prepended: report() is defined
    from builder.checks.probes._report import report

FIELD = re.compile(r"^([A-Za-z-]+): (.*)$", re.M)


def fields(path):
    try:
        with open(path, encoding="utf-8") as fh:
            return dict(FIELD.findall(fh.read()))
    except OSError:
        return None


def base_packages():
    """Packages the base's own dpkg database says are installed."""
    try:
        with open("/var/lib/dpkg/status", encoding="utf-8") as fh:
            stanzas = fh.read().split("\n\n")
    except OSError:
        return set()
    found = set()
    for stanza in stanzas:
        f = dict(FIELD.findall(stanza))
        if f.get("Status", "").endswith(" installed"):
            found.add(f.get("Package"))
    return found


def files_of(status_dir, name):
    """Problems with the files package ``name``'s md5sums list."""
    try:
        with open(os.path.join(status_dir, name + ".md5sums"), encoding="utf-8") as fh:
            sums = fh.read().splitlines()
    except OSError:
        sums = []
    problems = []
    for line in sums:
        digest, path = line.split(None, 1)
        try:
            with open("/" + path, "rb") as fh:
                got = hashlib.md5(fh.read()).hexdigest()  # noqa: S324 - dpkg's own md5sums
        except OSError as exc:
            problems.append(f"{name}: /{path} missing ({exc.strerror})")
            continue
        if got != digest:
            problems.append(f"{name}: /{path} differs from the package")
    return problems


def works(loads, runs):
    problems = []
    for item in loads:
        paths = sorted(glob.glob(item)) if item.startswith("/") else [item]
        if not paths:
            problems.append(f"{item}: matches no file")
        for path in paths:
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as exc:
                problems.append(f"{path} does not load: {exc}")
    for cmd in runs:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            if proc.returncode != 0:
                problems.append(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()[-200:]}")
        except (OSError, subprocess.SubprocessError) as exc:
            problems.append(f"{' '.join(cmd)} did not run: {exc}")
    return problems


def main(req):
    sd, problems = req["status_dir"], []
    for name, version, arch in req["locked"]:
        f = fields(os.path.join(sd, name))
        if f is None:
            problems.append(f"{name}: no {sd}/{name}")
            continue
        if (f.get("Version"), f.get("Architecture")) != (version, arch):
            problems.append(f"{name}: expected {version} {arch}, found {f.get('Version')} {f.get('Architecture')}")
        problems += files_of(sd, name)
    base = base_packages()
    for name in req["listed"]:
        if name not in base and fields(os.path.join(sd, name)) is None:
            problems.append(f"{name}: listed in os_packages, neither in the OS layer nor in the base")
    problems += works(req["loads"], req["runs"])
    return {"problems": problems, "checked": len(req["locked"])}


if __name__ == "__main__":
    report(main)

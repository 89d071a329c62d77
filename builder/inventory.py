"""What is installed in an image, read out of it: os-release, dpkg status, Python distributions.

The SBOM lists it (builder/attest.py) and `build compare` diffs two of them (builder/compare.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from builder.engine import Engine

_PROBE = r"""
import importlib.metadata as md, json, sys
def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""
print(json.dumps({
    "os_release": read("/etc/os-release"),
    "dpkg_status": read("/var/lib/dpkg/status"),
    "dists": sorted({(d.metadata["Name"], d.version) for d in md.distributions() if d.metadata["Name"]}),
}))
"""


@dataclass(frozen=True)
class DebPackage:
    name: str
    version: str
    arch: str


@dataclass(frozen=True)
class Inventory:
    distro_id: str
    distro_version: str
    debs: tuple[DebPackage, ...]
    dists: tuple[tuple[str, str], ...]


def parse_os_release(text: str) -> tuple[str, str]:
    values = dict(re.findall(r'^([A-Z_]+)="?([^"\n]*)"?$', text, re.M))
    return values.get("ID", "unknown"), values.get("VERSION_ID", "")


def parse_dpkg_status(text: str) -> tuple[DebPackage, ...]:
    debs = []
    for stanza in text.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", stanza, re.M))
        if fields.get("Package") and fields.get("Status", "").endswith(" installed"):
            debs.append(DebPackage(fields["Package"], fields.get("Version", ""), fields.get("Architecture", "")))
    return tuple(sorted(set(debs), key=lambda d: (d.name, d.arch, d.version)))


def read(engine: Engine, ref: str) -> Inventory:
    doc = json.loads(engine.containers.run_python(ref, _PROBE))
    distro_id, distro_version = parse_os_release(doc["os_release"])
    return Inventory(distro_id, distro_version, parse_dpkg_status(doc["dpkg_status"]),
                     tuple((n, v) for n, v in doc["dists"]))

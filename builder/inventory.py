"""What is installed in an image, read out of it: os-release, dpkg status, Python distributions,
and what each package declares about its license.

The SBOM lists it (builder/attest.py) and `build compare` diffs two of them (builder/compare.py).
Packages of the OS layer (builder/oslock.py) are read from /var/lib/dpkg/status.d, where
distroless-style images keep them. One throwaway container runs a small probe with the image's own python; it reads files and prints
them back as JSON, nothing else. Licenses are carried as the packages declare them (the DEP-5
short names of a machine-readable debian/copyright, a distribution's License-Expression, short
License field and License classifiers); mapping them to SPDX is the SBOM's business.
"""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass

from builder.engine import Engine


def dep5_licenses(text):
    """The License synopses (first line of each ``License:`` field) of the Files paragraphs and
    the header of a machine-readable debian/copyright (DEP-5), as written, sorted; () for a file
    that is not machine-readable (no ``Format:`` header naming the format): no guessing from prose.

    Runs inside the image too (its source is part of the probe): plain Python 3, no annotations."""
    lines = [ln for ln in text.replace("\r\n", "\n").split("\n") if not ln.startswith("#")]
    paragraphs = [p for p in re.split(r"\n[ \t]*\n", "\n".join(lines).strip("\n")) if p.strip()]
    if not paragraphs:
        return ()
    found = set()
    for index, para in enumerate(paragraphs):
        fields = {}
        for m in re.finditer(r"^([A-Za-z][A-Za-z0-9-]*):[ \t]*(.*)$", para, re.M):
            fields.setdefault(m.group(1).lower(), m.group(2).strip())
        if index == 0:
            spec = fields.get("format", fields.get("format-specification", ""))
            if "copyright-format" not in spec and "dep5" not in spec and "dep-5" not in spec:
                return ()
        if (index == 0 or "files" in fields) and fields.get("license"):
            found.add(fields["license"])
    return tuple(sorted(found))


_PROBE_MAIN = r"""
import importlib.metadata as md, json, os, re
def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""
def dist(d):
    m = d.metadata
    lic = (m["License"] or "").strip()
    wheel = d.read_text("WHEEL") or ""
    return [m["Name"], d.version, (m["License-Expression"] or "").strip(),
            lic if len(lic) <= 100 and "\n" not in lic else "",
            sorted({c.strip() for c in (m.get_all("Classifier") or []) if c.strip().startswith("License ::")}),
            sorted({ln[4:].strip() for ln in wheel.splitlines() if ln.startswith("Tag:")})]
docs = {}
try:
    names = sorted(os.listdir("/usr/share/doc"))
except OSError:
    names = []
for name in names:
    found = dep5_licenses(read(os.path.join("/usr/share/doc", name, "copyright")))
    if found:
        docs[name] = found
# Packages unpacked into the image's OS layer keep their records as distroless images do.
sd = "/var/lib/dpkg/status.d"
extra = "".join("\n\n" + read(os.path.join(sd, f)).strip("\n") for f in sorted(os.listdir(sd))
                if not f.endswith(".md5sums")) if os.path.isdir(sd) else ""
print(json.dumps({
    "os_release": read("/etc/os-release"),
    "dpkg_status": read("/var/lib/dpkg/status").rstrip("\n") + extra,
    "dists": sorted({json.dumps(dist(d)) for d in md.distributions() if d.metadata["Name"]}),
    "deb_licenses": docs,
}))
"""

# The probe: dep5_licenses's own source (the one the unit tests exercise), then the main part.
_PROBE = "import re\n" + inspect.getsource(dep5_licenses) + _PROBE_MAIN


@dataclass(frozen=True)
class DebPackage:
    name: str
    version: str
    arch: str
    source: str = ""  # the source package (dpkg Source:, version dropped) when it is not ``name``
    licenses: tuple[str, ...] = ()  # DEP-5 License synopses of /usr/share/doc/<name>/copyright


@dataclass(frozen=True)
class PythonDist:
    name: str
    version: str
    license_expression: str = ""  # METADATA License-Expression (PEP 639)
    license: str = ""  # METADATA License, only when short (a name, not a license text)
    license_classifiers: tuple[str, ...] = ()  # "License :: ..." classifiers
    wheel_tags: tuple[str, ...] = ()  # the Tag: lines of the dist-info WHEEL file (the installed wheel's tags)


@dataclass(frozen=True)
class Inventory:
    distro_id: str
    distro_version: str
    debs: tuple[DebPackage, ...]
    python: tuple[PythonDist, ...]

    @property
    def dists(self) -> tuple[tuple[str, str], ...]:
        """(name, version) of every Python distribution."""
        return tuple((d.name, d.version) for d in self.python)


def parse_os_release(text: str) -> tuple[str, str]:
    values = dict(re.findall(r'^([A-Z_]+)="?([^"\n]*)"?$', text, re.M))
    return values.get("ID", "unknown"), values.get("VERSION_ID", "")


def parse_dpkg_status(text: str, licenses: dict[str, tuple[str, ...]] | None = None) -> tuple[DebPackage, ...]:
    """Installed packages; ``licenses`` maps a package name to its DEP-5 license synopses."""
    licenses = licenses or {}
    debs = []
    for stanza in text.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", stanza, re.M))
        name = fields.get("Package")
        if name and fields.get("Status", "").endswith(" installed"):
            source = re.sub(r"\s*\(.*\)\s*$", "", fields.get("Source", "")).strip()
            debs.append(DebPackage(name, fields.get("Version", ""), fields.get("Architecture", ""),
                                   source if source != name else "", tuple(licenses.get(name, ()))))
    return tuple(sorted(set(debs), key=lambda d: (d.name, d.arch, d.version)))


def parse_dists(rows: list[str]) -> tuple[PythonDist, ...]:
    out = set()
    for row in rows:
        name, version, expression, lic, classifiers, tags = json.loads(row)
        out.add(PythonDist(name, version, expression, lic, tuple(classifiers), tuple(tags)))
    return tuple(sorted(out, key=lambda d: (d.name, d.version, d.wheel_tags)))


def read(engine: Engine, ref: str) -> Inventory:
    doc = json.loads(engine.containers.run_python(ref, _PROBE))
    distro_id, distro_version = parse_os_release(doc["os_release"])
    licenses = {k: tuple(v) for k, v in doc["deb_licenses"].items()}
    return Inventory(distro_id, distro_version, parse_dpkg_status(doc["dpkg_status"], licenses),
                     parse_dists(doc["dists"]))

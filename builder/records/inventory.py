"""What is installed in an image, read out of it: os-release, dpkg status, Python distributions,
and what each package declares about its license.

The SBOM lists it (builder/records/attest.py) and `build compare` diffs two of them (builder/host/compare.py).
Packages of the OS layer (builder/deps/oslock.py) are read from /var/lib/dpkg/status.d, where
distroless-style images keep them. One throwaway container runs a small probe with the image's own
python; it reads files and prints them back as JSON, nothing else (copyright files are parsed
here, on the host, with python-debian).
Licenses are carried as the packages declare them (the License synopses of a machine-readable
debian/copyright, or the short names a file in prose names; a distribution's License-Expression,
short License field and License classifiers); mapping them to SPDX is the SBOM's business.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass

from builder.engine.seam import Engine

# DEP-5's short names (copyright-format 1.0, "License specification") and SPDX ids of the same
# shape, with an optional version and "+": what a fallback may take from a file in prose. Anything
# else on a "License:" line of prose ("License: This package is free software...") is a word, not
# a license, and is dropped.
_SHORT_NAME = re.compile(
    r"(?:public-domain|Apache|Artistic|BSD-[234]-clause|ISC|CC-BY(?:-SA|-ND|-NC(?:-SA|-ND)?)?|CC0|CDDL|CPL|EFL"
    r"|Expat|GPL|LGPL|AGPL|GFDL(?:-NIV)?|LPPL|MPL|Perl|Python|QPL|W3C|Zlib|Zope|MIT|BSL|OpenSSL|SSLeay|X11)"
    r"(?:-\d+(?:\.\d+)*)?\+?",
    re.I,
)
_SPLIT = re.compile(r"\s*,\s*(?:and\s+|or\s+)?|\s+(?:and/or|and|or)\s+", re.I)
_LICENSE_LINE = re.compile(r"^License:[ \t]*(\S[^\n]*)$", re.M)
_COMMON_LICENSE = re.compile(r"/usr/share/common-licenses/([A-Za-z0-9_.+-]+)")
COPYRIGHT_MAX = 512 * 1024  # a copyright file is a few KB, some a few hundred; the probe cuts there


def dep5_licenses(text: str) -> tuple[str, ...]:
    """The License synopses of a copyright file, sorted. A machine-readable one (DEP-5) is read
    with python-debian's ``debian.copyright``: the header's and every Files paragraph's synopsis,
    as written ("GPL-2+ or Artistic, and BSD-3-clause"). A file in prose (or one python-debian
    rejects): `prose_licenses`."""
    from debian import copyright as deb_copyright

    # python-debian logs each format URL it repairs; the result, not the repair, is what counts here.
    logging.getLogger(deb_copyright.__name__).setLevel(logging.ERROR)
    text = text.replace("\r\n", "\n")
    try:
        parsed = deb_copyright.Copyright(text.splitlines(), strict=False)
    except (deb_copyright.NotMachineReadableError, ValueError, KeyError):
        return prose_licenses(text)
    declared = (getattr(p, "license", None) for p in [parsed.header, *parsed.all_files_paragraphs()])
    found = {lic.synopsis.strip() for lic in declared if lic is not None and lic.synopsis.strip()}
    return tuple(sorted(found)) or prose_licenses(text)


def prose_licenses(text: str) -> tuple[str, ...]:
    """The fallback for a copyright file in prose: the short names on its ``License:`` lines and the
    /usr/share/common-licenses/<name> files it points at, each only if it is a DEP-5 short name or
    an SPDX id of that shape (`_SHORT_NAME`); never a word of the prose."""
    names = set()
    for synopsis in _LICENSE_LINE.findall(text):
        names |= {t for t in (p.strip() for p in _SPLIT.split(synopsis)) if _SHORT_NAME.fullmatch(t)}
    names |= {m.rstrip(".") for m in _COMMON_LICENSE.findall(text) if _SHORT_NAME.fullmatch(m.rstrip("."))}
    return tuple(sorted(names))


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
    text = read(os.path.join("/usr/share/doc", name, "copyright"))
    if text:
        docs[name] = text[:COPYRIGHT_MAX]
# Packages unpacked into the image's OS layer keep their records as distroless images do.
sd = "/var/lib/dpkg/status.d"
extra = "".join("\n\n" + read(os.path.join(sd, f)).strip("\n") for f in sorted(os.listdir(sd))
                if not f.endswith(".md5sums")) if os.path.isdir(sd) else ""
print(json.dumps({
    "os_release": read("/etc/os-release"),
    "dpkg_status": read("/var/lib/dpkg/status").rstrip("\n") + extra,
    "dists": sorted({json.dumps(dist(d)) for d in md.distributions() if d.metadata["Name"]}),
    "copyright": docs,
}))
"""

# The probe: plain Python 3 with the image's own interpreter; it reads files and prints them. The
# copyright files are parsed here on the host (python-debian is not in the image).
_PROBE = f"COPYRIGHT_MAX = {COPYRIGHT_MAX}\n" + _PROBE_MAIN


@dataclass(frozen=True)
class DebPackage:
    name: str
    version: str
    arch: str
    source: str = ""  # the source package (dpkg Source:, its name) when it is not ``name``, or binNMU
    licenses: tuple[str, ...] = ()  # License synopses of /usr/share/doc/<name>/copyright (dep5_licenses)
    # The source's version when dpkg writes one ("Source: bash (5.2.15-2)" for a binNMU 5.2.15-2+b13):
    # the SBOM's upstream=<source>@<version>, as syft writes it.
    source_version: str = ""


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
    """Installed packages; ``licenses`` maps a package name to its license synopses."""
    licenses = licenses or {}
    debs = []
    for stanza in text.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", stanza, re.M))
        name = fields.get("Package")
        if name and fields.get("Status", "").endswith(" installed"):
            m = re.fullmatch(r"\s*(\S+)\s*(?:\((\S+)\))?\s*", fields.get("Source", ""))
            source, source_version = (m.group(1), m.group(2) or "") if m else ("", "")
            debs.append(
                DebPackage(
                    name,
                    fields.get("Version", ""),
                    fields.get("Architecture", ""),
                    source if source != name or source_version else "",
                    tuple(licenses.get(name, ())),
                    source_version,
                )
            )
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
    licenses = {k: dep5_licenses(v) for k, v in doc["copyright"].items()}
    return Inventory(
        distro_id, distro_version, parse_dpkg_status(doc["dpkg_status"], licenses), parse_dists(doc["dists"])
    )

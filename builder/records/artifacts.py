"""What the SBOM and the provenance both name, defined once so both name it alike: the artifact
types they are attached to an image as, an image's purl, a wheel's file name, and the third-party
trees a record lists.
"""

from __future__ import annotations

import re

from packageurl import PackageURL

from builder.config.imageref import names_registry_host
from builder.records.store import Record

SBOM_TYPE = "application/vnd.cyclonedx+json"
# The provenance file is a DSSE envelope (payloadType application/vnd.in-toto+json): its artifact
# type in the registry is the envelope's media type, as sigstore and in-toto attach them.
PROVENANCE_TYPE = "application/vnd.dsse.envelope.v1+json"

WHEEL_NAME = re.compile(  # name-version[-build]-python-abi-platform.whl (the wheel spec's file name)
    r"(?P<name>[^-]+)-(?P<version>[^-]+)(?:-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl"
)


def oci_purl(ref: str, digest: str) -> PackageURL:
    """The purl of an image by digest, as the purl spec's ``oci`` type writes it: the name is the
    last path segment, ``repository_url`` the repository without tag, the tag a ``tag`` qualifier
    (``pkg:oci/debian@sha256:...?repository_url=docker.io/library/debian&tag=12``). Docker Hub's
    short names get their ``docker.io/`` (and ``library/``) written out. The SBOM and the
    provenance both use this one function, so the same image has the same purl in both."""
    repo = ref.split("@", 1)[0]
    head, _, last = repo.rpartition("/")
    tag = None
    if ":" in last:
        last, tag = last.split(":", 1)
    repo = f"{head}/{last}" if head else last
    if "/" not in repo:
        repo = f"docker.io/library/{repo}"
    elif not names_registry_host(repo):
        repo = f"docker.io/{repo}"
    qualifiers = {"repository_url": repo, **({"tag": tag} if tag else {})}
    return PackageURL(type="oci", name=last.lower(), version=digest, qualifiers=qualifiers)


def third_party_trees(record: Record) -> list[tuple[str, str, str, str]]:
    """(bom-ref, name, url, commit) of every third-party tree and submodule the compile used."""
    out = []
    for name, tp in sorted((record.source.get("third_party") or {}).items()):
        out.append((f"third_party:{name}", name, tp["url"], tp["commit"]))
        for sub in tp.get("submodules", []):
            out.append((f"third_party:{name}/{sub['path']}", f"{name}/{sub['path']}", sub["url"], sub["commit"]))
    return out

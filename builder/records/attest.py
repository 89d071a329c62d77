"""The audit trail of one image: a CycloneDX 1.6 SBOM, and `publish`, which makes it and the
provenance (builder/records/slsa.py) and attaches both to the image.

The SBOM is built here from what the pipeline already knows (matrix target, record, locks) plus an
inventory read out of the image itself (dpkg status, os-release, Python distributions, the licenses
they declare). It is a pure function of the image and the wheels it was installed from:
explicit bom-refs, a serial number derived from the digest and the timestamp from
SOURCE_DATE_EPOCH, so the same image always gives the same bytes. Each locked Python distribution
carries one hash, the sha256 of the wheel file that was installed (the lock lists every file of
that version, one per platform).
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import re
import threading
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from cyclonedx import spdx
from cyclonedx.model import ExternalReference, ExternalReferenceType, HashAlgorithm, HashType, Property, XsUri
from cyclonedx.model.bom import Bom, BomMetaData
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.model.license import DisjunctiveLicense, LicenseAcknowledgement, LicenseExpression
from cyclonedx.output.json import JsonV1Dot6
from cyclonedx.schema import SchemaVersion
from packageurl import PackageURL

from builder import __version__
from builder.config import contract
from builder.config.matrix import Target
from builder.deps.lock import LockEntry, normalize
from builder.deps.oslock import DebEntry
from builder.engine.seam import Engine
from builder.fsutil import sha256_file
from builder.records import inventory
from builder.records.artifacts import PROVENANCE_TYPE, SBOM_TYPE, WHEEL_NAME, oci_purl, third_party_trees
from builder.records.inventory import Inventory, PythonDist
from builder.records.slsa import provenance
from builder.records.store import Record

# --- licenses ------------------------------------------------------------------------------------
# What each package declares, mapped to SPDX only where the mapping is exact; anything else is
# kept as a CycloneDX license name, as written. Every license is "declared" (the package's own
# metadata), none "concluded": nothing here scans files or guesses from prose.

AnyLicense = DisjunctiveLicense | LicenseExpression
_DECLARED = LicenseAcknowledgement.DECLARED
# DEP-5 numbers the GNU licenses without "-only": GPL-2 is version 2 only, GPL-2+ "or later".
_DEP5_GNU = re.compile(r"(A?GPL|LGPL|GFDL)-(\d+)(?:\.(\d+))?(\+)?", re.I)
_DEP5_SPLIT = re.compile(r"\s*,\s*(?:and\s+|or\s+)?|\s+(?:and/or|and|or)\s+", re.I)
_LICENSE_REF = re.compile(r"LicenseRef-[A-Za-z0-9.-]+")
# Trove classifiers that name exactly one SPDX license; the rest ("Apache Software License",
# "BSD License", "GNU General Public License v2 (GPLv2)": which version, only or later?) stay names.
_CLASSIFIERS = {
    "MIT License": "MIT",
    "MIT No Attribution License (MIT-0)": "MIT-0",
    "ISC License (ISCL)": "ISC",
    "Mozilla Public License 1.1 (MPL 1.1)": "MPL-1.1",
    "Mozilla Public License 2.0 (MPL 2.0)": "MPL-2.0",
    "Boost Software License 1.0 (BSL-1.0)": "BSL-1.0",
    "The Unlicense (Unlicense)": "Unlicense",
    "Universal Permissive License (UPL)": "UPL-1.0",
    "Eclipse Public License 1.0 (EPL-1.0)": "EPL-1.0",
    "Eclipse Public License 2.0 (EPL-2.0)": "EPL-2.0",
    "European Union Public Licence 1.1 (EUPL 1.1)": "EUPL-1.1",
    "European Union Public Licence 1.2 (EUPL 1.2)": "EUPL-1.2",
    "Historical Permission Notice and Disclaimer (HPND)": "HPND",
    "zlib/libpng License": "Zlib",
    "GNU General Public License v2 or later (GPLv2+)": "GPL-2.0-or-later",
    "GNU General Public License v3 or later (GPLv3+)": "GPL-3.0-or-later",
    "GNU Lesser General Public License v3 or later (LGPLv3+)": "LGPL-3.0-or-later",
    "GNU Affero General Public License v3 or later (AGPLv3+)": "AGPL-3.0-or-later",
    "CC0 1.0 Universal (CC0 1.0) Public Domain Dedication": "CC0-1.0",
}


def dep5_spdx_id(short: str) -> str | None:
    """The SPDX id a DEP-5 short name stands for, or None: GPL-2 -> GPL-2.0-only, LGPL-2.1+ ->
    LGPL-2.1-or-later, an SPDX id in another case (BSD-3-clause -> BSD-3-Clause), a version
    without its ".0" (Apache-2 -> Apache-2.0). Not Expat, BSD or GPL without a version."""
    m = _DEP5_GNU.fullmatch(short)
    if m:
        candidate = f"{m[1].upper()}-{m[2]}.{m[3] or 0}-{'or-later' if m[4] else 'only'}"
        return candidate if spdx.is_supported_id(candidate) else None
    fixed = spdx.fixup_id(short)
    if fixed is None and re.fullmatch(r".+-\d+", short):
        fixed = spdx.fixup_id(short + ".0")
    return fixed


def deb_licenses(synopses: tuple[str, ...]) -> list[AnyLicense]:
    """One license per name in a DEP-5 file's License synopses ("GPL-2+ or Artistic, and BSD-3-clause"
    names three); which files each applies to is the copyright file's to say."""
    out: dict[tuple[str, str], DisjunctiveLicense] = {}
    for synopsis in synopses:
        for short in filter(None, (t.strip() for t in _DEP5_SPLIT.split(synopsis))):
            found = dep5_spdx_id(short)
            key = ("id", found) if found else ("name", short)
            out[key] = (
                DisjunctiveLicense(id=found, acknowledgement=_DECLARED)
                if found
                else DisjunctiveLicense(name=short, acknowledgement=_DECLARED)
            )
    return [out[k] for k in sorted(out)]


@functools.cache
def _licensing():
    from license_expression import get_spdx_licensing  # cyclonedx-python-lib's own dependency

    return get_spdx_licensing()


# license_expression builds its tokenizer's automaton lazily and not thread-safely: two builds
# running side by side (`build --jobs 2`) once crashed in it ('object' has no attribute 'children').
_LICENSING_LOCK = threading.Lock()


def spdx_expression(text: str) -> AnyLicense | None:
    """A valid SPDX license expression (LicenseRef-... allowed) as an id or an expression, in
    SPDX's case and operators ("mit or apache-2.0" -> "MIT OR Apache-2.0"); else None."""
    with _LICENSING_LOCK:
        info = _licensing().validate(text)
        rendered = None
        if info.errors and (
            info.invalid_symbols
            and all(_LICENSE_REF.fullmatch(s) for s in info.invalid_symbols)
            and all(e.startswith("Unknown license key") for e in info.errors)
        ):
            rendered = _licensing().parse(text).render()
    if not info.errors:
        value = info.normalized_expression
    elif rendered is not None:
        value = rendered
    else:
        return None
    if spdx.is_supported_id(value):
        return DisjunctiveLicense(id=value, acknowledgement=_DECLARED)
    return LicenseExpression(value, acknowledgement=_DECLARED)


def python_licenses(dist: PythonDist) -> list[AnyLicense]:
    """License-Expression (PEP 639) first; then a short License field that is an SPDX expression;
    then the License classifiers (an SPDX id where the classifier names exactly one license)."""
    if dist.license_expression:
        found = spdx_expression(dist.license_expression)
        return [found or DisjunctiveLicense(name=dist.license_expression, acknowledgement=_DECLARED)]
    if dist.license:
        found = spdx_expression(dist.license)
        if found is not None:
            return [found]
    out: dict[tuple[str, str], DisjunctiveLicense] = {}
    for classifier in dist.license_classifiers:
        parts = [p.strip() for p in classifier.split("::")]
        if len(parts) < 2 or parts[1:] == ["OSI Approved"]:
            continue
        spdx_id = _CLASSIFIERS.get(parts[-1])
        key = ("id", spdx_id) if spdx_id else ("name", parts[-1])
        out[key] = (
            DisjunctiveLicense(id=spdx_id, acknowledgement=_DECLARED)
            if spdx_id
            else DisjunctiveLicense(name=parts[-1], acknowledgement=_DECLARED)
        )
    return [out[k] for k in sorted(out)]


# --- the installed wheels --------------------------------------------------------------------------


def wheel_files(*directories: Path) -> dict[str, str]:
    """file name -> sha256 of every wheel under ``directories`` (searched recursively): the build
    context's runtime wheelhouse, the files the image's `pip install --require-hashes` installed."""
    out: dict[str, str] = {}
    for path in sorted(p for d in directories for p in Path(d).rglob("*.whl")):
        sha = sha256_file(path)
        if out.setdefault(path.name, sha) != sha:
            raise ValueError(f"{path.name}: two different files of that name under {', '.join(map(str, directories))}")
    return dict(sorted(out.items()))


def _same_version(a: str, b: str) -> bool:
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:  # pragma: no cover - packaging comes with pytest, a runtime dependency
        return a == b
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def installed_wheel(dist: PythonDist, wheels: Mapping[str, str]) -> tuple[str, str] | None:
    """(file name, sha256) of the wheel ``dist`` was installed from: the one with its name and
    version (if several, the one whose tags are the Tag lines of the dist-info WHEEL file in the
    image). None when no file has its name and version; ValueError when the image cannot tell."""
    found = []
    for filename, sha in sorted(wheels.items()):
        m = WHEEL_NAME.fullmatch(filename)
        if m and normalize(m["name"]) == normalize(dist.name) and _same_version(m["version"], dist.version):
            tags = {"-".join(t) for t in itertools.product(*(m[k].split(".") for k in ("py", "abi", "plat")))}
            found.append((filename, sha, tags))
    if len(found) > 1:
        found = [f for f in found if f[2] == set(dist.wheel_tags)]
        if len(found) != 1:
            raise ValueError(
                f"{dist.name} {dist.version}: {len(found) or 'no'} wheel(s) of the wheelhouse carry "
                f"the tags the image records ({', '.join(dist.wheel_tags) or 'none'})"
            )
    return (found[0][0], found[0][1]) if found else None


# --- components ----------------------------------------------------------------------------------


def deb_files(directory: Path) -> dict[str, str]:
    """file name -> sha256 of every .deb the build context handed the OS stage (debs/)."""
    return {p.name: sha256_file(p) for p in sorted(Path(directory).glob("*.deb"))}


def _os_lock_facts(entry: DebEntry, files: Mapping[str, str] | None) -> tuple[list[HashType], list[Property]]:
    """The sha256 of the .deb that was unpacked (the context's file, which must be the lock's)."""
    sha = entry.sha256 if files is None else files.get(entry.filename)
    if sha != entry.sha256:
        raise ValueError(f"{entry.filename}: the unpacked .deb's sha256 {str(sha)[:16]} is not the OS lock's")
    return (
        [HashType(alg=HashAlgorithm.SHA_256, content=sha)],
        [
            Property(name="k3:origin", value=f"{contract.OS_LOCK_NAME} (unpacked into the OS layer)"),
            Property(name="k3:deb-url", value=entry.url),
        ],
    )


def _deb_components(
    inv: Inventory, os_lock: Sequence[DebEntry] = (), debs: Mapping[str, str] | None = None
) -> list[Component]:
    out = []
    distro = f"{inv.distro_id}-{inv.distro_version}"
    locked = {(e.name, e.version, e.arch): e for e in os_lock}
    for deb in inv.debs:
        qualifiers = {"arch": deb.arch, "distro": distro}
        if deb.source:  # syft's form: the source package, @its version when dpkg names one (binNMU)
            qualifiers["upstream"] = f"{deb.source}@{deb.source_version}" if deb.source_version else deb.source
        purl = PackageURL(
            type="deb", namespace=inv.distro_id, name=deb.name, version=deb.version, qualifiers=qualifiers
        )
        entry = locked.pop((deb.name, deb.version, deb.arch), None)
        hashes, props = _os_lock_facts(entry, debs) if entry else ([], [])
        out.append(
            Component(
                type=ComponentType.LIBRARY,
                name=deb.name,
                version=deb.version,
                hashes=hashes,
                properties=props,
                purl=purl,
                bom_ref=purl.to_string(),
                licenses=deb_licenses(deb.licenses),
            )
        )
    if locked:
        raise ValueError(
            f"in the OS lock but not in the image's dpkg records: {', '.join(e.filename for e in locked.values())}"
        )
    return out


def _python_components(inv: Inventory, lock: list[LockEntry], wheels: Mapping[str, str] | None) -> list[Component]:
    """Each distribution with its declared license and, for a locked one, the sha256 of the wheel
    file that was installed (``wheels``: the build context's wheelhouse). Without ``wheels`` the
    lock's hashes of every file of that version, as before (until the caller passes them)."""
    out = []
    locked = {normalize(e.name): e for e in lock}
    for dist in inv.python:
        name, version = dist.name, dist.version
        entry = locked.get(normalize(name))
        props = [] if entry else [Property(name="k3:origin", value="built from the pinned source")]
        hashes = []
        if entry and wheels is None:
            hashes = [HashType(alg=HashAlgorithm.SHA_256, content=h) for h in entry.hashes]
        elif entry and wheels is not None:
            wheel = installed_wheel(dist, wheels)
            if wheel is None:
                raise ValueError(
                    f"{name} {version} is in the lock but no wheel of the wheelhouse has that name and version"
                )
            if wheel[1] not in entry.hashes:
                raise ValueError(f"{wheel[0]}: sha256 {wheel[1][:16]} is not one of the lock's hashes for {name}")
            hashes = [HashType(alg=HashAlgorithm.SHA_256, content=wheel[1])]
            props.append(Property(name="k3:wheel", value=wheel[0]))
        purl = PackageURL(type="pypi", name=normalize(name), version=version)
        out.append(
            Component(
                type=ComponentType.LIBRARY,
                name=name,
                version=version,
                purl=purl,
                bom_ref=purl.to_string(),
                hashes=hashes,
                properties=props,
                licenses=python_licenses(dist),
            )
        )
    return out


def _matrix_license(target: Target, name: str) -> list[AnyLicense]:
    """The license the matrix declares for a third-party tree (not its submodules: the matrix says
    nothing about them), as an SPDX expression, else as a name."""
    spec = target.source.third_party.get(name)
    if spec is None or not spec.license:
        return []
    return [spdx_expression(spec.license) or DisjunctiveLicense(name=spec.license, acknowledgement=_DECLARED)]


def _input_components(target: Target, record: Record) -> list[Component]:
    """The source at its commit, every third-party tree compiled into it, both bases by digest."""
    src = target.source
    src_purl = PackageURL(
        type="generic", name=src.package, version=src.commit, qualifiers={"vcs_url": f"git+{src.url}@{src.commit}"}
    )
    out = [
        Component(
            type=ComponentType.APPLICATION,
            name=f"{src.package}-source",
            version=src.commit,
            purl=src_purl,
            bom_ref="source",
            external_references=[ExternalReference(type=ExternalReferenceType.VCS, url=XsUri(src.url))],
            properties=[Property(name="k3:branch", value=src.branch), Property(name="k3:version", value=src.version)],
        )
    ]
    for ref, name, url, commit in third_party_trees(record):
        purl = PackageURL(
            type="generic", name=name.replace("/", "-"), version=commit, qualifiers={"vcs_url": f"git+{url}@{commit}"}
        )
        out.append(
            Component(
                type=ComponentType.LIBRARY,
                name=name,
                version=commit,
                purl=purl,
                bom_ref=ref,
                licenses=_matrix_license(target, name),
                external_references=[ExternalReference(type=ExternalReferenceType.VCS, url=XsUri(url))],
                properties=[
                    Property(
                        name="k3:origin",
                        value="compiled into the source's extensions (build context, "
                        "fetched on the host, network off while compiling)",
                    )
                ],
            )
        )
    for role, base in (("build", target.bases.build), ("runtime", target.bases.runtime)):
        out.append(
            Component(
                type=ComponentType.CONTAINER,
                name=base.name,
                version=base.digest,
                purl=oci_purl(base.display_name, base.digest),
                bom_ref=f"base:{role}",
                properties=[Property(name="k3:base-role", value=role)],
            )
        )
    return out


def sbom(
    target: Target,
    record: Record,
    inv: Inventory,
    lock: list[LockEntry],
    wheels: Mapping[str, str] | None = None,
    os_lock: Sequence[DebEntry] = (),
    debs: Mapping[str, str] | None = None,
) -> str:
    """The SBOM as CycloneDX 1.6 JSON text (`validate_sbom` checks it). ``wheels``: file name ->
    sha256 of the wheels the image was installed from (`wheel_files` of the context's wheelhouse)."""
    image_name = record.image.split("@")[0]
    image = Component(
        type=ComponentType.CONTAINER,
        name=image_name,
        version=record.digest,
        bom_ref="image",
        purl=oci_purl(f"{image_name}:{target.image.tag}", record.digest),
        properties=[
            Property(name=target.labels.target, value=target.name),
            Property(name=target.labels.expires, value=target.expires.isoformat()),
            Property(name=target.labels.owner, value=target.owner),
        ],
    )
    created = dt.datetime.fromtimestamp(record.source_date_epoch, dt.timezone.utc)
    bom = Bom(
        serial_number=uuid.uuid5(uuid.NAMESPACE_URL, record.image),
        metadata=BomMetaData(component=image, timestamp=created),
    )
    bom.metadata.tools.components.add(
        Component(type=ComponentType.APPLICATION, name="k3-cu129-builder", version=__version__, bom_ref="tool")
    )
    components = (
        _deb_components(inv, os_lock, debs) + _python_components(inv, lock, wheels) + _input_components(target, record)
    )
    for c in components:
        bom.components.add(c)
    bom.register_dependency(image, components)
    # Not schema-validated here: jsonschema's format checkers cost over a second to import (they
    # build ~40 IRI grammars) on every build. `verify` validates it (offline, the auditor's path
    # and CI's step after each build) and so do the tests.
    return JsonV1Dot6(bom).output_as_string(indent=2) + "\n"


def publish(
    engine: Engine,
    target: Target,
    record: Record,
    lock: list[LockEntry],
    build_args: dict[str, str],
    started: str,
    wheels: Mapping[str, str] | None = None,
    *,
    build_wheels: Mapping[str, str] | None = None,
    root: Path | None = None,
    signer=None,
    os_lock: Sequence[DebEntry] = (),
    debs: Mapping[str, str] | None = None,
) -> tuple[str, str]:
    """Make the SBOM (from the image's own inventory; ``wheels`` as for `sbom`) and the provenance
    (a DSSE envelope, signed with ``signer`` when there is one: builder/records/provsign.py), and attach
    both to the image in the registry. Returns their texts; the caller writes them with the record."""
    from builder.records import provsign

    sbom_text = sbom(target, record, inventory.read(engine, record.image), lock, wheels, os_lock, debs)
    statement = provenance(
        target,
        record,
        build_args,
        started,
        root=root,
        wheels=wheels,
        build_wheels=build_wheels,
        sbom_text=sbom_text,
        os_lock=os_lock,
    )
    prov_text = provsign.envelope(statement, signer)
    annotations = {contract.OCI_CREATED: contract.created_iso(record.source_date_epoch)}
    name = record.image.split("@")[0]
    engine.registry.attach(name, record.digest, SBOM_TYPE, sbom_text.encode(), annotations)
    engine.registry.attach(name, record.digest, PROVENANCE_TYPE, prov_text.encode(), annotations)
    return sbom_text, prov_text


def validate_sbom(text: str) -> None:
    # Imported here: jsonschema's format checkers take most of a second to import, and the
    # "up to date" path must stay fast.
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    if error is not None:
        raise ValueError(f"SBOM does not validate against CycloneDX 1.6: {error}")

"""The audit trail of one image: a CycloneDX 1.6 SBOM and an in-toto SLSA v1 provenance.

Both are built here from what the pipeline already knows (matrix target, record, locks) plus an
inventory read out of the image itself (dpkg status, os-release, Python distributions). The SBOM
is a pure function of the image: explicit bom-refs, a serial number derived from the digest and
the timestamp from SOURCE_DATE_EPOCH, so the same image always gives the same bytes. The
provenance describes one build (its id and times), so it changes with every build.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid

from cyclonedx.model import ExternalReference, ExternalReferenceType, HashAlgorithm, HashType, Property, XsUri
from cyclonedx.model.bom import Bom, BomMetaData
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.output.json import JsonV1Dot6
from cyclonedx.schema import SchemaVersion
from packageurl import PackageURL

from builder import __version__, contract, inventory
from builder.engine import Engine
from builder.inventory import Inventory
from builder.lock import LockEntry, normalize
from builder.matrix import Target
from builder.records import Record

SBOM_TYPE = "application/vnd.cyclonedx+json"
PROVENANCE_TYPE = "application/vnd.in-toto+json"
BUILD_TYPE = "https://k3-cu129.example/buildtypes/matrix-dockerfile/v1"
BUILDER_ID = "https://k3-cu129.example/builder"

def _oci_purl(name: str, digest: str) -> PackageURL:
    return PackageURL(type="oci", name=name.rsplit("/", 1)[-1], version=digest, qualifiers={"repository_url": name})


def _deb_components(inv: Inventory) -> list[Component]:
    out = []
    distro = f"{inv.distro_id}-{inv.distro_version}"
    for deb in inv.debs:
        purl = PackageURL(type="deb", namespace=inv.distro_id, name=deb.name, version=deb.version,
                          qualifiers={"arch": deb.arch, "distro": distro})
        out.append(Component(type=ComponentType.LIBRARY, name=deb.name, version=deb.version,
                             purl=purl, bom_ref=purl.to_string()))
    return out


def _python_components(inv: Inventory, lock: list[LockEntry]) -> list[Component]:
    out = []
    locked = {normalize(e.name): e for e in lock}
    for name, version in inv.dists:
        entry = locked.get(normalize(name))
        hashes = [HashType(alg=HashAlgorithm.SHA_256, content=h) for h in entry.hashes] if entry else []
        purl = PackageURL(type="pypi", name=normalize(name), version=version)
        props = [] if entry else [Property(name="k3:origin", value="built from the pinned source")]
        out.append(Component(type=ComponentType.LIBRARY, name=name, version=version, purl=purl,
                             bom_ref=purl.to_string(), hashes=hashes, properties=props))
    return out


def _input_components(target: Target, record: Record) -> list[Component]:
    """The source at its commit, every third-party tree compiled into it, both bases by digest."""
    src = target.source
    src_purl = PackageURL(type="generic", name=src.package, version=src.commit,
                          qualifiers={"vcs_url": f"git+{src.url}@{src.commit}"})
    out = [Component(
        type=ComponentType.APPLICATION, name=f"{src.package}-source", version=src.commit, purl=src_purl,
        bom_ref="source", external_references=[ExternalReference(type=ExternalReferenceType.VCS, url=XsUri(src.url))],
        properties=[Property(name="k3:branch", value=src.branch), Property(name="k3:version", value=src.version)],
    )]
    for ref, name, url, commit in third_party_trees(record):
        purl = PackageURL(type="generic", name=name.replace("/", "-"), version=commit,
                          qualifiers={"vcs_url": f"git+{url}@{commit}"})
        out.append(Component(
            type=ComponentType.LIBRARY, name=name, version=commit, purl=purl, bom_ref=ref,
            external_references=[ExternalReference(type=ExternalReferenceType.VCS, url=XsUri(url))],
            properties=[Property(name="k3:origin", value="compiled into the source's extensions (build context, "
                                                            "fetched on the host, network off while compiling)")]))
    for role, base in (("build", target.bases.build), ("runtime", target.bases.runtime)):
        out.append(Component(type=ComponentType.CONTAINER, name=base.name, version=base.digest,
                             purl=_oci_purl(base.name, base.digest), bom_ref=f"base:{role}",
                             properties=[Property(name="k3:base-role", value=role)]))
    return out


def sbom(target: Target, record: Record, inv: Inventory, lock: list[LockEntry]) -> str:
    """The SBOM as CycloneDX 1.6 JSON text, validated against the schema."""
    image_name = record.image.split("@")[0]
    image = Component(
        type=ComponentType.CONTAINER, name=image_name, version=record.digest, bom_ref="image",
        purl=_oci_purl(image_name, record.digest),
        properties=[Property(name=contract.LABEL_TARGET, value=target.name),
                    Property(name=contract.LABEL_EXPIRES, value=target.expires.isoformat()),
                    Property(name=contract.LABEL_OWNER, value=target.owner)],
    )
    created = dt.datetime.fromtimestamp(record.source_date_epoch, dt.timezone.utc)
    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, record.image),
              metadata=BomMetaData(component=image, timestamp=created))
    bom.metadata.tools.components.add(Component(type=ComponentType.APPLICATION, name="k3-cu129-builder",
                                                version=__version__, bom_ref="tool"))
    components = _deb_components(inv) + _python_components(inv, lock) + _input_components(target, record)
    for c in components:
        bom.components.add(c)
    bom.register_dependency(image, components)
    text = JsonV1Dot6(bom).output_as_string(indent=2) + "\n"
    validate_sbom(text)
    return text


def publish(engine: Engine, target: Target, record: Record, lock: list[LockEntry], build_args: dict[str, str],
            started: str) -> tuple[str, str]:
    """Make the SBOM (from the image's own inventory) and the provenance, and attach both to the
    image in the registry. Returns their texts; the caller writes them with the record."""
    sbom_text = sbom(target, record, inventory.read(engine, record.image), lock)
    prov_text = provenance(target, record, build_args, started)
    annotations = {contract.OCI_CREATED: contract.created_iso(record.source_date_epoch)}
    name = record.image.split("@")[0]
    engine.registry.attach(name, record.digest, SBOM_TYPE, sbom_text.encode(), annotations)
    engine.registry.attach(name, record.digest, PROVENANCE_TYPE, prov_text.encode(), annotations)
    return sbom_text, prov_text


def third_party_trees(record: Record) -> list[tuple[str, str, str, str]]:
    """(bom-ref, name, url, commit) of every third-party tree and submodule the compile used."""
    out = []
    for name, tp in sorted((record.source.get("third_party") or {}).items()):
        out.append((f"third_party:{name}", name, tp["url"], tp["commit"]))
        for sub in tp.get("submodules", []):
            out.append((f"third_party:{name}/{sub['path']}", f"{name}/{sub['path']}", sub["url"], sub["commit"]))
    return out


def validate_sbom(text: str) -> None:
    # Imported here: jsonschema's format checkers take most of a second to import, and the
    # "up to date" path must stay fast.
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    if error is not None:
        raise ValueError(f"SBOM does not validate against CycloneDX 1.6: {error}")


def provenance(target: Target, record: Record, build_args: dict[str, str], started: str) -> str:
    """An in-toto v1 statement with an SLSA provenance v1 predicate for one build."""
    b = record.build
    deps = [
        {"name": f"base:{role}", "uri": _oci_purl(info["name"], info["digest"]).to_string(),
         "digest": {"sha256": info["digest"].removeprefix("sha256:")}}
        for role, info in sorted(record.bases.items())
    ]
    deps.append({"name": "source", "uri": f"git+{record.source['url']}@refs/heads/{record.source['branch']}",
                 "digest": {"gitCommit": record.source["commit"]}})
    for ref, _, url, commit in third_party_trees(record):
        deps.append({"name": ref, "uri": f"git+{url}@{commit}", "digest": {"gitCommit": commit}})
    for name, path, sha in (("lock", contract.LOCK_NAME, record.lock_sha256),
                            ("build-lock", contract.BUILD_LOCK_NAME, record.build_lock_sha256)):
        deps.append({"name": name, "uri": f"{contract.LOCKS_DIR}/{target.name}/{path}", "digest": {"sha256": sha}})
    deps.append({"name": "dockerfile", "uri": f"{contract.DOCKERFILES_DIR}/{target.name}/{contract.DOCKERFILE_NAME}",
                 "digest": {"sha256": record.dockerfile_sha256}})
    statement = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": record.image.split("@")[0], "digest": {"sha256": record.digest.removeprefix("sha256:")}}],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"target": target.name, "matrix": target.model_dump(mode="json")},
                "internalParameters": {"buildArgs": dict(sorted(build_args.items())),
                                       "sourceDateEpoch": record.source_date_epoch},
                "resolvedDependencies": deps,
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID, "version": {"k3-cu129-builder": record.tool_version,
                                                          "docker-engine": b.get("engine", ""),
                                                          "buildx": b.get("buildx", ""),
                                                          "driver": b.get("driver", "")}},
                "metadata": {"invocationId": b.get("id", ""), "startedOn": started, "finishedOn": b.get("finished", "")},
            },
        },
    }
    return json.dumps(statement, indent=2, sort_keys=True) + "\n"

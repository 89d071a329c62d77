"""What a build does with a pushed image (already scanned for the build's secrets before the push:
builder/pipeline/prepush.py), in this order: the image checks, then the SBOM and provenance
attached in the registry and the record set written as one unit. Nothing is recorded unless each step before it passed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from builder import __version__, log
from builder.config import contract
from builder.config.matrix import Target
from builder.fsutil import sha256_bytes
from builder.pipeline.context import Prepared
from builder.pipeline.plan import Plan
from builder.records import store as records


def check_image(prep: Prepared, pushed: str) -> dict[str, Any] | None:
    """Before the record: image.json only names an image that passed its checks. A failing check
    fails the command; the image stays in the registry and the JUnit report beside the log.
    Returns what the GPU-code checks proved, for the record (None: the target claims no GPU code)."""
    from builder.checks import runner

    target, today = prep.target, dt.datetime.now(dt.timezone.utc).date()
    with log.step(f"{target.name}: image checks on {pushed}"):
        report = runner.check_target(
            prep.ctx.engine,
            pushed,
            target=target,
            locks=prep.ctx.locks,
            pinned=prep.pinned,
            build_date=today,
            out_dir=prep.workdir,
            wheel_records=wheel_records(prep),
            platform=prep.ctx.plan.platform,
        )
        report.raise_for_failures()
    return gpu_record(report.facts)


def wheel_records(prep: Prepared) -> dict[str, Any]:
    """Each installed wheel's RECORD digest, from the hash-checked wheelhouse in the context."""
    from builder.deps import buildcontext

    return buildcontext.wheel_records(prep.request.context / "wheelhouse" / "layers")


def gpu_record(facts: dict) -> dict[str, Any] | None:
    """image.json's ``gpu``: the gpu_code check's floor and families, the gpu_coverage table."""
    if "gpu" not in facts:
        return None
    return {**facts["gpu"], "coverage": facts.get("gpu_coverage", {})}


def record_of(
    prep: Prepared, digest: str, checked: bool, seconds: float, gpu: dict[str, Any] | None = None
) -> records.Record:
    """The record of a pushed image, its audit hashes still empty (the SBOM describes the record);
    ``gpu``: what the GPU-code checks proved (check_image)."""
    target, locks = prep.target, prep.ctx.locks
    return records.Record(
        target=target.name,
        image=f"{target.image.name}@{digest}",
        digest=digest,
        bases={
            role: {"name": getattr(target.bases, role).display_name, "digest": getattr(target.bases, role).digest}
            for role in ("build", "runtime")
        },
        source=record_source(target, prep.third_party),
        lock_sha256=locks.runtime_sha256,
        build_lock_sha256=locks.build_sha256,
        os_lock_sha256=locks.os_sha256,
        dockerfile_sha256=sha256_bytes(prep.ctx.dockerfile_text.encode()),
        source_date_epoch=prep.pinned.source_date_epoch,
        input_key=prep.ctx.input_key,
        tool_version=__version__,
        checks="passed" if checked else "skipped",
        gpu=gpu,
        wheel_records=wheel_records(prep),
        platform=prep.ctx.plan.platform,
        build={
            "id": prep.build_id,
            "finished": contract.now_iso(),
            "duration_seconds": round(seconds, 1),
            "engine": prep.info.server_version,
            "buildx": prep.info.buildx_version,
            "driver": prep.info.driver,
        },
    )


def record_source(target: Target, third: dict) -> dict:
    """The record's ``source``: the pinned commit plus every third-party tree the compile used."""
    doc: dict[str, Any] = {"url": target.source.url, "branch": target.source.branch, "commit": target.source.commit}
    if third:
        doc["third_party"] = {name: tp.to_json() for name, tp in sorted(third.items())}
    return doc


def attach_and_write(prep: Prepared, record: records.Record, signer) -> records.Record:
    """Attach the SBOM and provenance in the registry, then write the record set as one unit."""
    from builder.records import attest

    target, root, locks = prep.target, prep.ctx.plan.root, prep.ctx.locks
    with log.step(f"{target.name}: SBOM and provenance, attached to {record.image[-19:]}"):
        wheels = attest.wheel_files(prep.request.context / "wheelhouse" / "layers")  # what was installed
        build_wheels = attest.wheel_files(prep.request.context / "wheelhouse" / "build")  # what compiled it
        debs = attest.deb_files(prep.request.context / "debs") if locks.os_entries else None
        sbom_text, prov_text = attest.publish(
            prep.ctx.engine,
            target,
            record,
            list(locks.runtime_entries),
            prep.request.build_args,
            prep.started_iso,
            wheels=wheels,
            build_wheels=build_wheels,
            root=root,
            signer=signer,
            os_lock=list(locks.os_entries),
            debs=debs,
        )
    final = dataclasses.replace(record, build={**record.build, **records.audit_hashes(sbom_text, prov_text)})
    records.write_set(
        prep.ctx.plan.record_dir,
        {contract.SBOM_NAME: sbom_text, contract.PROVENANCE_NAME: prov_text, contract.RECORD_NAME: final.to_json()},
    )
    return final


def provenance_signer(plan: Plan):
    """The matrix's provenance signer (builder/records/provsign.py), or None with a warning: unsigned."""
    from builder.records import provsign

    signer = provsign.signer(plan.target.signing, plan.root)
    if signer is None:
        log.warn(
            f"    {plan.target.name}: the provenance will be UNSIGNED (no signing.key in the matrix); "
            "`build verify` reports it"
        )
    return signer

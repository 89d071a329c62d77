"""One build, one image index: a target that names platforms (builder/config/platforms.py) is built
once per platform and published as one OCI image index under its tag.

Each platform goes through the whole one-image build on its own (builder/pipeline/build.py
``_build``, with that platform's Dockerfile, locks and input key): built with ``--platform``
(emulated where the builder is another machine), scanned, pushed as ``<tag>-<os>-<arch>``,
checked, and recorded in ``locks/<target>/<os>-<arch>/``. A platform whose inputs are unchanged
and whose manifest the registry still serves is up to date on its own, so an arm64-only change
leaves the amd64 manifest (and its digest) alone. Only once every platform is recorded is the
index pushed under the target's tag, its provenance (subjects: the index and every manifest)
signed and attached, and ``locks/<target>/image.json`` (builder/records/index.py) written with it
as one record set.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Protocol

from builder import log
from builder.config import contract
from builder.config.options import BuildOptions
from builder.config.targetplatform import index_manifests
from builder.engine.seam import Engine
from builder.errors import ConfigError, RecordError
from builder.fsutil import sha256_file
from builder.pipeline.context import emulated_refused
from builder.pipeline.outcome import BuildOutcome
from builder.pipeline.plan import Offline, Plan
from builder.records import artifacts, index
from builder.records import store as records


@dataclass(frozen=True)
class IndexResult:
    record: index.IndexRecord
    changed: bool  # a new index digest (or a new record of it)
    up_to_date: bool  # every platform up to date and the index as recorded, served under the tag
    platforms: list[BuildOutcome]  # each platform's, in the matrix's order
    seconds: float


class BuildOne(Protocol):
    """One platform's whole one-image build (pipeline.build._build, which imports this module).
    ``offline``: its offline checks' results when they already ran for this build (run once)."""

    def __call__(
        self, plan: Plan, engine: Engine, options: BuildOptions, *, offline: Offline | None = None
    ) -> BuildOutcome: ...


def build_index(plan: Plan, engine: Engine, options: BuildOptions, build_one: BuildOne) -> IndexResult:
    """Every platform built (or up to date) with ``build_one`` (pipeline.build._build), then the index."""
    started, target = time.monotonic(), plan.target
    record_path = plan.record_dir / contract.RECORD_NAME
    previous = _previous(plan)  # a damaged index record stops the build before anything runs
    chosen = plan.chosen(options.platforms)  # --platform's (each one the target names), else all
    offline = _emulation_refused(plan, engine, options, chosen)  # each platform's offline checks, if run
    # A platform not built now joins the index only as recorded, unchanged and served (checked
    # before anything is built): never an edited, stale or missing manifest under the tag.
    kept = {str(pp.platform): _recorded(pp, engine) for pp in plan.platform_plans() if pp not in chosen}
    outcomes: list[BuildOutcome] = []
    for pp, checked in zip(chosen, offline, strict=True):
        log.info(f"{target.name}: platform {pp.platform} ({len(outcomes) + 1} of {len(chosen)})")
        outcomes.append(build_one(pp, engine, options, offline=checked))
    built = {str(pp.platform): o.digest for pp, o in zip(chosen, outcomes, strict=True)}
    manifests = {p: built.get(p) or kept[p] for p in target.platform_names()}  # every platform, always
    with log.step(f"{target.name}: image index of {', '.join(manifests)} under {target.image.tagged}"):
        if previous is not None and _index_current(plan, engine, previous, manifests):
            log.info(f"    up to date: {previous.image} (the same manifests, served under the tag)")
            result = IndexResult(previous, False, all(o.up_to_date for o in outcomes), outcomes, 0.0)
        else:
            record = _publish(plan, engine, manifests)
            changed = previous is None or previous.digest != record.digest
            result = IndexResult(record, changed, False, outcomes, 0.0)
    log.info(f"    {result.record.image} recorded in {record_path}")
    return dataclasses.replace(result, seconds=time.monotonic() - started)


def _emulation_refused(plan: Plan, engine: Engine, options: BuildOptions, chosen: list[Plan]) -> list[Offline | None]:
    """Every chosen platform's emulated-compile refusal (context.emulated_refused) before any is
    built: an arm64 compile refused after an hour of amd64 compile wastes the hour. One platform is
    refused by its own build; the offline checks still come before the engine is asked. Returns
    each chosen platform's offline checks (None where they did not run here), which its build then
    uses rather than running them again: one read of the Dockerfile and locks per build."""
    if options.allow_emulated or len(chosen) < 2:
        return [None] * len(chosen)
    from builder.pipeline.plan import offline_checks

    checked: list[Offline | None] = [offline_checks(pp) for pp in chosen]
    native = engine.preflight(options.builder).native
    for pp in chosen:
        emulated_refused(plan.target.name, pp.platform, native, False)
    return checked


def _recorded(pp: Plan, engine: Engine) -> str:
    """The manifest a platform --platform leaves out last recorded, if it still stands: its record
    set holds, its inputs are the recorded ones (the input key "up to date" compares) and
    <tag>-<os>-<arch> still resolves to it. Anything else is refused: the index would name an
    edited, stale or missing manifest."""
    from builder.pipeline.plan import input_key, offline_checks

    name, platform, path = pp.target.name, pp.platform, pp.record_dir / contract.RECORD_NAME
    one = records.read(path)  # a damaged record: RecordError
    if one is None:
        raise RecordError(
            f"{name} {platform}: no record in {pp.record_dir} (the index must name every platform); "
            f"build all platforms first (drop --platform)"
        )
    problems = records.set_problems(pp.root, name, one, pp.record_dir)
    if problems:
        raise RecordError(
            f"{path}: the record set does not hold: {'; '.join(problems)}; not put in the index; "
            f"`build verify --target {name}` explains; restore the files from git"
        )
    if one.input_key != input_key(pp, *offline_checks(pp)):
        raise ConfigError(
            f"{name} {platform}: its inputs changed since {one.image} was recorded, so it is not up to "
            f"date; build it too (--platform {platform}), or drop --platform"
        )
    served = engine.registry.resolve_digest(f"{pp.target.image.name}:{pp.tag}")
    if served != one.digest:
        raise RecordError(
            f"{name} {platform}: {pp.target.image.name}:{pp.tag} resolves to {served or 'nothing'}, "
            f"not the recorded {one.digest}; build it too (--platform {platform}), or drop --platform"
        )
    return one.digest


def _previous(plan: Plan) -> index.IndexRecord | None:
    """The committed index record; a one-image record there (from before the target named
    platforms) is no index: replaced, said so. A damaged one is refused (exit 2)."""
    path = plan.record_dir / contract.RECORD_NAME
    if index.kind_of(path) == "image":
        records.read(path)  # damaged: refused like any record; a readable one is replaced below
        log.info(f"    {path}: a one-image record; the index record replaces it (git keeps the old one)")
        return None
    previous = index.read(path)
    if previous is not None:
        problems = _edited(plan, previous)
        if problems:
            raise RecordError(
                f"{path}: the index record set does not hold: {'; '.join(problems)}; "
                f"`build verify --target {plan.target.name}` explains; restore the files from git"
            )
    return previous


def _edited(plan: Plan, previous: index.IndexRecord) -> list[str]:
    """What of the index record set was edited (an edited record is refused, never rebuilt over).

    Its provenance must be the one it names, and the record must say what that provenance says
    (the index digest and image, the tag, the platforms and each manifest). A platform whose record
    differs from what the index names is tolerated only when stale, not edited: a build that failed
    on another platform recorded it again since, so its own record set holds and its provenance is
    not the one the index provenance names. (No file times: a git checkout sets them.)"""
    problems = [p for p in index.set_problems(plan.root, previous) if p.startswith(index.PROVENANCE_NAME)]
    if problems:
        return problems
    problems = index.provenance_disagrees(plan.root, previous)
    base = plan.record_dir
    named = index.provenance_deps(plan.root, previous)
    for p, entry in previous.platforms.items():
        own = f"{contract.platform_slug(p)}/{contract.RECORD_NAME}"
        if entry.get("record") != own:
            problems.append(f"{p}: names {entry.get('record')!r}, not {own}")
            continue
        one_path = base / entry["record"]
        if one_path.is_file() and sha256_file(one_path) == entry["record_sha256"]:
            continue  # as the index names it (a digest mismatch is the provenance check's above)
        if not one_path.is_file():  # (its path is that platform's record directory: checked above)
            problems.append(f"{p}: {entry['record']} is missing or not that platform's record")
            continue
        one = records.read(one_path)
        if one is None or records.set_problems(plan.root, plan.target.name, one, one_path.parent):
            continue  # the platform's own record set is edited: its build refuses it, with what does not hold
        if sha256_file(one_path.parent / contract.PROVENANCE_NAME) == named.get(p):  # the same build's, edited
            problems.append(f"{p}: {entry['record']} differs from what the index record names (record_sha256)")
    return problems


def _index_current(plan: Plan, engine: Engine, previous: index.IndexRecord, manifests: dict[str, str]) -> bool:
    """The recorded index names these manifests, the tag points at it and its provenance is attached."""
    if previous.manifests() != manifests or previous.tag != plan.target.image.tag:
        return False
    name = plan.target.image.name
    if engine.registry.resolve_digest(plan.target.image.tagged) != previous.digest:
        return False
    if any(
        previous.platforms[p] != index.platform_entry(plan.root, plan.target.name, p, d) for p, d in manifests.items()
    ):
        return False  # a platform's record was written again (same digest): the index record names its bytes
    attached = engine.registry.referrers(name, previous.digest).get(artifacts.PROVENANCE_TYPE)
    return attached == (plan.record_dir / index.PROVENANCE_NAME).read_bytes()


def _publish(plan: Plan, engine: Engine, manifests: dict[str, str]) -> index.IndexRecord:
    """Push the index under the tag, sign and attach its provenance, write its record set."""
    from builder.pipeline import publish
    from builder.records import provsign

    target, name = plan.target, plan.target.image.name
    digest = engine.registry.push_index(name, target.image.tag, manifests)
    log.info(f"    pushed {name}@{digest} under {target.image.tagged}")
    record = index.IndexRecord(
        target=target.name,
        image=f"{name}@{digest}",
        digest=digest,
        tag=target.image.tag,
        platforms={p: index.platform_entry(plan.root, target.name, p, d) for p, d in manifests.items()},
        build={},
    )
    prov_text = provsign.envelope(index.statement(target, plan.root, record), publish.provenance_signer(plan))
    first = records.read(plan.platform_plans()[0].record_dir / contract.RECORD_NAME)
    epoch = first.source_date_epoch if first else 0
    annotations = {contract.OCI_CREATED: contract.created_iso(epoch)}
    engine.registry.attach(name, digest, artifacts.PROVENANCE_TYPE, prov_text.encode(), annotations)
    final = dataclasses.replace(record, build={"provenance_sha256": index.provenance_sha256(prov_text)})
    records.write_set(plan.record_dir, {index.PROVENANCE_NAME: prov_text, contract.RECORD_NAME: final.to_json()})
    # An index's record set has no SBOM (each platform's is its own): one here is a one-image record's.
    (plan.record_dir / contract.SBOM_NAME).unlink(missing_ok=True)
    return final


def platform_refs(plan: Plan, engine: Engine, image: str | None, only: str | None = None) -> dict[str, str]:
    """platform -> the image `build test` checks on it: each platform's recorded manifest, or, with
    ``image`` (an image index in a registry), the manifest it names for that platform. ``only``
    (`--platform`): that platform alone, and ``image`` may then be one image (a plain manifest) of
    it. A one-platform image without ``only`` is refused (exit 2), naming the option."""
    wanted = [only] if only else list(plan.target.platform_names())
    if image is None:
        refs = {}
        for pp in plan.chosen(tuple(wanted)):
            record = records.read(pp.record_dir / contract.RECORD_NAME)
            if record is None:
                raise RecordError(
                    f"{plan.target.name} {pp.platform}: no recorded image in {pp.record_dir}; build first"
                )
            refs[str(pp.platform)] = record.image
        return refs
    from builder.engine.registry import split_reference

    name, reference = split_reference(image)
    served = engine.registry.raw_manifest(name, reference)
    if served is not None and "manifests" not in served.doc:
        return {_one_image_platform(plan, engine, image, f"{name}@{served.digest}", only): f"{name}@{served.digest}"}
    named = index_manifests(served.doc) if served else {}
    missing = [p for p in wanted if not named.get(p)]  # no entry, or no digest in it
    if missing:
        raise ConfigError(
            f"--image {image}: not an image index naming {', '.join(missing)} (target {plan.target.name} "
            f"is built for {', '.join(plan.target.platform_names())})"
        )
    return {p: f"{name}@{named[p]}" for p in wanted}


def _one_image_platform(plan: Plan, engine: Engine, image: str, pinned: str, only: str | None) -> str:
    """The platform of a one-platform image (its config's os/architecture): ``only``, else refused."""
    config = engine.registry.image_config(pinned) or {}
    if not (isinstance(config.get("os"), str) and isinstance(config.get("architecture"), str)):
        raise ConfigError(
            f"--image {image}: one image (not an index), but its config names no platform (os/architecture)"
        )
    own = f"{config['os']}/{config['architecture']}"
    names = ", ".join(plan.target.platform_names())
    if only is None:
        raise ConfigError(
            f"--image {image}: one {own} image, not an image index naming {names} (target "
            f"{plan.target.name}); to check it as the target's {own} image, pass --platform {own}"
        )
    if own != only:
        raise ConfigError(f"--image {image}: a {own} image, not {only}: --platform names the image's own platform")
    return only

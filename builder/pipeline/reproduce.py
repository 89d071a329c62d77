"""`build reproduce`: rebuild the recorded image from the recorded inputs with no cache, and
compare the two platform manifests; the same digest, or every difference (builder/pipeline/imagediff.py)
in a report beside the rebuild's log.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from builder import log
from builder.config import contract
from builder.config.inputsource import UPSTREAM, InputSource
from builder.config.options import BuildOptions
from builder.engine.seam import Engine
from builder.errors import NotReproduced, RecordError
from builder.fsutil import cache_scope, sha256_file
from builder.pipeline.context import BuildContext, prepare, run_engine
from builder.pipeline.plan import Plan
from builder.records import store as records


@dataclass
class Reproduction:
    target: str
    recorded: str
    rebuilt: str
    differences: list[str]
    report: Path | None

    @property
    def reproduced(self) -> bool:
        return self.recorded == self.rebuilt

    def to_json(self) -> dict:
        return {
            "target": self.target,
            "recorded": self.recorded,
            "rebuilt": self.rebuilt,
            "reproduced": self.reproduced,
            "differences": self.differences,
            "report": str(self.report) if self.report else None,
        }

    def raise_for_difference(self) -> None:
        if not self.reproduced:
            raise NotReproduced(
                f"{self.target}: rebuild gave {self.rebuilt}, image.json records {self.recorded}; "
                f"differences in {self.report}"
            )


def _recorded_inputs(plan: Plan) -> records.Record:
    """The record to reproduce; refuses when the files say something else now."""
    target, path = plan.target, plan.record_dir / contract.RECORD_NAME  # a platform's own, of an index
    record = records.read(path)
    if record is None:
        raise RecordError(f"{path}: no record to reproduce; build first")
    for path, want in (
        (plan.dockerfile, record.dockerfile_sha256),
        (plan.lock_paths.runtime, record.lock_sha256),
        (plan.lock_paths.build, record.build_lock_sha256),
        *([(plan.lock_paths.os, record.os_lock_sha256)] if plan.lock_paths.os else []),
    ):
        if not path.exists() or sha256_file(path) != want:
            raise RecordError(
                f"{path}: differs from what image.json recorded; check out the commit that "
                "recorded the build (or run `build verify`)"
            )
    if record.source.get("commit") != target.source.commit:
        raise RecordError(
            f"{target.name}: the matrix pins another commit than image.json; check out the recorded commit"
        )
    return record


def reproduce_all(
    plan: Plan, engine: Engine, options: BuildOptions, inputs: InputSource = UPSTREAM
) -> list[Reproduction]:
    """A target built into an image index is reproduced platform by platform, each from its own
    record set (locks/<target>/<os>-<arch>/) with --platform; locks/<target>/image.json is the
    index's record and names no inputs. ``inputs``: upstream, or the escrow's files (their own
    cache, sealed: nothing downloaded) and its registry for the bases."""
    chosen = plan.chosen(options.platforms)  # a --platform the target does not name: refused (exit 2)
    plans = chosen if plan.indexed else [plan]  # --platform: only those
    scope = cache_scope(inputs.cache, sealed=True) if inputs.cache else contextlib.nullcontext()
    with scope:
        return [reproduce(pp, engine, options, inputs) for pp in plans]


def reproduce(plan: Plan, engine: Engine, options: BuildOptions, inputs: InputSource = UPSTREAM) -> Reproduction:
    """Rebuild the recorded image with no cache and compare: same digest, or what differs."""
    target = plan.target
    record = _recorded_inputs(plan)
    # <tag>-reproduce, or <tag>-<os>-<arch>-reproduce for one platform of an index
    ctx = BuildContext.checked(plan, engine, options, tag=f"{plan.tag}-reproduce", no_cache=True, inputs=inputs)
    prep = prepare(ctx)
    result = run_engine(prep)
    recorded = engine.registry.platform_digest(target.image.name, record.digest)
    rebuilt = engine.registry.platform_digest(target.image.name, result.digest)
    if rebuilt == recorded:
        log.info(f"    reproduced: {recorded} (recorded {record.build.get('finished')}, rebuilt now)")
        return Reproduction(_name(plan), recorded, rebuilt, [], None)
    from builder.pipeline import imagediff

    with log.step(f"{target.name}: compare {recorded[:19]} with the rebuild {rebuilt[:19]}"):
        lines = imagediff.diff_images(engine, target.image.name, recorded, rebuilt)
    report = prep.workdir / "reproduce-diff.txt"
    report.write_text("\n".join(lines) + "\n")
    for line in lines:
        log.info(f"    {line}")
    return Reproduction(_name(plan), recorded, rebuilt, lines, report)


def _name(plan: Plan) -> str:
    return f"{plan.target.name} {plan.platform}" if plan.platform else plan.target.name

"""A `build vet` run, beside the checks it runs (builder/checks/vet.py): which target and which
image (the target's `reference` by default), the image pinned by digest, the pinned source fetched
when it can be, and the scorecard. `build vet` and `build compare --vet` call it with typed, frozen
parameters; the commands only parse and print.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from secrets import token_hex

from builder import log
from builder.checks.vet import Scorecard, vet
from builder.config import contract
from builder.config.imageref import names_registry_host
from builder.config.matrix import Matrix, Target
from builder.engine.seam import Engine, image_config
from builder.errors import ConfigError, Unreachable
from builder.source import pinned as source


@dataclass(frozen=True)
class VetParams:
    """How a vet runs: without the pinned source (``--no-source``), and where the image's Python
    environment lives when its interpreter's ``sys.prefix`` would not say (``--prefix``)."""

    no_source: bool = False
    prefix: str | None = None


def pick_target(matrix: Matrix, names: list[str], image: str | None) -> Target:
    """--target; else the target whose reference is --image; else the matrix's only target."""
    if len(names) > 1:
        raise ConfigError(f"vet: one --target at a time (given {', '.join(names)})")
    if names:
        return matrix.target(names[0])
    if image:
        for t in matrix.targets.values():
            if t.reference and t.reference.image.digest in image:
                return t
    if len(matrix.targets) == 1:
        return next(iter(matrix.targets.values()))
    raise ConfigError(f"vet: pass --target (the matrix has {len(matrix.targets)} targets)")


def default_image(target: Target, image: str | None) -> str:
    """``image``, else the target's `reference` (upstream's image); bad input when neither is set."""
    if image:
        return image
    if target.reference is None:
        raise ConfigError(f"vet: targets.{target.name}.reference is not set; pass --image")
    return target.reference.image.ref


def pin(engine: Engine, ref: str) -> str:
    """``ref`` by digest: as given when it carries one, else the digest its registry serves, else
    the local image's ID. A reference that is malformed or not served is bad input (exit 2), one
    whose registry cannot be reached is exit 3."""
    config = image_config(engine, ref)  # malformed or not served: exit 2; out of reach: exit 3
    if "@sha256:" in ref:
        return ref
    if names_registry_host(ref):
        digest = engine.registry.resolve_digest(ref)
        if digest is None:
            raise ConfigError(f"--image {ref}: the registry does not serve it")
        return f"{ref}@{digest}"
    return config.id or ref


def vet_one(engine: Engine, matrix_root: Path, target: Target, image: str, params: VetParams) -> Scorecard:
    """Vet ``image`` for ``target``: pin it, fetch the source (unless ``no_source``), run, score.
    The scorecard's files land under the matrix's artifacts/, in a directory of this run's own."""
    pinned_ref = pin(engine, image)
    engine.preflight()
    src, why = None, "--no-source"
    if not params.no_source:
        try:
            with log.step(f"{target.name}: fetch source {target.source.branch} @ {target.source.commit[:12]}"):
                src = source.fetch(target.source)
        except Unreachable as exc:  # the checks that need it say so; the rest still run
            why = exc.message
            log.warn(f"vet: the pinned source is out of reach, compiled modules from the matrix only: {why}")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_dir = contract.artifacts_path(matrix_root, target.name, f"vet-{stamp}-{token_hex(3)}")
    with log.step(f"{target.name}: vet {pinned_ref}"):
        return vet(
            engine,
            image,
            pinned_ref,
            target,
            source=src,
            out_dir=out_dir,
            prefix=params.prefix,
            why_no_source=why,
        )

"""What the image really carries, for doctor: its platforms (the config's os/architecture, or every
platform of an index), its derived driver floor and GPU families (labels the gpu_code check proves,
builder/config/gpu.py), and, when its build record has one, the per-kernel coverage table.

Whether a GPU can run the image is one rule, ``GpuArch.runs_on`` (builder/config/gpu.py), the one
the gpu_code check applies: with the build record, each required kernel (an extension of the
record's coverage table) is judged against the GPU; with labels alone, the gpu-families words
(variants kept: "9.0a" runs on 9.0 only, "10.3f" on its family, "8.0" on 8.x from 8.0).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from builder.config import contract
from builder.config.gpu import PTX, SASS, CoverageCell, GpuArch, Version, cc_version
from builder.config.imageref import names_registry_host
from builder.errors import BuilderError

if TYPE_CHECKING:
    from builder.engine.seam import Engine

# Where image.json keeps the gpu_coverage table (contract.RECORD_GPU, written by the pipeline's
# publish.gpu_record): extension -> compute capability -> what serves it (CoverageCell.show).
RECORD_COVERAGE_KEYS = ((contract.RECORD_GPU, "coverage"),)
# How the image serves one GPU: every required kernel by SASS, some only by PTX the driver
# JIT-compiles, some kernels without code (partial), none, or unknown (the GPU's capability is not).
SERVED, JIT, PARTIAL, NONE, UNKNOWN = "sass", "ptx-jit-only", "partial", "none", "unknown"
_CC = re.compile(r"[1-9][0-9]?\.[0-9]")


@dataclass(frozen=True)
class Coverage:
    """How the image serves one GPU: a status (above; None when the image declares nothing), the
    required kernels without code for it, and whether kernels were judged (a build record) or only
    the gpu-families label."""

    status: str | None
    missing: tuple[str, ...] = ()
    per_kernel: bool = False


@dataclass(frozen=True)
class ImageFacts:
    platforms: tuple[str, ...] = ()  # "linux/amd64", ...; () when unknown
    floor: str | None = None  # the derived driver floor (label), e.g. "575.51.03"
    families: tuple[str, ...] | None = None  # the gpu-families label's words, variants kept; None: no label
    kernels: dict[str, dict[str, CoverageCell]] = field(default_factory=dict)  # the record's coverage
    notes: tuple[str, ...] = ()  # what could not be read, and why

    @property
    def declared(self) -> bool:
        return self.families is not None or bool(self.kernels)

    def serves(self, cc: str) -> Coverage:
        """How the image serves a GPU of compute capability ``cc``."""
        have = cc_version(cc)
        if self.kernels:
            return _by_kernel(self.kernels, have)
        if self.families is None:
            return Coverage(None)
        code = [c for word in self.families for c in GpuArch.of_family(word)]
        return Coverage(_how(code, have))

    def status(self, cc: str) -> str | None:
        return self.serves(cc).status


def _how(code: list[GpuArch], cc: Version) -> str:
    """sass, ptx-jit-only or none for one piece of code list on ``cc``: the driver's ISA is left to
    the driver-floor verdict (doctor reports it on its own), so PTX is judged by architecture."""
    if any(c.kind == SASS and c.runs_on(cc) for c in code):
        return SERVED
    return JIT if any(c.kind == PTX and c.runs_on(cc) for c in code) else NONE


def _by_kernel(kernels: dict[str, dict[str, CoverageCell]], cc: Version) -> Coverage:
    """Each required kernel on ``cc``. A kernel is required on a GPU of a major it is required on
    for some claimed family (vLLM picks kernels by the major: FlashKDA on 9, 10, 12), and its code
    is every piece its cells name (a cell names what serves a family, or all the kernel carries)."""
    required = {ext: row for ext, row in kernels.items() if any(cc_version(f)[0] == cc[0] for f in row)}
    if not required:
        return Coverage(NONE, (), True)
    hows = {ext: _how([c for cell in row.values() for c in cell.code], cc) for ext, row in required.items()}
    missing = tuple(sorted(ext for ext, how in hows.items() if how == NONE))
    if len(missing) == len(hows):
        return Coverage(NONE, missing, True)
    if missing:
        return Coverage(PARTIAL, missing, True)
    return Coverage(JIT if JIT in hows.values() else SERVED, (), True)


def from_labels(labels: dict[str, str], platforms: tuple[str, ...] = (), coverage: dict | None = None) -> ImageFacts:
    keys = contract.keys_in(labels)
    floor = labels.get(keys.driver_floor) or None
    raw = labels.get(keys.gpu_families)
    notes: list[str] = []
    families = tuple(w for w in raw.split() if GpuArch.of_family(w)) if raw is not None else None
    if raw is not None and families is not None and len(families) != len(raw.split()):
        notes.append(f"label {keys.gpu_families}={raw!r} holds words that are no compute capability (ignored)")
    if floor is not None and not re.fullmatch(r"\d{3}\.\d+(?:\.\d+)?", floor):
        notes.append(f"label {keys.driver_floor}={floor!r} is not a driver version (ignored)")
        floor = None
    kernels, bad = _kernels(coverage or {})
    if bad:
        notes.append(f"the build record's coverage table has {bad} cells this tool cannot read (ignored)")
    return ImageFacts(platforms, floor, families, kernels, tuple(notes))


def _kernels(table: dict) -> tuple[dict[str, dict[str, CoverageCell]], int]:
    """(extension -> cc -> cell, how many cells could not be read) of the record's gpu_coverage table."""
    out: dict[str, dict[str, CoverageCell]] = {}
    bad = 0
    for ext, row in table.items():
        if not isinstance(row, dict):
            bad += 1
            continue
        for cc, text in row.items():
            cell = CoverageCell.read(text) if isinstance(cc, str) and _CC.fullmatch(cc) else None
            if cell is None:
                bad += 1
            else:
                out.setdefault(str(ext), {})[cc] = cell
    return out, bad


def record_coverage(record_path) -> dict:
    """The coverage table of a build record (image.json), {} when it carries none or cannot be read."""
    try:
        doc = json.loads(record_path.read_text())
    except (OSError, ValueError):
        return {}
    for path in RECORD_COVERAGE_KEYS:
        node = doc
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            return node
    return {}


def _platform(os_name, arch, variant=None) -> str:
    return f"{os_name or '?'}/{arch or '?'}" + (f"/{variant}" if variant else "")


def platforms(engine: Engine, ref: str) -> tuple[tuple[str, ...], str]:
    """(the image's platforms, a note when they could not be read). An index lists each platform
    (attestation manifests left out); an image's config says its own os/architecture."""
    from builder.engine.registry import split_reference

    try:
        if names_registry_host(ref):
            manifest = engine.registry.raw_manifest(*split_reference(ref))
            doc = manifest.doc if manifest else {}
            if "manifests" in doc:
                found = [
                    _platform(p.get("os"), p.get("architecture"), p.get("variant"))
                    for d in doc["manifests"]
                    if (p := d.get("platform") or {}).get("os") not in (None, "unknown")
                    and (d.get("annotations") or {}).get("vnd.docker.reference.type") != "attestation-manifest"
                ]
                return tuple(found), ""
            config = engine.registry.image_config(ref) or {}
        else:
            inspected = json.loads(engine.image_inspect(ref))
            config = inspected[0] if isinstance(inspected, list) else inspected
    except (BuilderError, ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        return (), f"the image's platform could not be read ({exc})"
    os_name = config.get("os") or config.get("Os")
    arch = config.get("architecture") or config.get("Architecture")
    if not arch:
        return (), "the image's config names no architecture"
    return (_platform(os_name, arch, config.get("variant") or config.get("Variant")),), ""


def read(engine: Engine, ref: str, labels: dict[str, str], record: Path | None = None) -> ImageFacts:
    """The image's facts: its labels, its platforms, and the coverage table of ``record`` (its build
    record, when it is of this very image)."""
    found, why = platforms(engine, ref)
    facts = from_labels(labels, found, record_coverage(record) if record else {})
    return replace(facts, notes=(*facts.notes, why)) if why else facts

"""What the image really carries, for doctor: its platforms (the config's os/architecture, or every
platform of an index), its derived driver floor and GPU families (labels the gpu_code check proves,
builder/config/gpu.py), and, when its build record has one, the per-family coverage table.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from builder.config import contract
from builder.errors import BuilderError

if TYPE_CHECKING:
    from builder.engine.buildx import Engine

# Where the build record (image.json) may carry the per-family coverage table: {cc: "sass" |
# "ptx-jit-only" | "none" | "partial"} or {cc: {"status": ...}}. The key is the gpu_code check's
# to define; both spellings it may take are read, and the table is optional (labels come first).
# Where image.json keeps the gpu_coverage table (contract.RECORD_GPU, written by the pipeline's
# publish.gpu_record): extension -> compute capability -> what serves it there.
RECORD_COVERAGE_KEYS = ((contract.RECORD_GPU, "coverage"),)
COVERAGE_VALUES = ("sass", "ptx-jit-only", "partial", "none")
_ARCH = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
}
_CC = re.compile(r"[1-9][0-9]?\.[0-9]")


@dataclass(frozen=True)
class ImageFacts:
    platforms: tuple[str, ...] = ()  # "linux/amd64", ...; () when unknown
    floor: str | None = None  # the derived driver floor (label), e.g. "575.51.03"
    families: tuple[str, ...] | None = None  # compute capabilities the image serves (label); None: no label
    coverage: dict[str, str] = field(default_factory=dict)  # the record's per-family table, when read
    notes: tuple[str, ...] = ()  # what could not be read, and why

    def status(self, cc: str) -> str | None:
        """sass, ptx-jit-only, partial or none for a compute capability; None when the image declares nothing."""
        if cc in self.coverage:
            return self.coverage[cc]
        if self.families is None:
            return None
        return "sass" if cc in self.families else "none"


def arch_name(machine: str) -> str | None:
    """x86_64/amd64 -> amd64, aarch64/arm64 -> arm64 (the OCI names), else None."""
    return _ARCH.get(machine.strip().lower())


def from_labels(labels: dict[str, str], platforms: tuple[str, ...] = (), coverage: dict | None = None) -> ImageFacts:
    keys = contract.keys_in(labels)
    floor = labels.get(keys.driver_floor) or None
    raw = labels.get(keys.gpu_families)
    notes: list[str] = []
    families = tuple(cc for cc in raw.split() if _CC.fullmatch(cc)) if raw is not None else None
    if raw is not None and families is not None and len(families) != len(raw.split()):
        notes.append(f"label {keys.gpu_families}={raw!r} holds words that are no compute capability (ignored)")
    if floor is not None and not re.fullmatch(r"\d{3}\.\d+(?:\.\d+)?", floor):
        notes.append(f"label {keys.driver_floor}={floor!r} is not a driver version (ignored)")
        floor = None
    return ImageFacts(platforms, floor, families, _coverage(coverage or {}), tuple(notes))


def _coverage(table: dict) -> dict[str, str]:
    """Per compute capability, one status: from a flat table (cc -> status) or from the record's
    gpu_coverage table (extension -> cc -> "SASS sm_90a" | "PTX JIT compute_80 (ISA 8.8)" | "none ...")."""
    out = {}
    for cc, value in table.items():
        status = value.get("status") if isinstance(value, dict) else value
        if isinstance(cc, str) and _CC.fullmatch(cc) and status in COVERAGE_VALUES:
            out[cc] = status
    per_cc: dict[str, list[str]] = {}
    for ext_table in (v for k, v in table.items() if not _CC.fullmatch(str(k)) and isinstance(v, dict)):
        for cc, how in ext_table.items():
            if isinstance(cc, str) and _CC.fullmatch(cc) and isinstance(how, str):
                per_cc.setdefault(cc, []).append(how)
    for cc, hows in per_cc.items():
        gone = [h for h in hows if h.startswith("none")]
        if gone:
            out[cc] = "none" if len(gone) == len(hows) else "partial"
        else:
            out[cc] = "ptx-jit-only" if any(h.startswith("PTX") for h in hows) else "sass"
    return out


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


def _from_registry(ref: str) -> bool:
    """The rule engine.buildx.image_config uses: a reference naming a registry host is read there."""
    first = ref.split("/", 1)[0]
    return "/" in ref and ("." in first or ":" in first or first == "localhost")


def _platform(os_name, arch, variant=None) -> str:
    return f"{os_name or '?'}/{arch or '?'}" + (f"/{variant}" if variant else "")


def platforms(engine: Engine, ref: str) -> tuple[tuple[str, ...], str]:
    """(the image's platforms, a note when they could not be read). An index lists each platform
    (attestation manifests left out); an image's config says its own os/architecture."""
    from builder.engine.registry import split_reference

    try:
        if _from_registry(ref):
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

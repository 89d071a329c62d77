"""The GPU code a target claims (matrix key ``gpu``): the GPU families it serves, the extensions
that must carry code for every one of them, and the driver floor its binaries may need.

What a target *claims* lives here; what an image *carries* is read from its binaries by the
``gpu_code`` check (SASS per architecture, PTX ISA, the toolkit that built each cubin). The
families and the floor are also written into the image's labels (``contract.LabelKeys``), so an
auditor and ``build doctor`` read the same fact the check proved.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Literal

from pydantic import Field, StrictStr, model_validator

from builder.config.patterns import ExtensionName, Frozen, PathPattern, Pattern, Reason, Text

# A compute capability as nvidia-smi prints it (``--query-gpu=compute_cap``): 9.0, 10.3, 12.0.
ComputeCap = Annotated[StrictStr, Pattern(r"[1-9][0-9]?\.[0-9]", 'a quoted compute capability such as "10.3"')]
# A Linux driver version: 575.51.03 (three parts) or 575.57 (two parts, as some branches print).
DriverVersion = Annotated[
    StrictStr, Pattern(r"[1-9][0-9]{2}\.[0-9]{1,3}(?:\.[0-9]{1,3})?", "a driver version such as 575.51.03")
]


class GpuCode(Frozen):
    """What a target promises about the GPU code in its image."""

    # compute capability -> the GPUs that have it, e.g. "10.3": "B300, GB300". The target claims
    # every family listed: each required extension must carry SASS that loads there or PTX the
    # driver floor can JIT-compile.
    families: dict[ComputeCap, Text] = Field(min_length=1)
    # Extensions (dotted module names) the model needs, each on "all" claimed families or on the
    # listed ones (a Hopper-only kernel such as FA3: ["9.0"]).
    required: dict[ExtensionName, Literal["all"] | tuple[ComputeCap, ...]] = Field(default_factory=dict)
    # The oldest driver the image's binaries may need (its newest PTX ISA, the toolkit of its
    # cubins, its run-time assemblers). Written as the label; the check proves the binaries need
    # no newer driver than this.
    driver_floor: DriverVersion
    # Files (fnmatch over absolute paths) the floor and toolkit rules skip, each with why.
    exceptions: dict[PathPattern, Reason] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _required_on_claimed(self) -> GpuCode:
        for ext, on in self.required.items():
            unknown = [cc for cc in (() if on == "all" else on) if cc not in self.families]
            if unknown:
                raise ValueError(f"gpu.required.{ext}: {', '.join(unknown)} is not a family in gpu.families")
        return self

    def required_on(self, extension: str) -> tuple[str, ...]:
        """The compute capabilities ``extension`` must cover (empty: not required)."""
        on = self.required.get(extension, ())
        return self.capabilities if on == "all" else tuple(cc for cc in self.capabilities if cc in on)

    @property
    def capabilities(self) -> tuple[str, ...]:
        """The claimed compute capabilities, oldest first (as in the label)."""
        return tuple(sorted(self.families, key=lambda cc: tuple(int(p) for p in cc.split("."))))


# --- where GPU code runs: one rule for the checks and for doctor -----------------------------------

Version = tuple[int, ...]

# PTX ISA -> the CUDA release that introduced it: the oldest driver that JIT-compiles it. Source:
# NVIDIA cuda-python, cuda_bindings/cuda/bindings/utils/_ptx_utils.py (``_ptx_to_cuda``, from the
# PTX ISA release history), 8.0-8.8; 9.0 = CUDA 13.0 from the same release history (the PTX ISA
# 9.0 document ships with CUDA 13.0; nvcc 13.0.88 writes ``.version 9.0``, tried). An ISA newer
# than the table is unknown: treated as newer than every CUDA the table knows.
PTX_ISA_CUDA: dict[str, Version] = {
    "8.0": (12, 0),
    "8.1": (12, 1),
    "8.2": (12, 2),
    "8.3": (12, 3),
    "8.4": (12, 4),
    "8.5": (12, 5),
    "8.6": (12, 7),
    "8.7": (12, 8),
    "8.8": (12, 9),
    "9.0": (13, 0),
}
SASS, PTX = "SASS", "PTX"
_ARCH = re.compile(r"(sm|compute)_([1-9][0-9]?)([0-9])([af]?)")
# A word of the gpu-families label: "9.0", "9.0a" (arch-specific), "10.3f" (family), "8.0+PTX".
_FAMILY = re.compile(r"([1-9][0-9]?)\.([0-9])([af]?)(\+PTX)?", re.I)


def isa_cuda(isa: str | None) -> Version | None:
    """The CUDA release an ISA needs; None when the table does not know it (newer than it)."""
    return PTX_ISA_CUDA.get(isa or "")


def cc_version(cc: str) -> Version:
    """ "12.1" -> (12, 1)."""
    return tuple(int(p) for p in cc.split("."))


@dataclass(frozen=True)
class GpuArch:
    """One piece of GPU code: SASS for ``sm_XY[a|f]`` or PTX for ``compute_XY[a|f]`` (of a PTX ISA).

    ``runs_on`` is the one rule of where it runs (CUDA Programming Guide, binary compatibility; the
    family targets of CUDA 12.9): generic SASS ``sm_XY`` runs on X.Z for every Z >= Y of the same
    major, family ``sm_XYf`` likewise (its family), arch-specific ``sm_XYa`` only on X.Y exactly.
    PTX is JIT-compiled by the driver: generic ``compute_XY`` on every cc >= X.Y, ``compute_XYf``
    within its major from X.Y, ``compute_XYa`` on X.Y only, and only when the driver knows its ISA."""

    kind: str  # SASS, PTX, or another entry kind a fatbin holds (LTO-IR: listed, never run)
    cc: Version  # (major, minor) of its architecture
    variant: str = ""  # "", "a" (arch-specific) or "f" (family-specific)
    isa: str | None = None  # PTX ISA ("8.8"); None for SASS, or PTX a label names without its ISA

    @classmethod
    def parse(cls, arch: str, kind: str | None = None, isa: str | None = None) -> GpuArch | None:
        """``sm_90a`` (SASS), ``compute_80`` (PTX); None when ``arch`` is neither."""
        m = _ARCH.fullmatch(arch.strip())
        if m is None:
            return None
        own = kind or (SASS if m.group(1) == "sm" else PTX)
        return cls(own, (int(m.group(2)), int(m.group(3))), m.group(4), isa if own == PTX else None)

    @classmethod
    def of_family(cls, word: str) -> tuple[GpuArch, ...]:
        """A gpu-families label word: "9.0a" -> SASS sm_90a; "8.0+PTX" -> SASS sm_80 and PTX compute_80
        (its ISA unknown: the driver floor label speaks for it); () when ``word`` is none."""
        m = _FAMILY.fullmatch(word.strip())
        if m is None:
            return ()
        cc, variant = (int(m.group(1)), int(m.group(2))), m.group(3).lower()
        return (cls(SASS, cc, variant),) + ((cls(PTX, cc, variant),) if m.group(4) else ())

    @property
    def arch(self) -> str:
        prefix = "compute_" if self.kind == PTX else "sm_"
        return f"{prefix}{self.cc[0]}{self.cc[1]}{self.variant}"

    @property
    def family(self) -> str:
        """As the label writes it: "9.0a"."""
        return f"{self.cc[0]}.{self.cc[1]}{self.variant}"

    def runs_on(self, cc: Version, jit_cuda: Version | None = None) -> bool:
        """Does this code run on a GPU of compute capability ``cc``? ``jit_cuda``: the newest CUDA the
        driver runs (PTX of a newer ISA is refused); None leaves the ISA to the driver floor."""
        if self.kind not in (SASS, PTX):
            return False
        if self.variant == "a":
            fits = tuple(cc) == self.cc
        elif self.variant == "f" or self.kind == SASS:
            fits = cc[0] == self.cc[0] and cc[1] >= self.cc[1]
        else:
            fits = tuple(cc) >= self.cc
        if self.kind == PTX and jit_cuda is not None and self.isa is not None:
            needs = isa_cuda(self.isa)
            return fits and needs is not None and needs <= jit_cuda
        return fits


class Served(str, Enum):
    """How a compute capability is served by one extension (a cell of the coverage table)."""

    SASS = "sass"
    PTX = "ptx-jit-only"
    NONE = "none"


@dataclass(frozen=True)
class CoverageCell:
    """One cell of the gpu_coverage table (extension x compute capability) as a value: how the cc
    is served and by which code (for NONE: every piece the extension carries). ``show`` is the form
    the build record stores ("SASS sm_90a", "PTX JIT compute_80 (ISA 8.8)", "none (has SASS sm_90a,
    PTX compute_80 ISA 8.8)"); ``read`` is the one reader of that form."""

    served: Served
    code: tuple[GpuArch, ...] = ()

    def show(self) -> str:
        if self.served is Served.SASS:
            return "SASS " + " ".join(sorted({c.arch for c in self.code}))
        if self.served is Served.PTX:
            return "PTX JIT " + " ".join(sorted({f"{c.arch} (ISA {c.isa})" for c in self.code}))
        has = sorted({f"{c.kind} {c.arch}" + (f" ISA {c.isa}" if c.isa else "") for c in self.code})
        return "none (has " + (", ".join(has) if has else "no GPU code") + ")"

    @classmethod
    def read(cls, text: object) -> CoverageCell | None:
        """A stored cell back as a value; None when ``text`` is not one (a forged or foreign record)."""
        if not isinstance(text, str):
            return None
        if text.startswith("SASS "):
            code = [GpuArch.parse(a, SASS) for a in text[5:].split()]
            return cls(Served.SASS, tuple(c for c in code if c)) if code and all(code) else None
        if text.startswith("PTX JIT "):
            found = re.findall(r"(compute_\w+) \(ISA ([0-9.]+)\)", text)
            code = [GpuArch.parse(a, PTX, isa) for a, isa in found]
            return cls(Served.PTX, tuple(c for c in code if c)) if found and all(code) else None
        m = re.fullmatch(r"none \(has (.*)\)", text)
        if m is None:
            return None
        parts = [] if m.group(1) == "no GPU code" else m.group(1).split(", ")
        code = [_listed(p) for p in parts]
        return cls(Served.NONE, tuple(c for c in code if c))

    @property
    def runs(self) -> bool:
        return self.served is not Served.NONE


def cell_runs(text: object) -> bool:
    """Does a stored coverage cell say its compute capability is served? False for "none (...)" and
    for anything that is no cell (a forged record): the one reader every module uses."""
    cell = CoverageCell.read(text)
    return cell is not None and cell.runs


def _listed(part: str) -> GpuArch | None:
    """ "SASS sm_90a", "PTX compute_80 ISA 8.8", "LTO-IR sm_90" (as a NONE cell lists them)."""
    m = re.fullmatch(r"(\S+) (\S+)(?: ISA ([0-9.]+))?", part)
    return GpuArch.parse(m.group(2), m.group(1), m.group(3)) if m else None

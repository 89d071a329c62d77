"""The GPU code a target claims (matrix key ``gpu``): the GPU families it serves, the extensions
that must carry code for every one of them, and the driver floor its binaries may need.

What a target *claims* lives here; what an image *carries* is read from its binaries by the
``gpu_code`` check (SASS per architecture, PTX ISA, the toolkit that built each cubin). The
families and the floor are also written into the image's labels (``contract.LabelKeys``), so an
auditor and ``build doctor`` read the same fact the check proved.
"""

from __future__ import annotations

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

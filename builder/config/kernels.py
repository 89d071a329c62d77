"""What a target requires of the source's build files before anything compiles (matrix key
``kernels``): the arch selections whose kernels must reach GPU families the target claims, and the
fetches in the build files that are allowed without a pin in ``source.third_party``.

The kernel plan (builder/source/kernelplan.py) computes each selection's archs with upstream's own
CMake functions; `build plan`, `build track` and the build's preflight hold the result to this.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictStr

from builder.config.gpu import ComputeCap, GpuCode
from builder.config.patterns import Frozen, Pattern, Reason

_FILE = r"(?!.*(?:^|/)\.\.(?:/|$))[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*"
# An arch selection by the variable upstream's build files assign, optionally in one file:
# DSV3_FUSED_A_GEMM_ARCHS, or cmake/external_projects/flashkda.cmake:FLASH_KDA_ARCHS.
KernelName = Annotated[
    StrictStr,
    Pattern(
        rf"(?:{_FILE}:)?[A-Za-z0-9_]*ARCHS[A-Za-z0-9_]*",
        "an arch variable of the build files, optionally file:VAR, e.g. FLASH_KDA_ARCHS",
    ),
]
# A fetch as the inventory names it: <file>:<name>, e.g. setup.py:urlopen or CMakeLists.txt:cutlass.
FetchKey = Annotated[
    StrictStr,
    Pattern(rf"{_FILE}:[A-Za-z0-9_][A-Za-z0-9_.+-]{{0,79}}", "a fetch as <file>:<name>, e.g. setup.py:urlopen"),
]


class Kernels(Frozen):
    """The kernel plan's requirements and the fetch waivers of one target."""

    # Arch selection -> the claimed families (gpu.families) its kernels must reach: "all" or a list.
    required: dict[KernelName, Literal["all"] | tuple[ComputeCap, ...]] = Field(default_factory=dict)
    # Fetches in the build files that need no pin, each with why (not run by this build, say).
    fetch_waivers: dict[FetchKey, Reason] = Field(default_factory=dict)

    def families_of(self, kernel: str, gpu: GpuCode | None) -> tuple[str, ...]:
        """The compute capabilities ``kernel`` must reach (empty without a ``gpu`` block)."""
        on = self.required.get(kernel, ())
        claimed = gpu.capabilities if gpu else ()
        return claimed if on == "all" else tuple(cc for cc in claimed if cc in on)

    def unknown_families(self, gpu: GpuCode | None) -> list[str]:
        """``kernels.required.<K>`` entries naming a family the target does not claim."""
        claimed = set(gpu.families) if gpu else set()
        return [
            f"kernels.required.{k}: {cc} is not a family in gpu.families"
            for k, on in self.required.items()
            for cc in (() if on == "all" else on)
            if cc not in claimed
        ]

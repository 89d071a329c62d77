"""The oldest CPU a target claims per platform (matrix key ``cpu``) and the QEMU model that stands for
each level: one table, read by the matrix's validation and by the check that runs the image's
imports on that model (``cpu_level``, builder/checks/cpurun.py).

Instruction bytes cannot be judged statically: libraries pick their code at run time (glibc's
ifuncs, PyTorch's and NumPy's CPU dispatch), so a file full of AVX-512 may be right and one
constructor with an AVX2 instruction wrong. The check runs the imports under QEMU's user mode with
``-cpu MODEL``, where TCG raises SIGILL for an instruction the model lacks (tried with QEMU 7.2.22,
Debian bookworm's qemu-user-static: SSE3 to AVX-512 instructions against the models below).

Why each model is its level's oldest (the feature lists are QEMU 7.2's, as the model reports them
through CPUID under TCG; tried here with GCC's ``__builtin_cpu_supports``):

- ``x86-64`` (the baseline: SSE2): ``qemu64`` with SSE3, CMPXCHG16B and LAHF/SAHF removed, leaving
  exactly the baseline's features (no real CPU model of QEMU's is the bare baseline: its
  ``Opteron_G1`` reports SSE3).
- ``x86-64-v2`` (SSE3, SSSE3, SSE4.1, SSE4.2, POPCNT, CMPXCHG16B, LAHF/SAHF): ``Nehalem-v1``, the
  first CPU with all of them, the one the level was drawn from; no AVX.
- ``x86-64-v3`` (v2 + AVX, AVX2, BMI1, BMI2, F16C, FMA, LZCNT, MOVBE): ``Haswell-v4``, the first
  with all of them (v4: no TSX, as microcode updates left most Haswells); no AVX-512. QEMU 7.2 is
  the first release whose TCG emulates AVX, AVX2, FMA and F16C; it warns that it drops features no
  user program executes (PCID, x2APIC, TSC deadline, INVPCID, SPEC_CTRL).
- ``x86-64-v4`` (v3 + AVX-512 F, BW, CD, DQ, VL): no model: QEMU 7.2's TCG emulates no AVX-512
  (``Skylake-Server`` runs with its AVX-512 flags dropped), so the row says NOT CHECKED.
- ``armv8.0`` (ARMv8.0-A, AArch64 with Advanced SIMD): ``cortex-a53``. QEMU's model also has the
  optional AES, SHA1/SHA2, PMULL and CRC32 every ARMv8.0 server CPU shipped with (Cortex-A57/A72,
  ThunderX, X-Gene); a v8.0 core without them (some embedded ones) is older than the model: not
  confirmed which hosts those are, and none is a GPU server.
- ``armv8.2`` (ARMv8.2-A: LSE atomics, FP16, RCpc, dot product): ``neoverse-n1`` (Ampere Altra,
  AWS Graviton2), the first Arm server core of that level; no SVE.
- ``armv9.0`` (Neoverse V2: NVIDIA Grace in GH200, GB200, GB300, with SVE2): no model in QEMU 7.2
  (its ``max`` is newer than any one CPU, not a level), so the row says NOT CHECKED.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, StrictStr
from pydantic.json_schema import WithJsonSchema

from builder.config.patterns import did_you_mean, show
from builder.config.platforms import PLATFORM_ARCH


@dataclass(frozen=True)
class Level:
    name: str  # as the matrix writes it
    platform: str  # the platform whose CPUs it names
    model: str | None  # QEMU's -cpu value; None: QEMU 7.2 emulates no CPU of this level
    features: str  # what the level adds, for the failure message


LEVELS = {
    level.name: level
    for level in (
        Level("x86-64", "linux/amd64", "qemu64,-sse3,-cx16,-lahf-lm", "SSE2"),
        Level("x86-64-v2", "linux/amd64", "Nehalem-v1", "SSE4.2, POPCNT"),
        Level("x86-64-v3", "linux/amd64", "Haswell-v4", "AVX2, BMI2, FMA"),
        Level("x86-64-v4", "linux/amd64", None, "AVX-512"),
        Level("armv8.0", "linux/arm64", "cortex-a53", "Advanced SIMD"),
        Level("armv8.2", "linux/arm64", "neoverse-n1", "LSE atomics, FP16, dot product"),
        Level("armv9.0", "linux/arm64", None, "SVE2"),
    )
}
# Why a level has no model, for the NOT CHECKED reason.
NO_MODEL = {
    "x86-64-v4": "QEMU 7.2's TCG emulates no AVX-512 (its Skylake-Server model runs with AVX-512 dropped)",
    "armv9.0": "QEMU 7.2 has no Armv9 model (Neoverse V2, Grace); its `max` is no one CPU's level",
}


def _level(value: str) -> str:
    if value not in LEVELS:
        raise ValueError(f"must be one of {', '.join(LEVELS)} (got {show(value)}){did_you_mean(value, LEVELS)}")
    return value


LevelName = Annotated[StrictStr, AfterValidator(_level), WithJsonSchema({"enum": list(LEVELS)})]


def check(target: Any) -> str | None:
    """The first problem with a target's ``cpu`` as '<key>: <why>', or None: each key a platform the
    target builds, each level one of that platform's. ``target``: a schema.Target."""
    names = target.platform_names()
    for platform, name in target.cpu.items():
        if platform not in names:
            return f"cpu.{platform!r}: the target builds {', '.join(names)}, not {platform}"
        level = LEVELS[name]
        if level.platform != platform:
            own = [n for n, lv in LEVELS.items() if lv.platform == platform]
            return f"cpu.{platform!r}: {name} is a {level.platform} level; {platform}'s are {', '.join(own)}"
    return None


def qemu_binary(platform: str) -> str:
    """The QEMU user-mode binary that runs ``platform``'s code (Debian's qemu-user-static names)."""
    return f"qemu-{PLATFORM_ARCH[platform]}-static"

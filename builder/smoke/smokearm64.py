"""The smoke's second platform, linux/arm64: its bases made from Debian's archive the way the amd64
ones are (smokeroots: one `mmdebstrap --architectures=arm64` run; the packages' own maintainer
scripts run under QEMU: `ci/setup.sh` registers qemu-aarch64), the stub libcuda.so.1 compiled inside
each arm64 root by its own C compiler, imported as linux/arm64 images and pushed; then one OCI
image index per base naming the amd64 and the arm64 manifest, the shape of nvidia/cuda's tags.
Made once per machine (under the machine-wide lock, smokecache) and reused while the registry
serves them; docs/smoke.md has the first run's time and where it goes.

Each arm64 base must hold the same packages at the same versions as its amd64 sibling (checked
here): one multi-platform tag, one content on both platforms.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import yaml

from builder.engine.seam import Engine
from builder.errors import BuildError
from builder.smoke import smoke, smokecache, smokeroots

ARCH = "arm64"
PLATFORM = "linux/arm64"


def _amd64_packages(engine: Engine, ref: str) -> dict[str, str]:
    """package -> version installed in the amd64 base ``ref`` (its own dpkg-query, natively)."""
    out = engine.containers.run_capture(ref, "dpkg-query", ["-W", "-f=${Package} ${Version} ${db:Status-Abbrev}\\n"])
    return {f[0]: f[1] for f in (line.split() for line in out.splitlines()) if len(f) == 3 and f[2] == "ii"}


# Packages one architecture's toolchain has and the other's lacks (the same source packages,
# other binaries): the only difference same_packages accepts, each with why.
ONLY_ON = {
    "amd64": {
        "binutils-x86-64-linux-gnu": "binutils' assembler and linker for the machine's own triplet",
        "libquadmath0": "GCC's __float128 runtime, which GCC builds only for x86 (and ppc64el)",
    },
    ARCH: {
        "binutils-aarch64-linux-gnu": "binutils' assembler and linker for the machine's own triplet",
        "libhwasan0": "GCC's hardware-assisted AddressSanitizer runtime, which needs arm64's top-byte-ignore",
    },
}


def same_packages(role: str, arm64: dict[str, str], amd64: dict[str, str]) -> None:
    """The arm64 base holds the packages its amd64 sibling holds, at the same versions: one index
    tag, one content on both platforms. Accepted: the packages of ONLY_ON, and a version differing
    only in a binNMU suffix (+bN: the same source rebuilt on one architecture)."""

    def source_version(version: str) -> str:
        return re.sub(r"\+b\d+$", "", version)

    only_arm = sorted(set(arm64) - set(amd64) - set(ONLY_ON[ARCH]))
    only_amd = sorted(set(amd64) - set(arm64) - set(ONLY_ON["amd64"]))
    differ = sorted(
        f"{n} {amd64[n]} (amd64) / {arm64[n]} (arm64)"
        for n in set(arm64) & set(amd64)
        if source_version(arm64[n]) != source_version(amd64[n])
    )
    problems = [
        *([f"only on arm64: {', '.join(only_arm)}"] if only_arm else []),
        *([f"only on amd64: {', '.join(only_amd)}"] if only_amd else []),
        *([f"versions differ: {'; '.join(differ)}"] if differ else []),
    ]
    if problems:
        raise BuildError(f"the arm64 {role} base does not hold what the amd64 one holds: {' | '.join(problems)}")


def arm64_bases(registry: str, engine: Engine, amd64: Callable[[], dict[str, str]]) -> dict[str, str]:
    """role -> the pinned linux/arm64 base (name:tag@digest), made or reused; made bases hold
    the packages of their amd64 siblings (same_packages), which ``amd64()`` returns once made."""
    recipe = smoke._recipe()

    def make() -> dict[str, str]:
        with tempfile.TemporaryDirectory(prefix="k3-smoke-arm64-") as tmp:
            refs = {}
            roots = smokeroots.roots(Path(tmp), ARCH, smoke.BASES)
            siblings = amd64()  # waits for the amd64 bases, made meanwhile (smoke._all_bases)
            for role, root in roots.items():
                same_packages(role, smokeroots.installed(root), _amd64_packages(engine, siblings[role]))
                tagged = f"{registry}/{smoke.BASES[role][0]}:{smoke.SUITE}-{recipe}-{ARCH}"
                refs[role] = smoke.push_base(engine, role, root, tagged, PLATFORM)
            return refs

    def usable(refs: dict[str, str]) -> bool:
        return set(refs) == set(smoke.BASES) and all(smoke._served(engine, ref) for ref in refs.values())

    return smokecache.made_once("smoke-bases-arm64.yaml", registry, recipe, usable, make)


def index_bases(registry: str, engine: Engine, amd64: dict[str, str], arm64: dict[str, str]) -> dict[str, dict]:
    """One index per base role naming both platforms' manifests, tagged <suite>-<recipe>-multi.

    Returns {"linux/amd64": {role: ref}, "linux/arm64": {role: ref}, "index": {role: digest}}, each
    ref the index's tag with that platform's manifest digest (one tag, one manifest per platform)."""
    out: dict[str, dict] = {"linux/amd64": {}, PLATFORM: {}, "index": {}}
    for role, (repo, _) in smoke.BASES.items():
        name = f"{registry}/{repo}"
        tag = f"{smoke.SUITE}-{smoke._recipe()}-multi"
        digests = {"linux/amd64": amd64[role].split("@")[1], PLATFORM: arm64[role].split("@")[1]}
        out["index"][role] = engine.registry.push_index(name, tag, digests)
        for platform, digest in digests.items():
            out[platform][role] = f"{name}:{tag}@{digest}"
    return out


def with_platforms(matrix_text: str, bases: dict[str, dict]) -> str:
    """The smoke matrix naming linux/amd64 (its own bases) and linux/arm64 (the arm64 manifests of
    the same tags), each with the index digests; the header comment kept."""
    header, _, body = matrix_text.partition("\n")
    doc = yaml.safe_load(body)
    index = {"build": bases["index"]["devel"], "runtime": bases["index"]["runtime"]}
    arm = bases[PLATFORM]
    # Two copies of the index: one object twice would be written as a YAML anchor and alias.
    doc["targets"]["smoke"]["platforms"] = {
        "linux/amd64": {"index": dict(index)},
        PLATFORM: {"bases": {"build": arm["devel"], "runtime": arm["runtime"]}, "index": dict(index)},
    }
    doc["targets"]["smoke"].setdefault("cpu", {})[PLATFORM] = "armv8.0"  # check cpu_level: Cortex-A53
    return header + "\n" + yaml.safe_dump(doc, sort_keys=False, width=4096)


def second_platform(
    registry: str, engine: Engine, amd64: Callable[[], dict[str, str]]
) -> tuple[dict[str, str], Callable[[str], str]]:
    """smoke.init's hook (smoke.Second): the arm64 bases made while ``amd64()``'s are, both joined
    per role into an index; returns the amd64 bases as the index tags pin them and what extends the
    matrix with ``platforms``."""
    arm64 = arm64_bases(registry, engine, amd64)
    bases = index_bases(registry, engine, amd64(), arm64)
    return bases["linux/amd64"], lambda text: with_platforms(text, bases)

"""The smoke's second platform, linux/arm64: its bases made with `debootstrap --arch arm64` from
Debian's archive (the second stage runs under QEMU: `K3_SETUP_ARM64=1 ci/setup.sh` registers qemu-aarch64), the stub
libcuda.so.1 compiled inside each arm64 root by its own C compiler, imported as linux/arm64
images and pushed; then one OCI image index per base naming the amd64 and the arm64 manifest, the
shape of nvidia/cuda's tags. Made once per machine and reused while the registry serves them
(the first run's time is measured in docs/smoke.md).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from builder.engine.buildx import Engine
from builder.fsutil import atomic_write, cache_dir
from builder.pipeline import smoke

ARCH = "arm64"
PLATFORM = "linux/arm64"


def _served(engine: Engine, ref: str) -> bool:
    name, digest = ref.split("@")
    return engine.registry.serves(name.rsplit(":", 1)[0], digest)


def arm64_bases(registry: str, engine: Engine) -> dict[str, str]:
    """role -> the pinned linux/arm64 base (name:tag@digest), made or reused."""
    state = cache_dir() / "smoke-bases-arm64.yaml"
    known = yaml.safe_load(state.read_text()) if state.exists() else {}
    known = known if isinstance(known, dict) else {}
    mine, recipe = known.get(registry, {}), smoke._recipe()
    if mine.get("recipe") == recipe and all(_served(engine, ref) for ref in mine["refs"].values()):
        return mine["refs"]
    with tempfile.TemporaryDirectory(prefix="k3-smoke-arm64-") as tmp, ThreadPoolExecutor(2) as pool:
        jobs = {}
        for role, (_, packages) in smoke.BASES.items():
            (Path(tmp) / role).mkdir()
            jobs[role] = pool.submit(smoke._debootstrap, role, packages, Path(tmp) / role, None, 3, ARCH)
        refs = {}
        for role, (repo, _) in smoke.BASES.items():
            tagged = f"{registry}/{repo}:{smoke.SUITE}-{recipe}-{ARCH}"
            refs[role] = f"{tagged}@{engine.import_and_push(jobs[role].result(), tagged, PLATFORM)}"
    known[registry] = {"recipe": recipe, "refs": refs}
    atomic_write(state, yaml.safe_dump(known))
    return refs


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
    doc["targets"]["smoke"]["platforms"] = {
        "linux/amd64": {"index": index},
        PLATFORM: {"bases": {"build": arm["devel"], "runtime": arm["runtime"]}, "index": index},
    }
    return header + "\n" + yaml.safe_dump(doc, sort_keys=False, width=4096)


def second_platform(
    registry: str, engine: Engine, amd64: dict[str, str]
) -> tuple[dict[str, str], Callable[[str], str]]:
    """smoke.init's hook: the arm64 bases made, both joined per role into an index; returns the
    amd64 bases as the index tags pin them and what extends the matrix with ``platforms``."""
    bases = index_bases(registry, engine, amd64, arm64_bases(registry, engine))
    return bases["linux/amd64"], lambda text: with_platforms(text, bases)

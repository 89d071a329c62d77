"""What a target is built from on each platform: the bases pinned by digest, the relocatable
CPython, and the per-platform entries of ``platforms:`` (linux/amd64, linux/arm64).

A target names one or more platforms. Its own ``bases``, ``python.standalone`` and
``cuda.arch_list`` are its first platform's; every further platform states its own bases (the
per-platform manifest digests of the same tags, or the index digest where the manifest digest is
not known), its own CPython build and, where it differs, its own arch list. ``Target.for_platform``
(builder/config/schema.py) gives the target as one platform sees it, so the lock, the OS lock and
the Dockerfile are each made per platform by the same code.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, StrictStr
from pydantic.json_schema import WithJsonSchema

from builder.config.patterns import (
    IMAGE_RE,
    PINNED_IMAGE_JSON,
    ArchiveUrl,
    CudaArch,
    Frozen,
    HttpsUrl,
    LoadName,
    Sha256,
    did_you_mean,
    show,
)
from builder.errors import ConfigError
from builder.log import printable, redact

# The platforms a target may name, and the machine name each one's wheels and CPython carry.
PLATFORM_ARCH = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}


def _platform(value: str) -> str:
    if value not in PLATFORM_ARCH:
        raise ValueError(f"must be one of {', '.join(PLATFORM_ARCH)} (got {show(value)})")
    return value


def flag(value: str, option: str = "--platform") -> str:
    """A platform given on the command line (``build --platform``, ``build test --platform``):
    one of the platforms a matrix may name, else bad input (exit 2) with a "did you mean". Read
    before anything is contacted; whether the target names it is ``Plan.chosen``'s rule."""
    if value not in PLATFORM_ARCH:
        raise ConfigError(
            f"{option} {printable(redact(value[:60]), field=True)}: no target is built for it; targets are built "
            f"for {', '.join(PLATFORM_ARCH)}{did_you_mean(value.lower(), PLATFORM_ARCH)}"
        )
    return value


PlatformName = Annotated[StrictStr, AfterValidator(_platform), WithJsonSchema({"enum": list(PLATFORM_ARCH)})]
DEFAULT_PLATFORM = "linux/amd64"


class BaseImage(Frozen):
    """A base image pinned by digest. Written in the matrix as ``name[:tag]@sha256:...``."""

    name: str  # repository with optional registry host, e.g. nvidia/cuda
    tag: str | None = None
    digest: str

    @property
    def ref(self) -> str:
        """The pinned reference the Dockerfile uses (tag kept for readers, digest decides)."""
        tagged = f"{self.name}:{self.tag}" if self.tag else self.name
        return f"{tagged}@{self.digest}"

    @property
    def display_name(self) -> str:
        return f"{self.name}:{self.tag}" if self.tag else self.name


def _parse_base(value: Any) -> Any:
    if isinstance(value, BaseImage):
        return value
    if not isinstance(value, str):
        raise ValueError(f"must be an image reference 'name[:tag]@sha256:<64 hex>' (got {show(value)})")
    m = IMAGE_RE.fullmatch(value)
    if not m:
        raise ValueError(f"must be an image reference 'name[:tag]@sha256:<64 hex>' (got {show(value)})")
    if not m.group("digest"):
        raise ValueError(f"must be pinned by digest: add @sha256:<64 hex> to {show(value)}")
    return BaseImage(name=m.group("name"), tag=m.group("tag"), digest=m.group("digest"))


PinnedImage = Annotated[BaseImage, BeforeValidator(_parse_base), WithJsonSchema(PINNED_IMAGE_JSON)]


def _digest(value: str) -> str:
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", value):
        raise ValueError(f"must be a digest sha256:<64 lowercase hex> (got {show(value)})")
    return value


Digest = Annotated[StrictStr, AfterValidator(_digest)]


class Bases(Frozen):
    build: PinnedImage  # compiles the source (vLLM: CUDA devel image)
    runtime: PinnedImage  # the final image's parent (vLLM: CUDA base image)


class Standalone(Frozen):
    """A relocatable CPython tarball (python-build-standalone), verified on the host."""

    url: HttpsUrl
    sha256: Sha256


class Platform(Frozen):
    """One platform of a target. A key left out is the target's own (its first platform's)."""

    bases: Bases | None = None
    # The multi-arch index digest of each base's tag, where known: recorded beside the
    # per-platform manifest digest (a base pinned by its index digest resolves per platform).
    index: dict[Literal["build", "runtime"], Digest] = Field(default_factory=dict)
    python: Standalone | None = None  # this platform's CPython build (python.provider standalone)
    arch_list: tuple[CudaArch, ...] | None = Field(default=None, min_length=1)  # TORCH_CUDA_ARCH_LIST
    loads: tuple[LoadName, ...] | None = None  # os_packages.loads where paths name the machine
    # os_packages.archive for this platform: Ubuntu serves arm64 from ubuntu-ports, not ubuntu/.
    archive: ArchiveUrl | None = None


def check(where: str, target: Any) -> str | None:
    """The first problem with a target's ``platforms`` as '<key>: <why>', or None.

    ``target`` is a schema.Target (not imported: schema imports this module)."""
    names = list(target.platforms)
    if not names:
        return None
    first = names[0]
    if PLATFORM_ARCH[first] != target.python.arch:
        return (
            f"platforms.{first!r}: the first platform is the target's own, so python.arch must be "
            f"{PLATFORM_ARCH[first]} (got {target.python.arch})"
        )
    for name in names:
        problem = _check_one(name, target.platforms[name], target, first=name == first)
        if problem:
            return f"platforms.{name!r}.{problem}"
    return _check_across(target)


def _check_one(name: str, p: Platform, target: Any, first: bool) -> str | None:
    arch = PLATFORM_ARCH[name]
    if first and (p.bases or p.python or p.arch_list or p.loads is not None or p.archive):
        return "bases: the first platform's bases, python and arch_list are the target's own; state them there"
    if not first and p.bases is None:
        return "bases: required: another platform's manifest digests are not this platform's"
    standalone = target.python.provider == "standalone"
    if not first and standalone and p.python is None:
        return f"python: required: the target's CPython is a {target.python.arch} build (url and sha256)"
    if p.python and f"{arch}-unknown-linux" not in p.python.url:
        return f"python.url: must be a {arch} build ({arch}-unknown-linux-gnu), got {p.python.url}"
    if p.python and not standalone:
        return "python: only used with python.provider 'standalone'; remove it"
    osp = target.os_packages
    machine = f"{PLATFORM_ARCH[next(iter(target.platforms))]}-linux-gnu"
    if not first and osp and p.loads is None and any(machine in load for load in osp.loads):
        return f"loads: required: os_packages.loads names {machine} paths"
    ubuntu = osp and "/ubuntu/" in (p.archive or osp.archive) and arch not in ("x86_64",)
    if not first and ubuntu:
        return (
            "archive: required: Ubuntu serves this machine from ubuntu-ports (snapshot.ubuntu.com/ubuntu-ports/<time>)"
        )
    if p.archive and not osp:
        return "archive: only used with os_packages; remove it"
    if p.loads and any(m in load for load in p.loads for m in _other_machines(arch)):
        return f"loads: names another machine's library directory (this platform is {arch})"
    if p.bases:
        for role in ("build", "runtime"):
            mine, own = getattr(p.bases, role), getattr(target.bases, role)
            if mine.display_name != own.display_name:
                return (
                    f"bases.{role}: {mine.display_name} is not the target's {own.display_name}: "
                    "one tag, one manifest per platform"
                )
    return None


def _other_machines(arch: str) -> list[str]:
    return [f"{a}-linux-gnu" for a in PLATFORM_ARCH.values() if a != arch]


def _check_across(target: Any) -> str | None:
    """Digests across platforms: a manifest digest is one platform's; an index digest is one per tag."""
    for role in ("build", "runtime"):
        indexes: dict[str, str] = {}
        manifests: dict[str, str] = {}
        for name, p in target.platforms.items():
            if role in p.index:
                indexes.setdefault(p.index[role], name)
                if len(indexes) > 1:
                    return f"platforms.{name!r}.index.{role}: the same tag has one index digest on every platform"
        index = next(iter(indexes), None)
        for name in target.platforms:
            digest = getattr(base_for(target, name), role).digest
            if digest == index:
                continue  # pinned through the index: resolves to this platform's manifest
            if digest in manifests:
                return (
                    f"platforms.{name!r}.bases.{role}: {digest[:19]}... is already {manifests[digest]}'s "
                    "manifest: each platform has its own (or pin the index digest)"
                )
            manifests[digest] = name
    return None


def base_for(target: Any, platform: str) -> Bases:
    """A platform's bases: its own, else the target's (its first platform's)."""
    p = target.platforms.get(platform)
    return p.bases if p and p.bases else target.bases


def pinned_through_index(target: Any, platform: str, role: str) -> bool:
    """Whether a platform's base is pinned by the index digest (its manifest resolved per build)."""
    p = target.platforms.get(platform)
    return bool(p and p.index.get(role) == getattr(base_for(target, platform), role).digest)


_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64", "amd64": "amd64"}


def native_platforms(architecture: str | None, nodes: list[list[str]]) -> tuple[str, ...]:
    """os/arch the builder runs natively: the engine's (docker info's Architecture) and the first
    platform each builder node lists (a node appended with `docker buildx create --append`)."""
    found = [f"linux/{_ARCH.get(architecture or '', architecture or '')}"] if architecture else []
    found += ["/".join(n[0].split("/")[:2]) for n in nodes if n]
    return tuple(dict.fromkeys(found))

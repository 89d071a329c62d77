"""The one engine seam: ``Engine`` is what the pipeline needs from Docker, in three concerns.

``Engine`` itself builds (buildx) into the local image store, exports a built image as a tar stream
(for the secret scan, before anything leaves the host), pushes it, removes it, imports and inspects
images; ``engine.containers`` runs them (builder/engine/containers.py) and ``engine.registry``
talks to the registry over HTTP (builder/engine/registry.py). The rest of the code gets the typed
results defined here or a ``BuildError``/``EngineUnavailable``. ``DockerEngine``
(builder/engine/buildx.py) is the one implementation; unit-test fakes (tests/unit/fakeengine.py)
implement the ``Engine`` protocol instead of subclassing it. Kept apart from the Docker engine, as
repo2docker keeps its engine interface apart from its Docker engine, so code that only needs the
seam never imports the implementation.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from builder.config.imageref import names_registry_host
from builder.engine.containers import ContainerSeam
from builder.engine.registry import RegistrySeam
from builder.errors import BuildError, ConfigError, Unreachable, is_network_failure


@dataclass(frozen=True)
class EngineInfo:
    server_version: str
    buildx_version: str
    builder: str | None  # as `buildx inspect` names them (None when it does not)
    driver: str | None
    cpus: int
    memory_bytes: int
    native: tuple[str, ...] = ()  # the platforms it runs without QEMU (platforms.native_platforms)


@dataclass(frozen=True)
class BuildRequest:
    context: Path
    dockerfile: Path
    tags: tuple[str, ...]
    build_args: dict[str, str]
    build_contexts: dict[str, Path] = field(default_factory=dict)
    source_date_epoch: int | None = None
    push: bool = False  # False: into the local image store (scanned, then pushed with Engine.push)
    no_cache: bool = False
    builder: str | None = None
    secrets: tuple[str, ...] = ()  # buildx --secret specs (id=...,src=...); values never logged
    attest: bool = False  # BuildKit provenance + SBOM attestations (not on the docker driver)
    cache_from: tuple[str, ...] = ()  # buildx --cache-from specs (a bare ref means type=registry)
    cache_to: str | None = None  # buildx --cache-to spec, e.g. type=inline or type=registry,ref=...,mode=max
    platform: str | None = None  # buildx --platform (one "os/arch"; None: the builder's own)


@dataclass(frozen=True)
class ImageConfig:
    ref: str
    id: str
    labels: dict[str, str]
    env: dict[str, str]
    user: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...] = ()  # the config's Cmd (image_starts runs Entrypoint + Cmd)


@dataclass(frozen=True)
class BuildResult:
    # push=True: the manifest digest the registry serves; push=False: the local image's ID (its
    # config digest), which names exactly the layers that were built (the config lists their diff_ids)
    digest: str


class Engine(Protocol):
    """The seam: what the pipeline asks of Docker. Fakes in the unit tests implement this
    (tests/unit/fakeengine.py). The two sub-seams are read-only, so an implementation may hold
    its own registry or container type as long as it provides what the seam names."""

    @property
    def containers(self) -> ContainerSeam: ...
    @property
    def registry(self) -> RegistrySeam: ...

    def preflight(self, builder: str | None = None) -> EngineInfo: ...
    def build(self, req: BuildRequest, log_path: Path, echo: Callable[[str], None]) -> BuildResult: ...
    def export_image(self, image_id: str) -> AbstractContextManager[IO[bytes]]: ...
    def push(self, ref: str) -> str: ...
    def remove_image(self, image_id: str) -> None: ...
    def import_and_push(self, rootfs_tar: Path, ref: str, platform: str | None = None) -> str: ...
    def image_config(self, ref: str) -> ImageConfig: ...
    def describe(self) -> dict[str, str]: ...
    def image_inspect(self, ref: str) -> str: ...


# What Docker's CLI says when a pull reached a registry that does not serve the image: the only
# classification its text allows (the CLI gives no error code).
_NOT_SERVED = ("manifest unknown", "not found", "repository does not exist")
_IMAGE_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,250}(?:@sha256:[0-9a-f]{64})?")


def image_config(engine: Engine, ref: str, arch: str | None = None) -> ImageConfig:
    """An image's config for doctor and compare: read from the registry when the reference names
    one (no pull of a multi-GB image), else from the local engine. Of an index, the linux/``arch``
    image's (doctor: the host's; default amd64). A malformed reference is bad input (exit 2), an
    image the registry does not serve too, an unreachable registry exit 3."""
    if not _IMAGE_REF.fullmatch(ref):
        raise ConfigError(f"--image {ref!r}: not an image reference (name[:tag][@sha256:...])")
    if names_registry_host(ref):
        doc = engine.registry.image_config(ref, arch or "amd64")
        if doc is None:
            offered = f" (no linux/{arch} image in it)" if arch else ""
            raise ConfigError(f"--image {ref}: the registry does not serve it{offered}")
        cfg = doc.get("config") or {}
        env = dict(item.split("=", 1) for item in cfg.get("Env") or [] if "=" in item)
        return ImageConfig(
            ref=ref,
            id="",
            labels=dict(cfg.get("Labels") or {}),
            env=env,
            user=cfg.get("User") or "",
            entrypoint=tuple(cfg.get("Entrypoint") or ()),
            cmd=tuple(cfg.get("Cmd") or ()),
        )
    try:
        return engine.image_config(ref)
    except BuildError as exc:  # a pull that never reached its registry (e.g. no Docker Hub here): exit 3
        if is_network_failure(exc.message):
            raise Unreachable(f"--image {ref}: out of reach: {exc.message}") from None
        if any(m in exc.message.lower() for m in _NOT_SERVED):
            raise ConfigError(f"--image {ref}: the registry does not serve it: {exc.message}") from None
        raise

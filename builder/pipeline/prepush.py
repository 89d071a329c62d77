"""Nothing leaves the host before the scan: the image is built into the local image store, every
layer the build added is searched for the build's secrets (builder/checks/secretscan.py), and only
a clean image is pushed. A hit refuses the build (exit 1) with nothing pushed: no blob in the
registry, the tag still on the image the record names, and the local image removed. What remains
on the host is BuildKit's build cache of the steps (never pushed; `docker builder prune` drops it).

A cache export to a remote store (``--cache-to type=registry|gha|s3|...``) would send the
steps' layers during the build, before any scan: with secrets to look for, the first build exports
no cache, and the cache is exported by the same build run again from the cache once the scan
passed. ``type=inline`` (in the image config, which is scanned) and ``type=local`` (on this host)
are exported by the first build.
"""

from __future__ import annotations

import dataclasses
import tarfile
import zlib
from pathlib import Path

from builder import log
from builder.checks import boundary
from builder.config.matrix import Target
from builder.engine.seam import BuildRequest, BuildResult, Engine
from builder.errors import BuilderError, BuildError

_HOST_CACHES = ("inline", "local")


def remote_cache(req: BuildRequest) -> bool:
    """Whether ``req`` exports its cache off this host (a bare reference means a registry)."""
    if not req.cache_to:
        return False
    if "=" not in req.cache_to:
        return True
    spec = dict(item.split("=", 1) for item in req.cache_to.split(",") if "=" in item)
    return spec.get("type", "registry") not in _HOST_CACHES


def build_scanned(engine: Engine, target: Target, req: BuildRequest, log_path: Path) -> str:
    """Build ``req`` into the local image store and scan it; the local image ID of a clean image.
    A hit raises BuildError (exit 1) once the image is removed from the local store."""
    from builder.checks import secretscan

    scanning = bool(secretscan.needles())
    deferred = scanning and remote_cache(req)
    first = dataclasses.replace(req, push=False, cache_to=None if deferred else req.cache_to)
    where = "the local image store" + (" (the cache export waits for the scan)" if deferred else "")
    with log.step(f"{target.name}: buildx build {req.tags[0]} into {where} (log: {log_path})"):
        image_id = engine.build(first, log_path, log.raw).digest
    if not scanning:
        return image_id  # no secret given to this build: nothing to look for
    scan(engine, target, image_id, log_path)
    if deferred:
        with log.step(
            f"{target.name}: export the build cache ({str(req.cache_to).split(',')[0]}): the same build, cached"
        ):
            again = engine.build(dataclasses.replace(req, push=False), log_path, log.raw).digest
        if again != image_id:  # not the image just scanned (a pruned cache rebuilt a step): scan it too
            scan(engine, target, again, log_path)
            image_id = again
    return image_id


def scan(engine: Engine, target: Target, image_id: str, log_path: Path) -> None:
    """No registered secret (in any written form) in a layer the build added, nor in the config."""
    from builder.checks import secretscan

    wanted = secretscan.needles()
    with log.step(f"{target.name}: scan the image's own layers for the build's secrets, before any push"):
        try:
            with engine.export_image(image_id) as stream:
                hit = secretscan.find_in_archive(stream, wanted, base_layers(engine, target))
        except (tarfile.TarError, EOFError, OSError, zlib.error, ValueError) as exc:
            hit, unreadable = None, f"the image {image_id[:19]} cannot be read to scan it ({exc.__class__.__name__})"
        else:
            unreadable = ""
        if hit is None and not unreadable:
            return
        removed = _remove(engine, image_id)
        found = f"a build secret is in {hit.describe()}: a build step wrote it" if hit else unreadable
        with log_path.open("a") as fh:  # the full digests, for whoever checks the registry and the store
            fh.write(
                f"[k3-builder] secret scan: refused the local image {image_id}"
                + (f" (blob {hit.blob})" if hit else "")
                + f"; nothing pushed; {removed}\n"
            )
        raise BuildError(
            f"{target.image.name}: {found}; nothing was pushed (the tag and the recorded image are "
            f"untouched); {removed}; BuildKit's build cache of the steps stays on this host "
            "(`docker builder prune` drops it)",
            str(log_path),
        )


def _remove(engine: Engine, image_id: str) -> str:
    try:
        engine.remove_image(image_id)
    except BuilderError as exc:
        return f"remove the local image {image_id} by hand ({exc.message})"
    return f"the local image {image_id[:19]} was removed"


def base_layers(engine: Engine, target: Target) -> frozenset[str]:
    """The runtime base's layers by diff_id (pinned, not built by us; `docker save` names a layer
    by its diff_id) for the platform this build is for, as the checks read them
    (boundary.base_layers); when they cannot be read, nothing is skipped."""
    base = target.bases.runtime
    return frozenset(boundary.base_layers(engine, f"{base.name}@{base.digest}", target.platform_names()[0]).diff_ids)


def push(engine: Engine, target: Target, req: BuildRequest, image_id: str, log_path: Path) -> BuildResult:
    """Push the scanned image, then make sure the registry serves it and that what it serves is
    the image scanned (its config, which lists every layer's diff_id, is the local image's ID)."""
    with log_path.open("a", encoding="utf-8") as build_log:  # the log names what leaves the host, and when
        build_log.write(f"[k3-builder] pushing {req.tags[0]} (docker push), after the secret scan\n")
    with log.step(f"{target.name}: push {req.tags[0]}"):
        try:
            digest = engine.push(req.tags[0])
        except BuilderError as exc:  # a registry out of reach included: name the kept log
            raise type(exc)(f"{exc.message}; the build log is kept: {log_path}") from None
    name = target.image.name
    with log.step(f"{target.name}: confirm the registry serves {digest[:19]}"):
        try:
            served = engine.registry.serves(name, digest)
            manifest = engine.registry.raw_manifest(name, engine.registry.platform_digest(name, digest))
        except BuildError as exc:  # unreachable registry included: name the kept log
            raise type(exc)(f"{exc.message}; the build log is kept: {log_path}") from None
        if not served or manifest is None:
            raise BuildError(
                f"the registry does not serve {name}@{digest} after the push; the build log is kept: {log_path}"
            )
        config = (manifest.doc.get("config") or {}).get("digest")
        if config != image_id:
            raise BuildError(
                f"{name}@{digest}: the registry's image has config {config}, not the scanned image's "
                f"{image_id} (the tag moved during the push?); not recorded"
            )
    with log_path.open("a", encoding="utf-8") as build_log:
        build_log.write(f"[k3-builder] pushed {req.tags[0]} as {name}@{digest}\n")
    return BuildResult(digest)

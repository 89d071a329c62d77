"""The Docker engine: ``DockerEngine``, the one implementation of the engine seam
(builder/engine/seam.py) through the Docker CLI (python-on-whales) and buildx. It builds into the
local image store, exports a built image as a tar stream, pushes, removes, imports and inspects
images; its containers are ``DockerContainers`` (builder/engine/containers.py) and its registry
``RegistryClient`` (builder/engine/registry.py). Failures come out as ``BuildError``,
``EngineUnavailable`` or ``HostResources``, never as python-on-whales' own exceptions.

The seam's types and ``image_config`` are importable from here too, as they were before the seam
had a module of its own.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, cast

from builder.config import contract, platforms
from builder.engine import buildlog, localsync
from builder.engine.containers import ContainerSeam, DockerContainers, docker_errors
from builder.engine.registry import RegistryClient, RegistrySeam
from builder.engine.seam import BuildRequest, BuildResult, EngineInfo, ImageConfig
from builder.engine.seam import Engine as Engine  # noqa: F401  (re-exported)
from builder.engine.seam import image_config as image_config  # noqa: F401  (re-exported)
from builder.errors import (
    BuildError,
    EngineUnavailable,
    HostResources,
    RegistryUnavailable,
    is_network_failure,
)
from builder.log import plain, redact

if TYPE_CHECKING:
    from python_on_whales import DockerClient

MIN_ENGINE = (25, 0)
MIN_BUILDX = (0, 13)


# The Go docker CLI under a memory or thread limit: the host's resources, not an engine out of reach.
_HOST_LIMITS = (
    "failed to create new OS thread",
    "cannot allocate memory",
    "resource temporarily unavailable",
    "out of memory",
)


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:2])


# python-on-whales streams buildx with this process's environment, and SOURCE_DATE_EPOCH must be in
# buildx's own environment too (it forwards it to BuildKit). The variable is set only while the
# child is being spawned, under a lock, so concurrent builds (--jobs) each get their own value.
_spawn_lock = threading.Lock()


def _start_stream(make: Callable[[], Iterator[str]], env: dict[str, str]) -> tuple[str | None, Iterator[str]]:
    """Call ``make()`` and pull its first line (which spawns the child) with ``env`` applied."""
    with _spawn_lock:
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            stream = make()
            first = next(stream, None)
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return first, stream


class DockerEngine:
    """The engine through the Docker CLI (python-on-whales). The client is made on first use:
    python-on-whales' ~170 pydantic models cost ~0.2 s to import, which a no-op build (registry
    only) should not pay."""

    def __init__(self, docker: DockerClient | None = None) -> None:
        self._docker = docker
        self.containers: ContainerSeam = DockerContainers(lambda: self.docker)
        self.registry: RegistrySeam = RegistryClient()

    @property
    def docker(self) -> DockerClient:
        if self._docker is None:
            from python_on_whales import DockerClient

            self._docker = DockerClient()
        return self._docker

    def preflight(self, builder: str | None = None) -> EngineInfo:
        from concurrent.futures import ThreadPoolExecutor

        from python_on_whales.exceptions import DockerException

        try:  # three CLI round trips, side by side
            with ThreadPoolExecutor(3) as pool:
                info_call = pool.submit(self.docker.system.info)
                bx_call = pool.submit(self.docker.buildx.version)
                b_call = pool.submit(self.docker.buildx.inspect, builder)
                info, bx, b = info_call.result(), bx_call.result(), b_call.result()
        except DockerException as exc:
            first = (exc.stderr or str(exc)).strip().splitlines()
            if any(m in (exc.stderr or str(exc)) for m in _HOST_LIMITS):
                raise HostResources(
                    f"the docker CLI could not start: {first[-1] if first else exc}; this host is "
                    "out of memory or threads (raise the limit and run again)"
                ) from None
            raise EngineUnavailable(
                f"Docker engine not reachable: {first[0] if first else exc}; start it (ci/setup.sh does)"
            ) from None
        except FileNotFoundError:
            raise EngineUnavailable("docker CLI not found; run ci/setup.sh") from None
        server = info.server_version or "0"
        bx_text = bx.get("version", "0") if isinstance(bx, dict) else str(bx)
        found = re.search(r"\d+\.\d+(?:\.\d+)?", bx_text.split(" ", 1)[-1])
        bx_version = found.group() if found else "0"
        if _version_tuple(server) < MIN_ENGINE:
            raise EngineUnavailable(f"Docker Engine {server} is older than 25; run ci/setup.sh")
        if _version_tuple(bx_version) < MIN_BUILDX:
            raise EngineUnavailable(f"buildx {bx_version} is older than 0.13; run ci/setup.sh")
        return EngineInfo(
            server_version=server,
            buildx_version=bx_version,
            builder=b.name,
            driver=b.driver,
            cpus=int(info.n_cpu or 1),
            memory_bytes=int(info.mem_total or 0),
            native=platforms.native_platforms(info.architecture, [n.platforms or [] for n in b.nodes or []]),
        )

    def build(self, req: BuildRequest, log_path: Path, echo: Callable[[str], None]) -> BuildResult:
        """Build into the local image store (or push, with ``req.push``), streaming the plain
        progress log to ``log_path`` and, through ``buildlog.Relay``, to ``echo``."""
        from python_on_whales.exceptions import DockerException

        metadata_file = log_path.parent / contract.METADATA_NAME
        env = {"SOURCE_DATE_EPOCH": str(req.source_date_epoch)} if req.source_date_epoch is not None else {}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("a", encoding="utf-8") as log, localsync.keyed_context(req) as context:
            try:
                first, stream = _start_stream(lambda: self._buildx_lines(req, context, metadata_file), env)
                relay = buildlog.Relay(echo, plain=plain())  # as the operator reads it; the file keeps every line
                for line in itertools.chain([first] if first is not None else [], stream):
                    line = redact(line)
                    log.write(line)
                    log.flush()
                    relay(line.rstrip("\n"))
            except DockerException as exc:
                log.write(f"\n[k3-builder] buildx exited with code {exc.return_code}\n")
                last = _last_error(log_path)
                refused = _registry_failure(last, req.tags)
                if refused:
                    raise RegistryUnavailable(f"{refused}: {last} (log: {log_path})") from None
                raise BuildError(f"buildx build failed (exit {exc.return_code}): {last}", str(log_path)) from None
            except KeyboardInterrupt:
                pids = _stop_children("buildx") or "none left"
                log.write(f"\n[k3-builder] interrupted: stopped buildx (pids {pids}); records untouched\n")
                raise
        try:
            metadata = json.loads(metadata_file.read_text())
        except (OSError, ValueError):
            raise BuildError("buildx wrote no readable metadata file", str(log_path)) from None
        # A local build's metadata names the manifest (docker-container --load) or the config (the
        # docker driver) as containerimage.digest; the config digest is the image ID in both.
        digest = metadata.get("containerimage.digest" if req.push else "containerimage.config.digest")
        if not digest or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise BuildError(f"buildx metadata has no image digest: {sorted(metadata)}", str(log_path))
        return BuildResult(digest=digest)

    def _buildx_lines(self, req: BuildRequest, context: Path, metadata_file: Path) -> Iterator[str]:
        """`docker buildx build` of ``req`` with ``context`` as its default context (``req.context``
        through localsync's link), its plain progress log line by line (lazily: the first line read
        spawns the child)."""
        lines = self.docker.buildx.build(
            context,
            file=req.dockerfile,
            tags=list(req.tags),
            build_args=dict(req.build_args),
            build_contexts={k: str(v) for k, v in req.build_contexts.items()},
            push=req.push,
            load=not req.push,
            cache=not req.no_cache,
            builder=req.builder,
            secrets=list(req.secrets),
            metadata_file=metadata_file,
            # Off unless asked for, explicitly: buildx's default provenance would make the pushed
            # digest an image + attestation index, which an image index must not nest.
            provenance={"mode": "max"} if req.attest else False,
            sbom=True if req.attest else False,
            cache_from=[_cache_spec(spec) for spec in req.cache_from] or None,
            cache_to=_cache_spec(req.cache_to) if req.cache_to else None,
            platforms=[req.platform] if req.platform else None,
            progress="plain",
            stream_logs=True,
        )
        # With stream_logs=True it returns the log's lines (its annotation is every mode's result).
        return cast("Iterator[str]", lines)

    @contextmanager
    def export_image(self, image_id: str) -> Iterator[IO[bytes]]:
        """`docker save` of a local image, as a stream (an OCI layout tar on Docker >= 25: blobs
        named by digest, layers uncompressed and named by their diff_id): read once, never on disk."""
        docker = [*self.docker.client_config.docker_cmd, "save", image_id]
        try:
            proc = subprocess.Popen(docker, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except FileNotFoundError:
            raise EngineUnavailable("docker CLI not found; run ci/setup.sh") from None
        assert proc.stdout is not None and proc.stderr is not None
        try:
            yield proc.stdout
        finally:
            ended = proc.poll()  # exited on its own: it wrote the whole image, or failed
            proc.stdout.close()
            if ended is None:
                proc.kill()  # the reader stopped early (a hit): the rest is not needed
            proc.wait()
            err = proc.stderr.read().decode(errors="replace").strip()
            proc.stderr.close()
            if ended not in (None, 0):  # said instead of the reader's error on the stream it cut short
                raise BuildError(f"docker save {image_id[:19]} failed (exit {ended}): {redact(err)[-300:]}")

    def push(self, ref: str) -> str:
        """`docker push` of the local image tagged ``ref``: the manifest digest the registry took."""
        from python_on_whales.exceptions import DockerException

        try:
            out = _run([*self.docker.client_config.docker_cmd, "push", ref])
        except DockerException as exc:
            text = (exc.stderr or str(exc)).strip()
            last = redact(text.splitlines()[-1]) if text else "no output"
            refused = _registry_failure(last, (ref,))
            if refused:
                raise RegistryUnavailable(f"{refused}: {last[:300]}") from None
            raise BuildError(f"docker push {ref} failed: {last[:300]}") from None
        found = re.findall(r"digest: (sha256:[0-9a-f]{64})", out)
        if not found:
            raise BuildError(f"docker push {ref} named no digest: {redact(out)[-300:]}")
        return found[-1]

    def remove_image(self, image_id: str) -> None:
        """Remove a local image and every tag on it (the image a scan hit refused)."""
        with docker_errors(f"cannot remove the local image {image_id[:19]}"):
            self.docker.image.remove(image_id, force=True)

    def import_and_push(self, rootfs_tar: Path, ref: str, platform: str | None = None) -> str:
        """Import a root filesystem tarball as an image (of ``platform``, default the engine's own),
        push it, return the registry's digest."""
        with docker_errors(f"cannot import and push {ref}"):
            self.docker.import_(rootfs_tar, tag=ref, platform=platform)
            self.docker.image.push(ref, quiet=True)
        digest = self.registry.resolve_digest(ref)
        if not digest:
            raise BuildError(f"pushed {ref} but the registry does not serve it")
        return digest

    def image_config(self, ref: str) -> ImageConfig:
        """The image's config (labels, env, user), pulling it first if the engine lacks it."""
        with docker_errors(f"cannot pull or inspect {ref}"):
            if not self.docker.image.exists(ref):
                self.docker.image.pull(ref, quiet=True)
            img = self.docker.image.inspect(ref)
        cfg = img.config
        env = dict(item.split("=", 1) for item in (cfg.env or []) if "=" in item)
        return ImageConfig(
            ref=ref,
            id=img.id,
            labels=dict(cfg.labels or {}),
            env=env,
            user=cfg.user or "",
            entrypoint=tuple(cfg.entrypoint or ()),
            cmd=tuple(cfg.cmd or ()),
        )

    def describe(self) -> dict[str, str]:
        """`docker version` and `docker info` as text, for evidence bundles."""
        out = {}
        for name, args in (("docker-version", ["version"]), ("docker-info", ["info"])):
            with docker_errors(f"docker {args[0]} failed", unreachable=True):
                out[name] = _run(self.docker.client_config.docker_cmd + args)
        return out

    def image_inspect(self, ref: str) -> str:
        """`docker image inspect` JSON of a local image (tags and repo digests included)."""
        with docker_errors(f"cannot inspect {ref}"):
            return _run(self.docker.client_config.docker_cmd + ["image", "inspect", ref])


def _run(args: list[str]) -> str:
    from python_on_whales.utils import run

    return run(args, return_stderr=False)


def _stop_children(name: str, grace: float = 10.0) -> list[int]:
    """SIGINT, then SIGKILL, every child process of ours whose command line mentions ``name``.

    A SIGINT typed at a terminal reaches the whole process group, but a SIGTERM from a CI runner
    or ``kill`` reaches only us: python-on-whales does not expose the buildx process, so find it.
    """
    me = str(os.getpid())
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = stat.rsplit(")", 1)[1].split()[1]
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if ppid == me and name in cmdline:
            pids.append(int(entry.name))
    for pid in pids:
        try:
            os.kill(pid, signal.SIGINT)  # buildx cancels the build on SIGINT
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for pid in pids:
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    break
            except ChildProcessError:
                break
            time.sleep(0.05)
        if Path(f"/proc/{pid}").exists():
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
    return pids


def _cache_spec(spec: str) -> dict[str, str]:
    """'type=registry,ref=R,mode=max' -> dict; a bare reference means a registry cache."""
    if "=" not in spec:
        return {"type": "registry", "ref": spec}
    return dict(item.split("=", 1) for item in spec.split(",") if "=" in item)


_AUTH = (
    "no basic auth credentials",
    "401 unauthorized",
    "unauthorized: authentication required",
    "denied: requested access",
    "insufficient_scope",
)


# The registry's own 5xx during the push (a proxy or an overloaded registry): not a failed build.
_SERVER_ERROR = re.compile(
    r"\b50[0234] (?:Service Unavailable|Bad Gateway|Gateway Timeout|Internal Server Error)\b"
    r"|\bstatus(?: code)?:? 50[0234]\b",
    re.I,
)


def _registry_failure(error: str, tags: tuple[str, ...] | list[str]) -> str | None:
    """What went wrong with the registry the image goes to, when buildx's last error says it
    could not be reached (stopped, refused, timed out) or would not take our credentials: both
    are out of our hands (exit 3), not a failed build. A RUN step that fails on the network names
    another host, so it stays a failed build (exit 1)."""
    hosts = sorted({tag.split("/", 1)[0] for tag in tags if "/" in tag})
    server = _SERVER_ERROR.search(error)
    if server and any(h in error for h in hosts):
        host = next(h for h in hosts if h in error)
        return f"registry {host} answered {server.group().strip()} during the push (a server error, out of our hands)"
    if is_network_failure(error):
        named = next((h for h in hosts if h in error), None)
        return f"registry {named} out of reach during the build" if named else None
    if hosts and any(marker in error.lower() for marker in _AUTH):
        return (
            f"registry {hosts[0]} refused the build's credentials (docker login {hosts[0]}, or a "
            "credHelpers entry in ~/.docker/config.json)"
        )
    return None


def _last_error(log_path: Path) -> str:
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return "see the log"
    for line in reversed(lines):
        if "ERROR:" in line or "error:" in line.lower():
            return line.strip()[:300]
    return lines[-1].strip()[:300] if lines else "see the log"

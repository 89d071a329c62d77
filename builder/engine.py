"""The one engine seam: every Docker, buildx and registry call lives here.

The rest of the code asks for ``preflight``/``build``/``resolve_digest``/``serves`` and gets
typed results or a ``BuildError``/``EngineUnavailable``. Unit tests swap this class for a fake;
integration tests use it against the real engine and registry.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from python_on_whales import DockerClient
from python_on_whales.exceptions import DockerException
from python_on_whales.utils import run

from builder.errors import BuildError, EngineUnavailable
from builder.log import redact
from builder.registry import Manifest, Registry, RegistryError, split_ref

MIN_ENGINE = (25, 0)
MIN_BUILDX = (0, 13)


@dataclass(frozen=True)
class EngineInfo:
    server_version: str
    buildx_version: str
    builder: str
    driver: str
    cpus: int
    memory_bytes: int


@dataclass(frozen=True)
class BuildRequest:
    context: Path
    dockerfile: Path
    tags: tuple[str, ...]
    build_args: dict[str, str]
    build_contexts: dict[str, Path] = field(default_factory=dict)
    source_date_epoch: int | None = None
    push: bool = True
    no_cache: bool = False
    builder: str | None = None
    secrets: tuple[str, ...] = ()  # buildx --secret specs (id=...,src=...); values never logged
    attest: bool = False  # BuildKit provenance + SBOM attestations (not on the docker driver)
    cache_from: tuple[str, ...] = ()  # buildx --cache-from specs (a bare ref means type=registry)
    cache_to: str | None = None  # buildx --cache-to spec, e.g. type=inline or type=registry,ref=...,mode=max


@dataclass(frozen=True)
class ImageConfig:
    ref: str
    id: str
    labels: dict[str, str]
    env: dict[str, str]
    user: str
    entrypoint: tuple[str, ...]


@dataclass(frozen=True)
class BuildResult:
    digest: str  # manifest digest the registry serves (from buildx's metadata file)
    config_digest: str | None
    metadata: dict


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


class Engine:
    def __init__(self, docker: DockerClient | None = None) -> None:
        self.docker = docker or DockerClient()

    def preflight(self, builder: str | None = None) -> EngineInfo:
        try:
            info = self.docker.system.info()
            bx = self.docker.buildx.version()
            b = self.docker.buildx.inspect(builder)
        except DockerException as exc:
            first = (exc.stderr or str(exc)).strip().splitlines()
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
        )

    def build(self, req: BuildRequest, log_path: Path, echo: Callable[[str], None]) -> BuildResult:
        """Build (and push), streaming the plain progress log to ``log_path`` and ``echo``."""
        metadata_file = log_path.parent / "metadata.json"
        env = {"SOURCE_DATE_EPOCH": str(req.source_date_epoch)} if req.source_date_epoch is not None else {}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("a", encoding="utf-8") as log:
            try:
                first, stream = _start_stream(lambda: self.docker.buildx.build(
                    req.context,
                    file=req.dockerfile,
                    tags=list(req.tags),
                    build_args=dict(req.build_args),
                    build_contexts={k: str(v) for k, v in req.build_contexts.items()},
                    push=req.push,
                    cache=not req.no_cache,
                    builder=req.builder,
                    secrets=list(req.secrets),
                    metadata_file=metadata_file,
                    provenance={"mode": "max"} if req.attest else None,
                    sbom=True if req.attest else None,
                    cache_from=[_cache_spec(spec) for spec in req.cache_from] or None,
                    cache_to=_cache_spec(req.cache_to) if req.cache_to else None,
                    progress="plain",
                    stream_logs=True,
                ), env)
                for line in itertools.chain([first] if first is not None else [], stream):
                    line = redact(line)
                    log.write(line)
                    log.flush()
                    echo(line.rstrip("\n"))
            except DockerException as exc:
                log.write(f"\n[k3-builder] buildx exited with code {exc.return_code}\n")
                raise BuildError(f"buildx build failed (exit {exc.return_code}): {_last_error(log_path)}",
                                 str(log_path)) from None
            except KeyboardInterrupt:
                stopped = _stop_children("buildx")
                log.write(f"\n[k3-builder] interrupted: stopped buildx (pids {stopped or 'none left'}); "
                          "records untouched\n")
                raise
        try:
            metadata = json.loads(metadata_file.read_text())
        except (OSError, ValueError):
            raise BuildError("buildx wrote no readable metadata file", str(log_path)) from None
        digest = metadata.get("containerimage.digest")
        if not digest or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise BuildError(f"buildx metadata has no image digest: {sorted(metadata)}", str(log_path))
        return BuildResult(digest=digest, config_digest=metadata.get("containerimage.config.digest"),
                           metadata=metadata)

    def import_and_push(self, rootfs_tar: Path, ref: str) -> str:
        """Import a root filesystem tarball as an image, push it, return the registry's digest."""
        try:
            self.docker.import_(rootfs_tar, tag=ref)
            self.docker.image.push(ref, quiet=True)
        except DockerException as exc:
            raise BuildError(f"cannot import and push {ref}: {(exc.stderr or '').strip()[:200]}") from None
        digest = self.resolve_digest(ref)
        if not digest:
            raise BuildError(f"pushed {ref} but the registry does not serve it")
        return digest

    def image_config(self, ref: str) -> ImageConfig:
        """The image's config (labels, env, user), pulling it first if the engine lacks it."""
        try:
            if not self.docker.image.exists(ref):
                self.docker.image.pull(ref, quiet=True)
            img = self.docker.image.inspect(ref)
        except DockerException as exc:
            raise BuildError(f"cannot pull or inspect {ref}: {(exc.stderr or '').strip()[:200]}") from None
        cfg = img.config
        env = dict(item.split("=", 1) for item in (cfg.env or []) if "=" in item)
        return ImageConfig(ref=ref, id=img.id, labels=dict(cfg.labels or {}), env=env, user=cfg.user or "",
                           entrypoint=tuple(cfg.entrypoint or ()))

    def start(self, ref: str) -> str:
        """Start a container of ``ref`` that idles (no network) for checks; returns its id."""
        try:
            container = self.docker.run(ref, ["infinity"], entrypoint="sleep", detach=True,
                                        networks=["none"], labels={"io.k3-cu129.check": "1"})
        except DockerException as exc:
            raise BuildError(f"cannot start a container of {ref}: {(exc.stderr or '').strip()[:200]}") from None
        return container.id

    def copy_into(self, container_id: str, src: Path, dest: str) -> None:
        try:
            self.docker.container.copy(src, (container_id, dest))
        except DockerException as exc:
            raise BuildError(f"cannot copy into container {container_id[:12]}: {(exc.stderr or '').strip()[:200]}") from None

    def remove(self, container_id: str) -> None:
        try:
            self.docker.container.remove(container_id, force=True, volumes=True)
        except DockerException:
            pass  # already gone

    def describe(self) -> dict[str, str]:
        """`docker version` and `docker info` as text, for evidence bundles."""
        out = {}
        for name, args in (("docker-version", ["version"]), ("docker-info", ["info"])):
            try:
                out[name] = run(self.docker.client_config.docker_cmd + args)
            except DockerException as exc:
                raise EngineUnavailable(f"docker {args[0]} failed: {(exc.stderr or '').strip()[:200]}") from None
            except FileNotFoundError:
                raise EngineUnavailable("docker CLI not found") from None
        return out

    def image_inspect(self, ref: str) -> str:
        """`docker image inspect` JSON of a local image (tags and repo digests included)."""
        try:
            return run(self.docker.client_config.docker_cmd + ["image", "inspect", ref])
        except DockerException as exc:
            raise BuildError(f"cannot inspect {ref}: {(exc.stderr or '').strip()[:200]}") from None
        except FileNotFoundError:
            raise EngineUnavailable("docker CLI not found") from None

    def container_logs(self, name: str) -> str:
        try:
            out, err = run(self.docker.client_config.docker_cmd + ["logs", "--timestamps", name], return_stderr=True)
            return out + err
        except DockerException as exc:
            raise BuildError(f"cannot read the log of container {name}: {(exc.stderr or '').strip()[:200]}") from None
        except FileNotFoundError:
            raise EngineUnavailable("docker CLI not found") from None

    def run_python(self, ref: str, script: str) -> str:
        """Run a Python script in a throwaway container of ``ref`` with whichever python it has."""
        return self.run_capture(ref, "sh", ["-c", 'exec "$(command -v python3 || command -v python)" -c "$0"', script])

    def run_capture(self, ref: str, entrypoint: str, args: list[str]) -> str:
        """Run ``entrypoint args`` in a throwaway container of ``ref`` (no network); its stdout."""
        try:
            return self.docker.run(ref, args, entrypoint=entrypoint, remove=True, networks=["none"])
        except DockerException as exc:
            raise BuildError(f"cannot run {entrypoint} in {ref}: {(exc.stderr or '').strip()[:300]}") from None

    # -- registry: raw manifests, blobs, attached artifacts ------------------------------------
    def _registry(self, name: str) -> tuple[Registry, str]:
        host, repo = split_ref(name)
        return Registry(host), repo

    def raw_manifest(self, name: str, reference: str) -> Manifest | None:
        registry, repo = self._registry(name)
        try:
            return registry.manifest(repo, reference)
        except RegistryError as exc:
            raise EngineUnavailable(f"registry: {exc}") from None

    def platform_digest(self, name: str, digest: str) -> str:
        """The image manifest behind ``digest``: itself, or the one platform manifest of an index.

        With BuildKit attestations on (docker-container builders) buildx pushes an index whose
        attestation manifest carries invocation ids and times; reproducibility is a property of the
        platform manifest, so that is what comparisons use."""
        m = self.raw_manifest(name, digest)
        if m is None or "manifests" not in m.doc:
            return digest
        images = [d["digest"] for d in m.doc["manifests"]
                  if (d.get("annotations") or {}).get("vnd.docker.reference.type") != "attestation-manifest"]
        if len(images) != 1:
            raise BuildError(f"{name}@{digest}: an index of {len(images)} images; compare one platform at a time")
        return images[0]

    def blob(self, name: str, digest: str) -> bytes:
        registry, repo = self._registry(name)
        try:
            return registry.blob(repo, digest)
        except RegistryError as exc:
            raise EngineUnavailable(f"registry: {exc}") from None

    def attach(self, name: str, digest: str, artifact_type: str, content: bytes, annotations: dict[str, str]) -> str:
        """Attach an artifact (SBOM, provenance) to ``name@digest`` via the referrers tag schema."""
        registry, repo = self._registry(name)
        try:
            subject = registry.manifest(repo, digest)
            if subject is None:
                raise BuildError(f"cannot attach {artifact_type}: the registry does not serve {name}@{digest}")
            return registry.attach(repo, subject, artifact_type, content, annotations)
        except RegistryError as exc:
            raise BuildError(f"cannot attach {artifact_type} to {name}@{digest}: {exc}") from None

    def referrers(self, name: str, digest: str) -> dict[str, bytes]:
        registry, repo = self._registry(name)
        try:
            return registry.referrers(repo, digest)
        except RegistryError as exc:
            raise EngineUnavailable(f"registry: {exc}") from None

    def image_size(self, ref: str) -> int | None:
        """Compressed size in the registry: config plus layers of the manifest ``ref`` names."""
        doc = self._imagetools(ref, raw=True)
        if not doc or "layers" not in doc:
            return None
        return int(doc["config"]["size"]) + sum(int(layer["size"]) for layer in doc["layers"])

    def _imagetools(self, ref: str, raw: bool = False) -> dict | None:
        fmt = ["--raw"] if raw else ["--format", "{{json .Manifest}}"]
        cmd = self.docker.client_config.docker_cmd + ["buildx", "imagetools", "inspect", *fmt, ref]
        try:
            return json.loads(run(cmd))
        except DockerException as exc:
            text = (exc.stderr or "").lower()
            if "not found" in text or "manifest unknown" in text:
                return None
            raise EngineUnavailable(f"registry lookup of {ref} failed: {(exc.stderr or '').strip()[:200]}") from None

    def resolve_digest(self, ref: str) -> str | None:
        """The manifest digest the registry serves for ``ref`` (tag or digest), or None."""
        doc = self._imagetools(ref)
        return doc.get("digest") if doc else None

    def serves(self, name: str, digest: str) -> bool:
        """Whether the registry serves ``name@digest`` (content-addressed, so it is that image)."""
        return self.resolve_digest(f"{name}@{digest}") == digest

    def image_labels(self, ref: str) -> dict[str, str]:
        """Labels of an image in the registry (read from its config blob)."""
        cmd = self.docker.client_config.docker_cmd + [
            "buildx", "imagetools", "inspect", "--format", "{{json .Image}}", ref,
        ]
        try:
            doc = json.loads(run(cmd))
        except DockerException as exc:
            raise BuildError(f"cannot read the image config of {ref}: {(exc.stderr or '').strip()[:200]}") from None
        return (doc.get("config") or {}).get("Labels") or {}


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


def _last_error(log_path: Path) -> str:
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return "see the log"
    for line in reversed(lines):
        if "ERROR:" in line or "error:" in line.lower():
            return line.strip()[:300]
    return lines[-1].strip()[:300] if lines else "see the log"

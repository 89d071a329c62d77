"""A fake of the engine seam (builder/engine/seam.py ``Engine``, with the ``registry`` and
``containers`` seams of builder/engine/registry.py and builder/engine/containers.py), for unit
tests of the pipeline on a successful build, without Docker.

- ``FakeRegistry`` is an in-memory OCI registry: a digest is served only once a push put it there
  (``serve_pushes = False`` makes a registry that accepts the push and then does not serve it),
  tags move on each push, artifacts attach only to a served digest (as a real registry refuses
  a referrer whose subject it does not have).
- ``FakeEngine.build`` records each ``BuildRequest`` and makes a one-layer image from what the
  request hands the engine: the build arguments, the Dockerfile and the bytes of the default context, with every
  mtime at SOURCE_DATE_EPOCH; it keeps it in a local image store (``local``, by image ID: the
  config's digest), from which ``export_image`` streams it as an OCI layout tar, ``push`` sends it
  to the registry and ``remove_image`` drops it (a request with ``push`` pushes at once, as buildx
  --push does). The same request gives the same digest; ``reproducible = False`` adds a file that
  changes at every build (an unpinned timestamp), and ``extra_files`` adds files to every image
  (what a hostile build step copies into one: a file name's key is its path, PAX records and all).
- ``FakeRegistry.push_index`` tags an OCI image index naming served manifests by digest (as the
  real client does), which ``raw_manifest`` serves as an index and ``image_config`` follows to
  its linux/<arch> image; ``FakeEngine.build`` of a request with a ``platform`` makes that
  platform's image (its config's os and architecture).
- ``cmake_sandbox`` hands the build's kernel-plan preflight the pinned cmake run on this machine
  (tests/unit/cmakehost.py): only the tests' own trees run there.
- ``FakeContainers`` runs nothing but the SBOM's inventory probe: the image "has" the wheels the
  request's wheelhouse handed it. The image checks need a real container; tests monkeypatch
  builder/checks/runner.py ``run`` for them.

The calls that order the guarantees (preflight, build, export, remove, push, serves, inventory,
attach, delete)
are kept in ``events``, in order, so a test can say what happened before what.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import tarfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING

from builder.engine.registry import Manifest, split_reference
from builder.engine.seam import BuildRequest, BuildResult, EngineInfo, ImageConfig
from builder.errors import BuildError, RegistryUnavailable

if TYPE_CHECKING:
    from builder.engine.seam import Engine

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
GIB = 1024**3
_NO_CONTAINER = "no containers in the unit tests: monkeypatch builder.checks.runner.run for the image checks"
_WHEEL = re.compile(r"(?P<name>[^-]+)-(?P<version>[^-]+)(?:-\d[^-]*)?-(?P<tags>[^-]+-[^-]+-[^-]+)\.whl")


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class FakeRegistry:
    """RegistrySeam over dictionaries. Names are ``host/repository`` as the pipeline passes them."""

    def __init__(self, events: list[tuple]) -> None:
        self.events = events
        self.serve_pushes = True  # False: pushes are accepted, then never served
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[tuple[str, str], bytes] = {}  # (name, digest) -> raw manifest
        self.tags: dict[tuple[str, str], str] = {}  # (name, tag) -> digest
        self.attached: dict[tuple[str, str], dict[str, bytes]] = {}  # (name, digest) -> type -> content

    # --- what the fake engine calls ----------------------------------------------------------------

    def push(self, name: str, tag: str, config: dict, layers: list[bytes]) -> str:
        """Push an image (its blobs, its manifest, then the tag); returns its manifest digest."""
        config_raw = json.dumps(config, sort_keys=True).encode()
        doc = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "digest": _sha256(config_raw), "size": len(config_raw)},
            "layers": [{"mediaType": LAYER_TYPE, "digest": _sha256(b), "size": len(b)} for b in layers],
        }
        raw = json.dumps(doc, sort_keys=True).encode()
        digest = _sha256(raw)
        self.events.append(("push", name, tag, digest))
        if self.serve_pushes:
            for blob in (config_raw, *layers):
                self.blobs[_sha256(blob)] = blob
            self.manifests[(name, digest)] = raw
            self.tags[(name, tag)] = digest
        return digest

    # --- RegistrySeam ------------------------------------------------------------------------------

    def raw_manifest(self, name: str, reference: str) -> Manifest | None:
        digest = reference if reference.startswith("sha256:") else self.tags.get((name, reference))
        raw = self.manifests.get((name, digest)) if digest else None
        if not digest or raw is None:
            return None
        return Manifest(INDEX_TYPE if "manifests" in json.loads(raw) else MANIFEST_TYPE, digest, raw)

    def resolve_digest(self, ref: str) -> str | None:
        manifest = self.raw_manifest(*split_reference(ref))
        return manifest.digest if manifest else None

    def serves(self, name: str, digest: str) -> bool:
        served = self.resolve_digest(f"{name}@{digest}") == digest
        self.events.append(("serves", name, digest, served))
        return served

    def platform_digest(self, name: str, digest: str) -> str:
        manifest = self.raw_manifest(name, digest)
        if manifest is None or "manifests" not in manifest.doc:
            return digest
        images = manifest.doc["manifests"]
        if len(images) != 1:
            raise BuildError(f"{name}@{digest}: an index of {len(images)} images; compare one platform at a time")
        return images[0]["digest"]

    def push_index(self, name: str, tag: str, manifests: dict[str, str]) -> str:
        """An OCI image index naming served image manifests (as the real client: others refused)."""
        from builder.engine.registry import index_entry  # the real client's entries, from each config

        entries = [index_entry(self, name, platform, digest) for platform, digest in manifests.items()]
        raw = json.dumps({"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": entries}, sort_keys=True).encode()
        digest = _sha256(raw)
        self.events.append(("push_index", name, tag, digest))
        self.manifests[(name, digest)] = raw
        self.tags[(name, tag)] = digest
        return digest

    def blob(self, name: str, digest: str) -> bytes:
        if digest not in self.blobs:
            raise RegistryUnavailable(f"registry: {name} blob {digest[:19]}: not found")
        return self.blobs[digest]

    def blob_to(self, name: str, digest: str, dest: Path) -> None:
        Path(dest).write_bytes(self.blob(name, digest))

    def attach(self, name: str, digest: str, artifact_type: str, content: bytes, annotations: dict[str, str]) -> str:
        if (name, digest) not in self.manifests:
            raise RegistryUnavailable(f"registry: attaching {artifact_type} to {name}@{digest[:19]}: not served")
        self.events.append(("attach", name, digest, artifact_type))
        self.attached.setdefault((name, digest), {})[artifact_type] = content
        return _sha256(content)

    def referrers(self, name: str, digest: str) -> dict[str, bytes]:
        return dict(self.attached.get((name, digest), {}))

    def image_size(self, ref: str) -> int | None:
        manifest = self.raw_manifest(*split_reference(ref))
        if manifest is None or "layers" not in manifest.doc:
            return None
        doc = manifest.doc
        return int(doc["config"]["size"]) + sum(int(layer["size"]) for layer in doc["layers"])

    def delete_manifest(self, name: str, digest: str) -> bool:
        self.events.append(("delete", name, digest))
        self.manifests.pop((name, digest), None)
        for key in [k for k, v in self.tags.items() if k[0] == name and v == digest]:
            del self.tags[key]
        return True

    def image_config(self, ref: str, arch: str = "amd64") -> dict | None:
        name, _ = split_reference(ref)
        manifest = self.raw_manifest(*split_reference(ref))
        if manifest is not None and "manifests" in manifest.doc:  # an index: its linux/<arch> image
            mine = [d for d in manifest.doc["manifests"] if d["platform"]["architecture"] == arch]
            manifest = self.raw_manifest(name, mine[0]["digest"]) if mine else None
        return json.loads(self.blobs[manifest.doc["config"]["digest"]]) if manifest else None


def two_platform_base(engine: FakeEngine, name: str) -> str:
    """A base image index under ``name`` whose linux/amd64 and linux/arm64 images each have one layer
    of their own (diff_id ``sha256:<arch>``); its digest."""
    for arch in ("amd64", "arm64"):
        config = {"architecture": arch, "os": "linux", "rootfs": {"type": "layers", "diff_ids": [f"sha256:{arch}"]}}
        engine.registry.push(name, arch, config, [arch.encode()])
    return engine.registry.push_index(
        name, "multi", {f"linux/{a}": engine.registry.tags[(name, a)] for a in ("amd64", "arm64")}
    )


class FakeContainers:
    """ContainerSeam: only the inventory probe runs (builder/records/inventory.py); anything else
    needs a real container and fails loudly."""

    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine

    def run_python(self, ref: str, script: str) -> str:
        if "dpkg_status" not in script:
            raise NotImplementedError(f"FakeContainers runs only the inventory probe, not {script[:60]!r}")
        self.engine.events.append(("inventory", ref))
        dists = [
            json.dumps([name, version, "", "", [], [tags]])
            for name, version, tags in self.engine.installed.get(split_reference(ref)[1], [])
        ]
        return json.dumps(
            {
                "os_release": 'ID=debian\nVERSION_ID="12"\n',
                "dpkg_status": "",
                "dists": sorted(dists),
                "copyright": {},
            }
        )

    def start(self, ref: str, platform: str | None = None, mounts: tuple = ()) -> str:
        raise NotImplementedError(_NO_CONTAINER)

    def exec(self, container_id: str, argv: list[str], timeout: float):
        raise NotImplementedError(_NO_CONTAINER)

    def export(self, container_id: str):
        raise NotImplementedError(_NO_CONTAINER)

    def copy_into(self, container_id: str, src: Path, dest: str) -> None:
        raise NotImplementedError(_NO_CONTAINER)

    def remove(self, container_id: str) -> None:
        pass

    def remove_stale(self) -> int:
        return 0

    def run_capture(self, ref: str, entrypoint: str, args: list[str]) -> str:
        raise NotImplementedError(_NO_CONTAINER)

    def logs(self, name: str) -> str:
        raise NotImplementedError(_NO_CONTAINER)

    def run_online(self, ref: str, script: str, platform: str | None = None) -> str:
        raise NotImplementedError(_NO_CONTAINER)


class FakeEngine:
    """Engine: builds are recorded (``requests``) and pushed to the in-memory ``registry``, whose
    test-only knobs (``serve_pushes``...) the tests set directly: the Protocol's sub-seams are
    read-only, so the fake keeps its own types."""

    def __init__(self, *, reproducible: bool = True, driver: str = "docker-container") -> None:
        self.events: list[tuple] = []
        self.registry = FakeRegistry(self.events)
        self.containers = FakeContainers(self)
        self.reproducible = reproducible
        self.driver = driver
        self.requests: list[BuildRequest] = []
        self.extra_files: dict[str, bytes] = {}  # added to every image built (what a hostile build step installs)
        self.installed: dict[str, list[tuple[str, str, str]]] = {}  # digest -> (name, version, wheel tag)
        self.local: dict[str, tuple[dict, list[bytes], list]] = {}  # image ID -> config, layers, wheels
        self.local_tags: dict[str, str] = {}  # tag -> image ID

    def cmake_sandbox(self):
        """The kernel plan's sandbox (builder/pipeline/context.py cmake_sandbox): the pinned cmake on
        this machine, for the tests' own upstream-shaped trees (tests/unit/cmakehost.py)."""
        from tests.unit.cmakehost import HostCMake

        self.events.append(("kernel plan",))
        self.sandbox = HostCMake()
        return self.sandbox

    def preflight(self, builder: str | None = None) -> EngineInfo:
        self.events.append(("preflight", builder))
        return EngineInfo("27.5.1", "0.20.0", builder or "fake", self.driver, 4, 16 * GIB)

    def build(self, req: BuildRequest, log_path: Path, echo: Callable[[str], None]) -> BuildResult:
        self.requests.append(req)
        self.events.append(("build", req.tags))
        epoch = req.source_date_epoch or 0
        dockerfile = req.dockerfile.read_bytes()
        files = {
            "k3/build-args.json": json.dumps(_without_bases(req.build_args), sort_keys=True).encode(),
            "k3/Dockerfile": dockerfile,  # its bases (FROM) and steps make the image
            "k3/bases": _base_digests(dockerfile.decode(), req.build_args).encode(),
        }
        files.update({f"k3/context/{p.relative_to(req.context)}": p.read_bytes() for p in _files(req.context)})
        files.update(self.extra_files)
        if not self.reproducible:  # what an unpinned timestamp in a RUN step does to an image
            files["k3/build-stamp"] = f"build {len(self.requests)}\n".encode()
        layer = _layer(files, epoch)
        os_name, _, arch = (req.platform or "linux/amd64").partition("/")  # buildx --platform, or the engine's own
        config = {
            "architecture": arch,
            "os": os_name,
            "created": req.build_args.get("K3_CREATED", ""),
            "config": {"Labels": {"k3.fake.build": str(len(self.requests)) if not self.reproducible else "0"}},
            "rootfs": {"type": "layers", "diff_ids": [_sha256(gzip.decompress(layer))]},
        }
        image_id = _sha256(json.dumps(config, sort_keys=True).encode())
        self.local[image_id] = (config, [layer], _wheels(req.context))
        self.local_tags[req.tags[0]] = image_id
        with open(log_path, "a") as fh:
            fh.write(f"#1 writing image {image_id} naming to {req.tags[0]}\n")
        echo(f"#1 writing image {image_id}")
        return BuildResult(self.push(req.tags[0]) if req.push else image_id)

    @contextmanager
    def export_image(self, image_id: str) -> Iterator[IO[bytes]]:
        """The local image as `docker save` writes it: an OCI layout tar, blobs named by digest."""
        self.events.append(("export", image_id))
        config, layers, _ = self.local[image_id]
        blobs = [json.dumps(config, sort_keys=True).encode(), *layers]
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tar:
            for blob in blobs:
                info = tarfile.TarInfo("blobs/sha256/" + _sha256(blob).removeprefix("sha256:"))
                info.size = len(blob)
                tar.addfile(info, io.BytesIO(blob))
        out.seek(0)
        yield out

    def push(self, ref: str) -> str:
        image_id = self.local_tags[ref]
        config, layers, wheels = self.local[image_id]
        name, tag = split_reference(ref)
        digest = self.registry.push(name, tag, config, layers)
        self.installed[digest] = wheels
        return digest

    def remove_image(self, image_id: str) -> None:
        self.events.append(("remove", image_id))
        del self.local[image_id]
        for tag in [t for t, i in self.local_tags.items() if i == image_id]:
            del self.local_tags[tag]

    def import_and_push(self, rootfs_tar: Path, ref: str, platform: str | None = None) -> str:
        data = Path(rootfs_tar).read_bytes()
        name, tag = split_reference(ref)
        os_name, _, arch = (platform or "linux/amd64").partition("/")
        return self.registry.push(name, tag, {"architecture": arch, "os": os_name}, [gzip.compress(data, mtime=0)])

    def image_config(self, ref: str) -> ImageConfig:
        config = self._config(ref)
        inner = config.get("config") or {}
        return ImageConfig(
            ref, _sha256(json.dumps(config, sort_keys=True).encode()), inner.get("Labels") or {}, {}, "", ()
        )

    def describe(self) -> dict[str, str]:
        return {"engine": "fake", "buildx": "fake"}

    def image_inspect(self, ref: str) -> str:
        return json.dumps(self._config(ref))

    def _config(self, ref: str) -> dict:
        config = self.registry.image_config(ref)
        if config is None:
            raise BuildError(f"{ref}: not served by the fake registry")
        return config

    def builds(self) -> int:
        return len(self.requests)


_BASE_ARG = re.compile(r"ARG (\w+_BASE_IMAGE)=(\S+)")


def _without_bases(args: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in args.items() if not _BASE_ARG.fullmatch(f"ARG {k}=x")}


def _base_digests(dockerfile: str, args: dict[str, str]) -> str:
    """The digest each base is pulled by (a build arg over the Dockerfile's default): as BuildKit,
    the image depends on the base's digest, not on the name it was pulled under."""
    refs = {m[1]: args.get(m[1], m[2]) for m in _BASE_ARG.finditer(dockerfile)}
    return "".join(f"{k} {v.rpartition('@')[2]}\n" for k, v in sorted(refs.items()))


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _layer(files: dict[str, bytes], epoch: int) -> bytes:
    """A gzipped tar of ``files`` with fixed owners, modes and mtimes: the same files, the same bytes."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mtime, info.mode = len(data), epoch, 0o644
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(out.getvalue(), mtime=0)


def _wheels(context: Path) -> list[tuple[str, str, str]]:
    """What `pip install` of the context's runtime wheelhouse puts in the image: (name, version, tag)."""
    found = []
    for path in _files(context / "wheelhouse" / "layers"):
        m = _WHEEL.fullmatch(path.name)
        if m:
            found.append((m["name"].replace("_", "-"), m["version"], m["tags"]))
    return found


if TYPE_CHECKING:  # mypy holds the fake to the seam: `mypy tests/unit/fakeengine.py`
    _engine: Engine = FakeEngine()

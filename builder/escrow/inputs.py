"""What a recorded build read, as typed frozen records: one class per kind of input, each with the
digest that pins it and the name the record set gives it. Made offline from locks/<target>/
(image.json of each platform, both Python locks, os-packages.txt), the committed Dockerfile and
the matrix; nothing is downloaded here (builder/escrow/collect.py finds the bytes).

Every input has a ``key``: a stable, unique name ("wheel requirements.txt torch==2.9.0"), the key
of the escrow manifest.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from builder.config import contract
from builder.config.targetplatform import TargetPlatform
from builder.deps import lock, oslock
from builder.errors import RecordError
from builder.fsutil import sha256_file
from builder.records import store


class Kind(str, Enum):
    SOURCE = "source"  # a git tree at a commit: the source, a third-party tree, a submodule
    WHEEL = "wheel"  # a Python lock entry, by sha256
    DEB = "deb"  # an OS lock entry, by sha256
    BASE = "base"  # a base image, by digest, every platform it carries
    PYTHON = "python"  # the standalone CPython tarball, by sha256
    RECIPE = "recipe"  # a committed file the build reads: Dockerfile, locks


@dataclass(frozen=True)
class SourceInput:
    name: str  # "source", "third_party/<name>", "third_party/<name>/<submodule path>"
    url: str
    commit: str  # the pin (a git object id, not a sha256 of bytes: the bundle's digest is the escrow's)
    kind: Kind = Kind.SOURCE

    @property
    def key(self) -> str:
        return f"source {self.name}@{self.commit}"


@dataclass(frozen=True)
class WheelInput:
    lock: str  # the lock file, relative to the repository ("locks/cu129/requirements.txt")
    name: str
    version: str
    hashes: tuple[str, ...]  # the lock's sha256 (hex); the escrowed file is one of them
    kind: Kind = Kind.WHEEL

    @property
    def key(self) -> str:
        return f"wheel {self.lock} {self.name}=={self.version}"


@dataclass(frozen=True)
class DebInput:
    lock: str
    entry: oslock.DebEntry  # name, version, arch, url, size, sha256
    kind: Kind = Kind.DEB

    @property
    def key(self) -> str:
        return f"deb {self.lock} {self.entry.name}={self.entry.version} {self.entry.arch}"


@dataclass(frozen=True)
class BaseInput:
    role: str  # "build" or "runtime"
    platform: str  # the platform whose record names it, or "index": the tag's multi-platform index
    name: str  # the reference the record names (registry/repository:tag)
    digest: str  # sha256:...: an image index (every platform copied) or one image manifest
    kind: Kind = Kind.BASE

    @property
    def key(self) -> str:
        return f"base {self.role} {self.platform}"


@dataclass(frozen=True)
class PythonInput:
    platform: str
    url: str
    sha256: str
    kind: Kind = Kind.PYTHON

    @property
    def key(self) -> str:
        return f"python {self.platform}"


@dataclass(frozen=True)
class RecipeInput:
    path: str  # relative to the repository
    sha256: str
    kind: Kind = Kind.RECIPE

    @property
    def key(self) -> str:
        return f"recipe {self.path}"


Input = SourceInput | WheelInput | DebInput | BaseInput | PythonInput | RecipeInput


@dataclass(frozen=True)
class Inventory:
    target: str
    image: str  # the record's image reference (registry/repository@sha256:...)
    digest: str  # the recorded digest: the image index's for a multi-platform target
    inputs: tuple[Input, ...]

    def by_key(self) -> dict[str, Input]:
        return {i.key: i for i in self.inputs}


@dataclass(frozen=True)
class PlatformFiles:
    """Where one platform's committed files are (the first platform's are the target's own)."""

    platform: str
    record_dir: Path
    locks: Path
    dockerfile: Path


def platform_files(root: Path, target) -> list[PlatformFiles]:
    """Each platform's record directory, lock directory and Dockerfile, as verify reads them
    (builder/config/targetplatform.py: the first platform's files in place)."""
    out = []
    for platform in target.platform_names():
        where = TargetPlatform.of(target, platform if target.platforms else None)
        out.append(PlatformFiles(platform, where.record_dir(root), where.lock_dir(root), where.dockerfile(root)))
    return out


def recorded_digest(root: Path, target) -> tuple[str, str]:
    """(image, digest) of the target's top record: the index's for a multi-platform target."""
    import json

    path = contract.record_path(root, target.name)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return str(doc["image"]), str(doc["digest"])
    except FileNotFoundError:
        raise RecordError(f"{path}: no record: build the target before escrowing it") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RecordError(f"{path}: not a readable record ({exc.__class__.__name__}); restore it from git") from None


def inventory(root: Path, target) -> Inventory:
    """Every input the record set names, in a stable order (the escrow manifest's)."""
    image, digest = recorded_digest(root, target)
    found: dict[str, Input] = {}
    for files in platform_files(root, target):
        for item in _platform_inputs(root, target.for_platform(files.platform), files):
            found.setdefault(item.key, item)
    for item in _base_indexes(target, found):
        found.setdefault(item.key, item)
    return Inventory(target.name, image, digest, tuple(found.values()))


def _base_indexes(target, found: dict[str, Input]) -> list[BaseInput]:
    """The multi-platform index each base's tag had (matrix ``platforms.<p>.index``), beside the
    per-platform manifests the records name: copied whole, every platform it carries."""
    out = []
    for platform, spec in target.platforms.items():
        for role, digest in sorted(spec.index.items()):
            named = found.get(f"base {role} {platform}")
            if isinstance(named, BaseInput):
                out.append(BaseInput(role, "index", named.name, digest))
    return out


def _platform_inputs(root: Path, target, files: PlatformFiles) -> list[Input]:
    record = store.read(files.record_dir / contract.RECORD_NAME)
    if record is None:
        raise RecordError(f"{files.record_dir / contract.RECORD_NAME}: no record: build the target first")
    out: list[Input] = [*_sources(record.source)]
    out += [BaseInput(role, files.platform, b["name"], b["digest"]) for role, b in sorted(record.bases.items())]
    standalone = target.python.standalone if target.python.provider == "standalone" else None
    if standalone is not None:
        out.append(PythonInput(files.platform, str(standalone.url), standalone.sha256))
    out += _recipe(root, files, record)
    for path in (files.locks / contract.LOCK_NAME, files.locks / contract.BUILD_LOCK_NAME):
        out += [WheelInput(_rel(root, path), e.name, e.version, e.hashes) for e in lock.read_entries(path)]
    os_lock = files.locks / contract.OS_LOCK_NAME
    if record.os_lock_sha256 is not None:  # the build read it (_recipe checked it is that file)
        out += [DebInput(_rel(root, os_lock), e) for e in oslock.read(os_lock)]
    return out


def _recipe(root: Path, files: PlatformFiles, record) -> list[RecipeInput]:
    """The Dockerfile and locks, each the file the build read: its sha256 the record's, else the
    escrow would keep another recipe (and its wheels) under the recorded digest."""
    recorded = {
        files.dockerfile: record.dockerfile_sha256,
        files.locks / contract.LOCK_NAME: record.lock_sha256,
        files.locks / contract.BUILD_LOCK_NAME: record.build_lock_sha256,
        files.locks / contract.OS_LOCK_NAME: record.os_lock_sha256,
    }
    out = []
    for path, want in recorded.items():
        if want is None:  # no OS lock in this build
            continue
        got = sha256_file(path) if path.exists() else "no file"
        if got != want:
            raise RecordError(
                f"{_rel(root, path)}: sha256 {got[:16]} is not the recorded {want[:16]} "
                f"({files.record_dir.name}/{contract.RECORD_NAME}): changed since the build; escrow the build it "
                "records (restore the file from git) or build again"
            )
        out.append(RecipeInput(_rel(root, path), want))
    return out


def _sources(source: dict) -> list[SourceInput]:
    out = [SourceInput("source", str(source["url"]), str(source["commit"]))]
    for name, tree in sorted((source.get("third_party") or {}).items()):
        out.append(SourceInput(f"third_party/{name}", str(tree["url"]), str(tree["commit"])))
        for sub in tree.get("submodules") or []:
            out.append(SourceInput(f"third_party/{name}/{sub['path']}", str(sub["url"]), str(sub["commit"])))
    return out


def _rel(root: Path, path: Path) -> str:
    return path.resolve().relative_to(root.resolve()).as_posix()

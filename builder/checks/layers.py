"""The image's layers as the tool reads them on the host (issue 51): whiteouts and file capabilities.

Read from ``docker save`` (an OCI layout tar: blobs named by digest, index.json and Docker's
manifest.json naming the layers in order), once, forward only, never written to disk; each layer is
an untrusted tar like the exported file system (imagefiles.py): names normalised, never followed,
members counted. What a layer keeps here is small: its paths, its whiteouts, its file capabilities
and the base's dpkg file lists (to tell an OS package's file from any other). Each layer is named by
its diff_id as the saved config lists it (``rootfs.diff_ids``, which the engine checked against the
layer's bytes when it stored the image), so the pinned base's layers (``PinnedBase``) can be told
from the layers written after them.

Whiteouts are the OCI image spec's (image-spec/layer.md "Whiteouts"): an entry ``.wh.NAME`` removes
NAME (and what is under it) of the lower layers; ``.wh..wh..opq`` in a directory removes everything
the lower layers have in it.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import tarfile
from dataclasses import dataclass, field
from typing import IO, cast

from builder.checks import layercache
from builder.checks.imagefiles import MAX_MEMBERS, BoundedInfo, UnreadableImage, capability

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
# dpkg's file lists (info/NAME.list: absolute paths) and md5sums (info/ or a distroless status.d/:
# "md5  relative/path"), either of which names a package's files.
_DPKG_LIST = re.compile(r"^/var/lib/dpkg/(?:info|status\.d)/([^/]+)\.(list|md5sums)$")
MAX_JSON = 4 << 20


@dataclass(frozen=True)
class PinnedBase:
    """The pinned runtime base's layers, bottom first, as its registry or the local engine lists
    them (``rootfs.diff_ids`` of its config); ``unread`` says why they could not be read."""

    ref: str  # name@digest, as the matrix pins it ("" when the target pins none for the platform)
    diff_ids: tuple[str, ...] = ()
    unread: str = ""  # "" when diff_ids holds the base's layers


@dataclass
class Layer:
    digest: str
    diff_id: str = ""  # the saved config's rootfs.diff_ids entry for it ("" when the config names none)
    paths: set[str] = field(default_factory=set)
    removed: list[str] = field(default_factory=list)  # what its .wh. entries remove
    opaque: list[str] = field(default_factory=list)  # directories its opaque whiteouts empty
    capabilities: dict[str, bytes] = field(default_factory=dict)
    packages: dict[str, str] = field(default_factory=dict)  # file -> the dpkg package whose .list names it
    links: dict[str, str] = field(default_factory=dict)  # symbolic link -> its target

    def gone(self) -> tuple[set[str], set[str]]:
        """(what its whiteouts remove, the directories its opaque whiteouts empty), normalised: a
        whiteout named ``.wh...`` removes its directory's parent, as the engine's join of the name does."""
        return {posixpath.normpath(p) for p in self.removed}, {posixpath.normpath(d) for d in self.opaque}


@dataclass
class Layers:
    ordered: list[Layer]

    def capabilities(self) -> dict[str, str]:
        """path -> the layer (digest) whose file capability is in the merged file system."""
        caps: dict[str, str] = {}
        for layer in self.ordered:
            gone, emptied = layer.gone()
            caps = {p: d for p, d in caps.items() if not (_within(p, gone) or _within(p, emptied, strict=True))}
            for path in layer.paths:
                caps.pop(path, None)
            caps.update(dict.fromkeys(layer.capabilities, layer.digest))
        return caps

    def removed_base_files(self) -> list[tuple[str, str, str]]:
        """(path, removing layer's digest, dpkg package or "") of every path a lower layer has that
        a later layer's whiteout removes, opaque whiteouts included."""
        below: set[str] = set()
        packages: dict[str, str] = {}
        links: dict[str, str] = {}
        found = []
        for layer in self.ordered:
            gone, emptied = layer.gone()
            hit = {p for p in below if _within(p, gone) or (p not in layer.paths and _within(p, emptied, strict=True))}
            if hit:
                # dpkg lists name paths as the package ships them (/bin/ls); a merged-/usr root holds
                # them through links (/bin -> usr/bin): both sides compared with their links resolved.
                owner = {_resolved(p, links): pkg for p, pkg in packages.items()}
                found += [(p, layer.digest, owner.get(_resolved(p, links), "")) for p in sorted(hit)]
                below -= hit
            below |= layer.paths
            packages.update(layer.packages)
            links.update(layer.links)
        return found

    def last_writer(self, path: str) -> int | None:
        """The index of the layer whose entry for ``path`` is the one in the merged file system (the
        last layer that writes it; None: no layer does). An entry named through a directory link
        (``lib/x`` over a base's ``/lib -> usr/lib``) counts where the link leads: an applier that
        follows the links of the layers below it (or of its own) writes it there."""
        name, links, found = "/" + posixpath.basename(path), {}, None
        for i, layer in enumerate(self.ordered):
            links.update(layer.links)
            if path in layer.paths or any(_resolved(p, links) == path for p in layer.paths if p.endswith(name)):
                found = i
        return found

    def written(self, start: int, stop: int | None = None) -> set[str]:
        """Every path the layers ``start`` to ``stop`` (exclusive; None: the top) write, named where
        it lands (through the directory links of the layers up to it, as ``last_writer`` names them)."""
        links: dict[str, str] = {}
        for layer in self.ordered[:start]:
            links.update(layer.links)
        found: set[str] = set()
        for layer in self.ordered[start:stop]:
            links.update(layer.links)
            found |= {_resolved(p, links) for p in layer.paths}
        return found

    def base_count(self, base: PinnedBase) -> int | str:
        """How many of the bottom layers are the pinned base's (their diff_ids, in order, are the
        base's), or why that cannot be said: the base unread, or the image not built on it."""
        if base.unread or not base.diff_ids:
            return f"the pinned runtime base's layers were not read ({base.unread or 'it lists none'})"
        mine = tuple(layer.diff_id or layer.digest for layer in self.ordered[: len(base.diff_ids)])
        if mine != base.diff_ids:
            return f"the image's bottom layers are not the pinned runtime base {base.ref}'s: it is not built on it"
        return len(base.diff_ids)


def _within(path: str, tops: set[str], strict: bool = False) -> bool:
    """Whether ``path`` (or, ``strict``, one of its ancestors only) is in ``tops``: one set lookup per
    ancestor, so a layer of many whiteouts over many files stays linear."""
    if not tops:
        return False
    here = posixpath.dirname(path) if strict and path != "/" else path
    while True:
        if here in tops:
            return not (strict and here == path)
        if here == "/":
            return False
        here = posixpath.dirname(here)


def _resolved(path: str, links: dict[str, str]) -> str:
    """``path`` with the links of its directories followed (at most 40), as the kernel would."""
    parts, done, hops = [p for p in path.split("/") if p], "", 0
    while parts:
        part = parts.pop(0)
        here = posixpath.dirname(done) if part == ".." else f"{done}/{part}"
        if here in links and parts and hops < 40:
            hops += 1
            target = links[here]
            parts = [p for p in (target if target.startswith("/") else f"{done}/{target}").split("/") if p] + parts
            done = ""
            continue
        done = here
    return posixpath.normpath(done or "/")


def _normal(name: str) -> str | None:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if "\0" in name or ".." in parts:
        return None
    return "/" + "/".join(parts)


def read_layer(fileobj: IO[bytes], digest: str) -> Layer:
    """One layer tar (plain or gzip), read as a stream."""
    layer = Layer(digest)
    with tarfile.open(fileobj=fileobj, mode="r|*", tarinfo=BoundedInfo) as tar:
        for count, member in enumerate(tar):
            if count >= MAX_MEMBERS:
                raise UnreadableImage(f"layer {digest[:19]}: more than {MAX_MEMBERS} members")
            path = _normal(member.name)
            if path is None:
                raise UnreadableImage(f"layer {digest[:19]}: a member named {member.name[:200]!r}")
            base, name = posixpath.split(path)
            if name == OPAQUE:
                layer.opaque.append(base)
                continue
            if name.startswith(WHITEOUT):
                layer.removed.append(posixpath.join(base, name[len(WHITEOUT) :]))
                continue
            layer.paths.add(path)
            if member.issym():
                layer.links[path] = member.linkname
            cap = capability(member.pax_headers)
            if cap:
                layer.capabilities[path] = cap
            package = _DPKG_LIST.match(path)
            if package and member.isfile():
                _read_list(tar, member, package.group(1), package.group(2), layer)
    return layer


def _read_list(tar: tarfile.TarFile, member: tarfile.TarInfo, name: str, kind: str, layer: Layer) -> None:
    data = tar.extractfile(member)
    text = data.read(8 << 20).decode("utf-8", "replace") if data else ""
    for line in text.splitlines():
        path = line if kind == "list" else line.partition("  ")[2]
        if path and (kind == "md5sums" or path.startswith("/")):
            layer.packages[posixpath.normpath("/" + path.lstrip("/"))] = name.split(":")[0]


def _is_tar(head: bytes) -> bool:
    return head[:2] == b"\x1f\x8b" or head[257:262] == b"ustar" or (len(head) >= 512 and not head.strip(b"\0"))


def read(stream: IO[bytes]) -> Layers:
    """The layers of a ``docker save`` stream, in the order the image's manifest names them."""
    layers: dict[str, Layer] = {}
    docs: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=stream, mode="r|", tarinfo=BoundedInfo) as outer:
            for member in outer:
                if not member.isfile():
                    continue
                blob = outer.extractfile(member)
                if blob is None:
                    continue
                name = member.name.removeprefix("./")
                head = blob.peek(512)[:512] if hasattr(blob, "peek") else b""
                if len(head) >= 512 and _is_tar(head) or head[:2] == b"\x1f\x8b":
                    layers[name] = _layer(blob, name.rsplit("/", 1)[-1])
                elif member.size <= MAX_JSON:
                    docs[name] = blob.read()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise UnreadableImage(f"the saved image is not a readable tar: {exc}") from None
    order, config = _order(docs)
    diff_ids = _diff_ids(docs, config)
    missing = [n for n in order if n not in layers]
    if missing:
        raise UnreadableImage(f"the saved image's manifest names layers it does not carry: {', '.join(missing[:3])}")
    ordered = [layers[n] for n in order]
    if len(diff_ids) == len(ordered):
        for layer, diff_id in zip(ordered, diff_ids, strict=True):
            layer.diff_id = diff_id
    return Layers(ordered)


class _Hashed:
    """A blob read through sha256: what layers.py parsed (or skipped) is then held to its name."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw, self.sha = raw, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.sha.update(data)
        return data

    def drained(self) -> str:
        while self.read(1 << 20):
            pass
        return self.sha.hexdigest()


def _layer(blob: IO[bytes], hexdigest: str) -> Layer:
    """One saved layer blob: its kept reading (layercache.py) when the bytes hash to the digest that
    names them, else read here (and kept when they do)."""
    hashed = _Hashed(blob)
    kept = layercache.load(hexdigest)
    if kept is not None:
        if hashed.drained() != hexdigest:
            raise UnreadableImage(f"the saved layer named sha256:{hexdigest[:12]} does not hash to its name")
        return _from_fields(f"sha256:{hexdigest}", kept)
    layer = read_layer(cast(IO[bytes], hashed), f"sha256:{hexdigest}")  # tarfile's stream mode calls read() only
    if hashed.drained() == hexdigest:
        layercache.store(hexdigest, _fields(layer))
    return layer


def kept(diff_ids: list[str]) -> Layers | None:
    """The layers ``diff_ids`` name (bottom first: the engine's ``rootfs.diff_ids`` of the image),
    from their kept readings alone, or None when one is not kept (the image is then streamed).

    A reading is kept under the sha256 of the bytes it was read from (``_layer``) and a diff_id is
    the sha256 of the layer's uncompressed tar, which the engine holds each layer to (checked when
    it stores the layer, and again on every stream of it): a kept reading of every diff_id is what
    streaming the image would read. The engine's store names a saved layer blob by its diff_id, so
    these are the names a stream's readings were kept under; a store that names blobs otherwise
    (compressed) finds none kept here and streams."""
    found = []
    for diff_id in diff_ids:
        algorithm, _, hexdigest = diff_id.partition(":")
        fields = layercache.load(hexdigest) if algorithm == "sha256" else None
        if fields is None:
            return None
        layer = _from_fields(diff_id, fields)
        layer.diff_id = diff_id
        found.append(layer)
    return Layers(found) if found else None


def _fields(layer: Layer) -> dict:
    return {
        "paths": sorted(layer.paths),
        "removed": layer.removed,
        "opaque": layer.opaque,
        "capabilities": {p: c.hex() for p, c in layer.capabilities.items()},
        "packages": layer.packages,
        "links": layer.links,
    }


def _from_fields(digest: str, fields: dict) -> Layer:
    return Layer(
        digest,
        paths=set(fields["paths"]),
        removed=list(fields["removed"]),
        opaque=list(fields["opaque"]),
        capabilities={p: bytes.fromhex(c) for p, c in fields["capabilities"].items()},
        packages=dict(fields["packages"]),
        links=dict(fields["links"]),
    )


def _order(docs: dict[str, bytes]) -> tuple[list[str], str]:
    """The layer blobs' names in image order and the config blob's name: Docker's manifest.json,
    else index.json's manifest."""
    try:
        if "manifest.json" in docs:
            entry = json.loads(docs["manifest.json"])[0]
            order, config = list(entry["Layers"]), entry.get("Config", "")
        else:
            index = json.loads(docs["index.json"])
            digest = index["manifests"][0]["digest"]
            manifest = json.loads(docs["blobs/sha256/" + digest.split(":", 1)[1]])
            order = ["blobs/sha256/" + layer["digest"].split(":", 1)[1] for layer in manifest["layers"]]
            config = "blobs/sha256/" + str((manifest.get("config") or {}).get("digest", "")).partition(":")[2]
        if not all(isinstance(name, str) for name in order):
            raise TypeError("a layer named by something other than a string")
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, RecursionError) as exc:
        # AttributeError: a digest that is no string; RecursionError: JSON nested past the parser's depth
        raise UnreadableImage(f"the saved image names no layer order (manifest.json, index.json): {exc}") from None
    return order, config if isinstance(config, str) else ""


def _diff_ids(docs: dict[str, bytes], config: str) -> list[str]:
    """The saved config's rootfs.diff_ids; [] when absent or malformed: the layers are then named by
    their blob digest alone (a classic store's blob digest is the diff_id)."""
    try:
        found = json.loads(docs[config])["rootfs"]["diff_ids"]
    except (KeyError, TypeError, ValueError, RecursionError):
        return []
    return found if isinstance(found, list) and all(isinstance(d, str) for d in found) else []

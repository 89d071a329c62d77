"""Broken variants of a pushed image made at the OCI level (issue 51): no build, no Dockerfile. The
image's manifest and config are read from the local registry, the config edited and/or a layer tar
written here appended, and the result pushed under a repository of its own (its layers mounted from
the original's, the new blobs uploaded), so a variant costs seconds and shares the original's layers.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import secrets
import tarfile
import urllib.error
import urllib.request
from collections.abc import Callable

from tests.integration.conftest import MANIFEST_TYPES, REGISTRY

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
LAYER_TYPE = {
    OCI_MANIFEST: "application/vnd.oci.image.layer.v1.tar+gzip",
    DOCKER_MANIFEST: "application/vnd.docker.image.rootfs.diff.tar.gzip",
}


def _call(method: str, url: str, data: bytes | None = None, headers: dict | None = None):
    req = urllib.request.Request(
        url if url.startswith("http") else f"http://{REGISTRY}{url}", data, headers or {}, method=method
    )
    return urllib.request.urlopen(req, timeout=60)


def _manifest(repository: str, reference: str) -> tuple[dict, str]:
    with _call("GET", f"/v2/{repository}/manifests/{reference}", headers={"Accept": MANIFEST_TYPES}) as resp:
        doc, kind = json.load(resp), resp.headers["Content-Type"]
    if "index" in kind or "list" in kind:
        amd64 = next(m for m in doc["manifests"] if m.get("platform", {}).get("architecture") == "amd64")
        return _manifest(repository, amd64["digest"])
    return doc, kind


def _blob(repository: str, digest: str) -> bytes:
    with _call("GET", f"/v2/{repository}/blobs/{digest}") as resp:
        return resp.read()


def _upload(repository: str, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with _call("POST", f"/v2/{repository}/blobs/uploads/", b"") as resp:
        location = resp.headers["Location"]
    sep = "&" if "?" in location else "?"
    target = location if location.startswith("http") else f"http://{REGISTRY}{location}"
    _call("PUT", f"{target}{sep}digest={digest}", data, {"Content-Type": "application/octet-stream"}).close()
    return digest


def _mount(repository: str, source: str, digest: str) -> None:
    with _call("POST", f"/v2/{repository}/blobs/uploads/?mount={digest}&from={source}", b"") as resp:
        if resp.status == 201:
            return
    _upload(repository, _blob(source, digest))  # the registry did not mount: copy it


def layer(members: list[tuple[str, str, int, int, bytes | str, dict]]) -> bytes:
    """A layer tar of (path, kind "file"/"dir"/"link", mode, uid, data or link target, PAX records)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, kind, mode, uid, data, pax in members:
            info = tarfile.TarInfo(path)
            info.mode, info.uid, info.gid, info.mtime, info.pax_headers = mode, uid, uid, 946684800, dict(pax)
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, str(data)
                tar.addfile(info)
            else:
                raw = data if isinstance(data, bytes) else data.encode()
                info.size = len(raw)
                tar.addfile(info, io.BytesIO(raw))
    return out.getvalue()


def push_variant(
    ref: str, edit: Callable[[dict], None] = lambda cfg: None, layers: tuple[bytes, ...] = ()
) -> tuple[str, str]:
    """(repository, reference by digest) of ``ref`` with its config edited by ``edit`` and
    ``layers`` (uncompressed tars) appended, pushed under a repository unique to this call."""
    name, _, tag = ref.removeprefix(f"{REGISTRY}/").partition(":")
    name, tag = (name, tag) if "@" not in ref else (ref.removeprefix(f"{REGISTRY}/").split("@")[0], ref.split("@")[1])
    manifest, kind = _manifest(name, tag)
    config = json.loads(_blob(name, manifest["config"]["digest"]))
    repository = f"k3/runtime-variant-{secrets.token_hex(4)}"
    for item in manifest["layers"]:
        _mount(repository, name, item["digest"])
    for tar in layers:
        packed = gzip.compress(tar, mtime=0)
        manifest["layers"].append(
            {"mediaType": LAYER_TYPE[kind], "size": len(packed), "digest": _upload(repository, packed)}
        )
        config["rootfs"]["diff_ids"].append("sha256:" + hashlib.sha256(tar).hexdigest())
        config.setdefault("history", []).append({"created_by": "k3 test: an OCI-level variant layer"})
    edit(config)
    raw = json.dumps(config).encode()
    manifest["config"] = {**manifest["config"], "size": len(raw), "digest": _upload(repository, raw)}
    body = json.dumps(manifest).encode()
    with _call("PUT", f"/v2/{repository}/manifests/variant", body, {"Content-Type": kind}) as resp:
        digest = resp.headers["Docker-Content-Digest"]
    return repository, f"{REGISTRY}/{repository}@{digest}"


def remove(repository: str, ref: str) -> None:
    """The variant's manifest deleted from the registry (its repository is this module's), its local copy removed."""
    import subprocess

    try:
        _call("DELETE", f"/v2/{repository}/manifests/{ref.rsplit('@', 1)[1]}").close()
    except urllib.error.HTTPError:
        pass
    subprocess.run(["docker", "image", "rm", "-f", ref], capture_output=True)

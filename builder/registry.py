"""A small OCI distribution client (HTTP API v2) for what buildx cannot do: fetch raw manifests
and blobs for comparisons, and attach SBOM/provenance artifacts to an image.

Registries without the referrers API (distribution 2.8 and 3.x) get artifacts the way the OCI
distribution spec 1.1 prescribes for them: each artifact is an image manifest whose ``subject``
is the image, and an image index tagged ``sha256-<hex of the image digest>`` lists them
(the "referrers tag schema"). Only engine.py uses this module.

Credentials: anonymous, or the basic credentials ``docker login`` stored in ~/.docker/config.json
(``auths``), exchanged for a bearer token where the registry asks for one. They never appear in
logs or errors.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_EMPTY = "application/vnd.oci.empty.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
ACCEPT = ", ".join([OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST])
EMPTY_JSON = b"{}"


class RegistryError(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Manifest:
    media_type: str
    digest: str
    raw: bytes

    @property
    def doc(self) -> dict:
        return json.loads(self.raw)


def split_ref(name: str) -> tuple[str, str]:
    """'host[:port]/repo/path' -> (host, repo/path)."""
    host, _, repo = name.partition("/")
    if not repo or ("." not in host and ":" not in host and host != "localhost"):
        return "registry-1.docker.io", name if "/" in name else f"library/{name}"
    return host, repo


def _insecure(host: str) -> bool:
    bare = host.rsplit(":", 1)[0]
    extra = {h.strip() for h in os.environ.get("K3_INSECURE_REGISTRIES", "").split(",") if h.strip()}
    return bare in ("localhost", "127.0.0.1", "::1") or host in extra


def _docker_auth(host: str) -> str | None:
    path = Path(os.environ.get("DOCKER_CONFIG", Path.home() / ".docker")) / "config.json"
    try:
        auths = json.loads(path.read_text()).get("auths", {})
    except (OSError, ValueError):
        return None
    for key in (host, f"https://{host}", f"https://{host}/v1/", f"http://{host}"):
        entry = auths.get(key)
        if entry and entry.get("auth"):
            return entry["auth"]
    return None


class Registry:
    def __init__(self, host: str) -> None:
        self.host = host
        self.base = f"{'http' if _insecure(host) else 'https'}://{host}"
        self._token: str | None = None

    # -- transport ------------------------------------------------------------------------------
    def _request(self, method: str, path: str, data: bytes | None = None, headers: dict | None = None,
                 retry_auth: bool = True) -> tuple[int, dict, bytes]:
        url = path if path.startswith("http") else self.base + path
        req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
        if self._token:
            req.add_header("Authorization", self._token)
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:  # noqa: S310 - registry URL
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 401 and retry_auth and self._authenticate(exc.headers.get("WWW-Authenticate", "")):
                return self._request(method, path, data, headers, retry_auth=False)
            body = exc.read()[:300].decode("utf-8", "replace")
            raise RegistryError(f"{method} {self.host}{urllib.parse.urlsplit(url).path}: HTTP {exc.code} {body.strip()}",
                                exc.code) from None
        except OSError as exc:
            raise RegistryError(f"{method} {self.host}: cannot reach the registry: {exc}") from None

    def _authenticate(self, challenge: str) -> bool:
        basic = _docker_auth(self.host)
        if challenge.lower().startswith("basic") and basic:
            self._token = f"Basic {basic}"
            return True
        if challenge.lower().startswith("bearer"):
            params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
            realm = params.pop("realm", None)
            if not realm:
                return False
            req = urllib.request.Request(f"{realm}?{urllib.parse.urlencode(params)}")
            if basic:
                req.add_header("Authorization", f"Basic {basic}")
            try:
                with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310
                    doc = json.load(resp)
            except (OSError, ValueError):
                return False
            token = doc.get("token") or doc.get("access_token")
            if token:
                self._token = f"Bearer {token}"
                return True
        return False

    # -- reads ----------------------------------------------------------------------------------
    def manifest(self, repo: str, reference: str) -> Manifest | None:
        try:
            _, headers, body = self._request("GET", f"/v2/{repo}/manifests/{reference}", headers={"Accept": ACCEPT})
        except RegistryError as exc:
            if exc.status == 404:
                return None
            raise
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if reference.startswith("sha256:") and digest != reference:
            raise RegistryError(f"{self.host}/{repo}@{reference}: the registry served content with digest {digest}")
        media = headers.get("Content-Type", "").split(";")[0] or json.loads(body).get("mediaType", "")
        return Manifest(media, digest, body)

    def blob(self, repo: str, digest: str) -> bytes:
        _, _, body = self._request("GET", f"/v2/{repo}/blobs/{digest}")
        got = "sha256:" + hashlib.sha256(body).hexdigest()
        if got != digest:
            raise RegistryError(f"{self.host}/{repo} blob {digest}: content hashes to {got}")
        return body

    # -- writes ---------------------------------------------------------------------------------
    def push_blob(self, repo: str, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        try:
            self._request("HEAD", f"/v2/{repo}/blobs/{digest}")
            return digest
        except RegistryError as exc:
            if exc.status != 404:
                raise
        _, headers, _ = self._request("POST", f"/v2/{repo}/blobs/uploads/")
        location = headers.get("Location", "")
        if not location.startswith("http"):
            location = self.base + location
        sep = "&" if "?" in location else "?"
        self._request("PUT", f"{location}{sep}digest={urllib.parse.quote(digest)}", data=data,
                      headers={"Content-Type": "application/octet-stream"})
        return digest

    def push_manifest(self, repo: str, reference: str, raw: bytes, media_type: str) -> str:
        self._request("PUT", f"/v2/{repo}/manifests/{reference}", data=raw, headers={"Content-Type": media_type})
        return "sha256:" + hashlib.sha256(raw).hexdigest()

    # -- referrers (tag schema) -----------------------------------------------------------------
    def attach(self, repo: str, subject: Manifest, artifact_type: str, content: bytes,
               annotations: dict[str, str]) -> str:
        """Push ``content`` as an artifact whose subject is ``subject``; list it in the referrers
        index, replacing an earlier artifact of the same type. Returns the artifact manifest digest."""
        blob_digest = self.push_blob(repo, content)
        empty_digest = self.push_blob(repo, EMPTY_JSON)
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "artifactType": artifact_type,
            "config": {"mediaType": OCI_EMPTY, "digest": empty_digest, "size": len(EMPTY_JSON)},
            "layers": [{"mediaType": artifact_type, "digest": blob_digest, "size": len(content)}],
            "subject": {"mediaType": subject.media_type, "digest": subject.digest, "size": len(subject.raw)},
            "annotations": dict(sorted(annotations.items())),
        }
        raw = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
        digest = self.push_manifest(repo, "sha256:" + hashlib.sha256(raw).hexdigest(), raw, OCI_MANIFEST)
        tag = subject.digest.replace(":", "-")
        current = self.manifest(repo, tag)
        entries = current.doc.get("manifests", []) if current else []
        entries = [e for e in entries if e.get("artifactType") != artifact_type]
        entries.append({"mediaType": OCI_MANIFEST, "digest": digest, "size": len(raw),
                        "artifactType": artifact_type, "annotations": manifest["annotations"]})
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX,
                 "manifests": sorted(entries, key=lambda e: (e["artifactType"], e["digest"]))}
        self.push_manifest(repo, tag, json.dumps(index, sort_keys=True, separators=(",", ":")).encode(), OCI_INDEX)
        return digest

    def referrers(self, repo: str, subject_digest: str) -> dict[str, bytes]:
        """artifactType -> content of each artifact attached to ``subject_digest`` (tag schema)."""
        index = self.manifest(repo, subject_digest.replace(":", "-"))
        found: dict[str, bytes] = {}
        for entry in (index.doc.get("manifests", []) if index else []):
            art = self.manifest(repo, entry["digest"])
            if art is None:
                continue
            doc = art.doc
            if (doc.get("subject") or {}).get("digest") != subject_digest or not doc.get("layers"):
                continue
            found[doc.get("artifactType", entry.get("artifactType", ""))] = self.blob(repo, doc["layers"][0]["digest"])
        return found

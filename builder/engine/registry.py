"""A small OCI distribution client (HTTP API v2) for what buildx cannot do: fetch raw manifests
and blobs for comparisons, and attach SBOM/provenance artifacts to an image.

Registries without the referrers API (distribution 2.8 and 3.x) get artifacts the way the OCI
distribution spec 1.1 prescribes for them: each artifact is an image manifest whose ``subject``
is the image, and an image index tagged ``sha256-<hex of the image digest>`` lists them
(the "referrers tag schema"). ``RegistryClient`` is the seam the rest of the tool uses: references
in, typed answers or ``RegistryUnavailable``/``BuildError`` out; ``Registry`` is its HTTP transport.

Credentials and the answer to a registry's 401 challenge are builder/engine/auth.py's.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from builder.config.imageref import names_registry_host
from builder.engine import auth, transport
from builder.engine.auth import CredentialLookup
from builder.engine.transport import RegistryError
from builder.errors import BuildError, RegistryUnavailable

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_EMPTY = "application/vnd.oci.empty.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
ACCEPT = ", ".join([OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST])
EMPTY_JSON = b"{}"


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
    if not repo or not names_registry_host(name):
        return "registry-1.docker.io", name if "/" in name else f"library/{name}"
    return host, repo


class Registry:
    def __init__(self, host: str) -> None:
        self.host = host
        self.base = auth.registry_url(host)
        self._token: str | None = None
        self._lookup: CredentialLookup | None = None  # the Docker config is read once per host
        self._auth_note = ""  # why the last authentication gave nothing (one line, no secret)
        self._retrier = transport.Retrier(transport.budget_seconds())

    # -- transport ------------------------------------------------------------------------------
    def _request(
        self,
        method: str,
        path: str,
        data: bytes | None = None,
        headers: dict | None = None,
        limit: int | None = None,
    ) -> tuple[int, dict, bytes]:
        """One request (tried again on a transient failure when the Retrier says so); ``path`` is
        resolved against the registry's base URL, ``limit`` caps the reply's size."""
        return self._retrier.run(method, lambda: self._attempt(method, path, data, headers, limit))

    def _own(self, url: str) -> bool:
        """Whether ``url`` is on the registry's own origin: the only place its token is sent, and
        the only one whose 401 is answered with the registry's credentials."""
        return transport.origin(url) == transport.origin(self.base)

    def _attempt(
        self,
        method: str,
        path: str,
        data: bytes | None = None,
        headers: dict | None = None,
        limit: int | None = None,
        retry_auth: bool = True,
    ) -> tuple[int, dict, bytes]:
        url = urllib.parse.urljoin(self.base, path)
        where = f"{method} {self._where(url)}"
        started = time.monotonic()
        try:
            req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
            with transport.open_url(req, self._token if self._own(url) else None, transport.TIMEOUT) as resp:
                return resp.status, dict(resp.headers), transport.read_body(resp, started, limit)
        except urllib.error.HTTPError as exc:
            challenge = exc.headers.get("WWW-Authenticate", "") if self._own(exc.filename or "") else ""
            if exc.code == 401 and retry_auth and challenge and self._authenticate(challenge):
                return self._attempt(method, path, data, headers, limit, retry_auth=False)
            raise self._refused(where, exc) from None
        except transport.TooLarge as exc:
            raise RegistryError(f"{where}: {exc}") from None
        except (OSError, http.client.HTTPException, ValueError) as exc:  # ValueError: a URL urllib cannot use
            raise transport.unreached(where, exc) from None

    def _where(self, url: str) -> str:
        """A URL for messages: host and path, no query (a presigned URL's signature is a secret)."""
        parts = urllib.parse.urlsplit(url)
        return f"{self.host if self._own(url) else parts.netloc}{parts.path}"

    def _refused(self, where: str, exc: urllib.error.HTTPError) -> RegistryError:
        """An HTTP error reply's error; why credentials did not help when the registry itself said
        401/403 (another host's 401 was not answered: the note is not about it)."""
        own = self._own(exc.filename or "")
        note = self._auth_note if own else "not the registry's origin: no credentials sent there"
        return transport.refused(where, exc, note if exc.code in (401, 403) else "")

    def _credentials(self) -> CredentialLookup:
        if self._lookup is None:
            self._lookup = auth.docker_credentials(self.host)
        return self._lookup

    def _authenticate(self, challenge: str) -> bool:
        """Answer the registry's 401 challenge with the Docker config's credentials for this host.
        False (and ``_auth_note`` says why, without the secret) when there is nothing better to send."""
        answer = auth.answer_challenge(challenge, self._credentials(), self.host, self._token)
        self._auth_note = answer.note
        if answer.header is None:
            return False
        self._token = answer.header
        return True

    # -- reads ----------------------------------------------------------------------------------
    def manifest(self, repo: str, reference: str) -> Manifest | None:
        try:
            _, headers, body = self._request(
                "GET", f"/v2/{repo}/manifests/{reference}", headers={"Accept": ACCEPT}, limit=transport.MANIFEST_LIMIT
            )
        except RegistryError as exc:
            if exc.status == 404:
                return None
            raise
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if reference.startswith("sha256:") and digest != reference:
            raise RegistryError(f"{self.host}/{repo}@{reference}: the registry served content with digest {digest}")
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or not all(isinstance(doc.get(k, []), list) for k in ("layers", "manifests")):
            raise RegistryError(
                f"{self.host}/{repo}:{reference}: the registry's manifest is not a JSON object "
                f"({len(body)} bytes); truncated or not a registry?"
            )
        media = headers.get("Content-Type", "").split(";")[0] or str(doc.get("mediaType", ""))
        return Manifest(media, digest, body)

    def blob(self, repo: str, digest: str) -> bytes:
        _, _, body = self._request("GET", f"/v2/{repo}/blobs/{digest}")
        got = "sha256:" + hashlib.sha256(body).hexdigest()
        if got != digest:
            raise RegistryError(f"{self.host}/{repo} blob {digest}: content hashes to {got}")
        return body

    def blob_to(self, repo: str, digest: str, dest: Path) -> None:
        """A blob streamed to ``dest`` (a layer can be GBs: never held in memory), hash-checked."""
        self._request("HEAD", f"/v2/{repo}/blobs/{digest}")  # authenticates, or raises naming the blob
        self._retrier.run("GET", lambda: self._stream(repo, digest, dest))

    def _stream(self, repo: str, digest: str, dest: Path) -> None:
        """One download of the blob into ``dest``, from its first byte."""
        got = hashlib.sha256()
        where = f"GET {self.host}/{repo} blob {digest[:19]}"

        def sink(chunk: bytes) -> None:
            got.update(chunk)
            out.write(chunk)

        try:
            req = urllib.request.Request(f"{self.base}/v2/{repo}/blobs/{digest}")  # the registry's own origin
            with transport.open_url(req, self._token, transport.TIMEOUT) as resp, dest.open("wb") as out:
                transport.read_body(resp, time.monotonic(), sink=sink)
        except urllib.error.HTTPError as exc:
            raise self._refused(where, exc) from None
        except (OSError, http.client.HTTPException) as exc:
            if isinstance(exc, OSError) and exc.errno is not None and exc.filename:
                raise  # our own disk (ENOSPC, EROFS): not the registry's fault
            raise transport.unreached(where, exc) from None
        if "sha256:" + got.hexdigest() != digest:
            raise RegistryError(f"{self.host}/{repo} blob {digest}: content hashes to sha256:{got.hexdigest()}")

    # -- writes ---------------------------------------------------------------------------------
    def push_blob(self, repo: str, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        try:
            self._request("HEAD", f"/v2/{repo}/blobs/{digest}")
            return digest
        except RegistryError as exc:
            if exc.status != 404:
                raise
        # Retried as its PUT is: the session's POST opens a new session each time, never reused.
        self._retrier.run("PUT", lambda: self._upload(repo, digest, data), again=" from a new upload session")
        return digest

    def _upload(self, repo: str, digest: str, data: bytes) -> None:
        """One upload session, POST then PUT: a failed PUT is tried again from a new session. The
        session's Location is resolved against the POST's URL (it may be relative, or name another
        host: that host gets no credential, see ``_own``)."""
        post = f"{self.base}/v2/{repo}/blobs/uploads/"
        _, headers, _ = self._attempt("POST", post)
        try:
            put = transport.session_url(post, headers.get("Location", ""), digest)
        except ValueError as exc:  # asking again gets the same
            raise RegistryError(f"POST {self.host}/v2/{repo}/blobs/uploads/: {exc}") from None
        self._attempt("PUT", put, data=data, headers={"Content-Type": "application/octet-stream"})

    def push_manifest(self, repo: str, reference: str, raw: bytes, media_type: str) -> str:
        self._request("PUT", f"/v2/{repo}/manifests/{reference}", data=raw, headers={"Content-Type": media_type})
        return "sha256:" + hashlib.sha256(raw).hexdigest()

    # -- referrers (tag schema) -----------------------------------------------------------------
    def attach(
        self, repo: str, subject: Manifest, artifact_type: str, content: bytes, annotations: dict[str, str]
    ) -> str:
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
        entry = {
            "mediaType": OCI_MANIFEST,
            "digest": digest,
            "size": len(raw),
            "artifactType": artifact_type,
            "annotations": manifest["annotations"],
        }
        self._list_referrer(repo, subject.digest.replace(":", "-"), entry)
        return digest

    def _list_referrer(self, repo: str, tag: str, entry: dict, attempts: int = 4) -> None:
        """Read-modify-write of the referrers index (the tag schema has no atomic update): two
        builds of one image attach at once, or an entry's manifest was deleted since. The registry
        refuses an index naming a manifest it lacks (HTTP 400), so entries it no longer has are
        dropped and the write is retried on a fresh read.

        Its own loop, not the Retrier: a 400 is a sound answer (the registry is up, the index was
        stale), and what is sent again is a new index from a new read, not the same request. Each
        read and write underneath still has the Retrier's retries for a transient failure."""
        for attempt in range(attempts):
            current = self.manifest(repo, tag)
            entries = [
                e
                for e in (current.doc.get("manifests", []) if current else [])
                if e.get("artifactType") != entry["artifactType"] and self.manifest(repo, e["digest"])
            ]
            index = {
                "schemaVersion": 2,
                "mediaType": OCI_INDEX,
                "manifests": sorted([*entries, entry], key=lambda e: (e["artifactType"], e["digest"])),
            }
            try:
                self.push_manifest(
                    repo, tag, json.dumps(index, sort_keys=True, separators=(",", ":")).encode(), OCI_INDEX
                )
                return
            except RegistryError as exc:
                if exc.status != 400 or attempt == attempts - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))

    def referrers(self, repo: str, subject_digest: str) -> dict[str, bytes]:
        """artifactType -> content of each artifact attached to ``subject_digest`` (tag schema)."""
        index = self.manifest(repo, subject_digest.replace(":", "-"))
        found: dict[str, bytes] = {}
        for entry in index.doc.get("manifests", []) if index else []:
            art = self.manifest(repo, entry["digest"])
            if art is None:
                continue
            doc = art.doc
            if (doc.get("subject") or {}).get("digest") != subject_digest or not doc.get("layers"):
                continue
            found[doc.get("artifactType", entry.get("artifactType", ""))] = self.blob(repo, doc["layers"][0]["digest"])
        return found


# --- the seam the rest of the tool uses ------------------------------------------------------------


class RegistrySeam(Protocol):
    """What the pipeline asks of a registry; unit-test fakes implement this."""

    def serves(self, name: str, digest: str) -> bool: ...
    def resolve_digest(self, ref: str) -> str | None: ...
    def raw_manifest(self, name: str, reference: str) -> Manifest | None: ...
    def platform_digest(self, name: str, digest: str) -> str: ...
    def blob(self, name: str, digest: str) -> bytes: ...
    def attach(
        self, name: str, digest: str, artifact_type: str, content: bytes, annotations: dict[str, str]
    ) -> str: ...
    def referrers(self, name: str, digest: str) -> dict[str, bytes]: ...
    def image_size(self, ref: str) -> int | None: ...
    def blob_to(self, name: str, digest: str, dest: Path) -> None: ...
    def delete_manifest(self, name: str, digest: str) -> bool: ...
    def image_config(self, ref: str, arch: str = "amd64") -> dict | None: ...
    def push_index(self, name: str, tag: str, manifests: dict[str, str]) -> str: ...


def split_reference(ref: str) -> tuple[str, str]:
    """'host/repo:tag' or 'host/repo@sha256:..' -> (name, tag or digest)."""
    if "@" in ref:
        name, _, reference = ref.partition("@")
        return name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name, reference
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        name, _, tag = ref.rpartition(":")
        return name, tag
    return ref, "latest"


def index_entry(registry: RegistrySeam, name: str, platform: str, digest: str) -> dict:
    """The entry of an image index for ``name@digest``, built for ``platform`` ("os/arch").

    Only an image manifest: an index (buildx's image + attestation index, made when its default
    attestations were on) nested in the published index is refused. The entry's os, architecture
    and variant are the image config's, not the matrix's word, and must be ``platform``."""
    manifest = registry.raw_manifest(name, digest)
    if manifest is None:
        raise RegistryUnavailable(f"registry: {name}@{digest}: not served, so no index can name it")
    config_ref = manifest.doc.get("config")
    if "manifests" in manifest.doc or not isinstance(config_ref, dict):
        raise BuildError(
            f"{name}@{digest} ({platform}) is not an image manifest ({manifest.media_type}); an image index "
            "names image manifests only (were BuildKit attestations on?)"
        )
    config = json.loads(registry.blob(name, config_ref["digest"]))
    entry = {"architecture": config.get("architecture"), "os": config.get("os")}
    if config.get("variant"):
        entry["variant"] = config["variant"]  # arm64 images say "v8"
    if f"{entry['os']}/{entry['architecture']}" != platform:
        raise BuildError(f"{name}@{digest}: its config says {entry['os']}/{entry['architecture']}, not {platform}")
    return {"mediaType": manifest.media_type, "digest": digest, "size": len(manifest.raw), "platform": entry}


class RegistryClient:
    """Registry operations by image reference, one HTTP client per registry host."""

    def __init__(self) -> None:
        self._hosts: dict[str, Registry] = {}

    def _repo(self, name: str) -> tuple[Registry, str]:
        host, repo = split_ref(name)
        if host not in self._hosts:
            self._hosts[host] = Registry(host)
        return self._hosts[host], repo

    @contextlib.contextmanager
    def _reaching(self, what: str) -> Iterator[None]:
        try:
            yield
        except RegistryError as exc:
            raise RegistryUnavailable(f"registry: {what}: {exc}") from None

    def raw_manifest(self, name: str, reference: str) -> Manifest | None:
        registry, repo = self._repo(name)
        with self._reaching(f"{name}@{reference}" if reference.startswith("sha256:") else f"{name}:{reference}"):
            return registry.manifest(repo, reference)

    def push_index(self, name: str, tag: str, manifests: dict[str, str]) -> str:
        """Tag an OCI image index of ``manifests`` (platform "os/arch" -> digest of an image manifest
        the repository serves) as ``name:tag``; returns the index digest."""
        entries = [index_entry(self, name, platform, digest) for platform, digest in manifests.items()]
        raw = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}, sort_keys=True).encode()
        registry, repo = self._repo(name)
        with self._reaching(f"{name}:{tag}"):
            return registry.push_manifest(repo, tag, raw, OCI_INDEX)

    def resolve_digest(self, ref: str) -> str | None:
        """The manifest digest the registry serves for ``ref`` (tag or digest), or None."""
        name, reference = split_reference(ref)
        manifest = self.raw_manifest(name, reference)
        return manifest.digest if manifest else None

    def serves(self, name: str, digest: str) -> bool:
        """Whether the registry serves ``name@digest`` (content-addressed, so it is that image)."""
        return self.resolve_digest(f"{name}@{digest}") == digest

    def platform_digest(self, name: str, digest: str) -> str:
        """The image manifest behind ``digest``: itself, or the one platform manifest of an index.

        With BuildKit attestations on (docker-container builders) buildx pushes an index whose
        attestation manifest carries invocation ids and times; reproducibility is a property of the
        platform manifest, so that is what comparisons use."""
        m = self.raw_manifest(name, digest)
        if m is None or "manifests" not in m.doc:
            return digest
        images = [
            d["digest"]
            for d in m.doc["manifests"]
            if (d.get("annotations") or {}).get("vnd.docker.reference.type") != "attestation-manifest"
        ]
        if len(images) != 1:
            raise BuildError(f"{name}@{digest}: an index of {len(images)} images; compare one platform at a time")
        return images[0]

    def blob(self, name: str, digest: str) -> bytes:
        registry, repo = self._repo(name)
        with self._reaching(f"{name} blob {digest[:19]}"):
            return registry.blob(repo, digest)

    def delete_manifest(self, name: str, digest: str) -> bool:
        """Withdraw a pushed manifest (a registry may refuse deletes: False then)."""
        registry, repo = self._repo(name)
        try:
            registry._request("DELETE", f"/v2/{repo}/manifests/{digest}")
            return True
        except RegistryError:
            return False

    def blob_to(self, name: str, digest: str, dest: Path) -> None:
        registry, repo = self._repo(name)
        with self._reaching(f"{name} blob {digest[:19]}"):
            registry.blob_to(repo, digest, dest)

    def attach(self, name: str, digest: str, artifact_type: str, content: bytes, annotations: dict[str, str]) -> str:
        """Attach an artifact (SBOM, provenance) to ``name@digest`` via the referrers tag schema."""
        registry, repo = self._repo(name)
        with self._reaching(f"attaching {artifact_type} to {name}@{digest[:19]}"):
            subject = registry.manifest(repo, digest)
            if subject is None:
                raise RegistryError(f"the registry does not serve {name}@{digest}")
            return registry.attach(repo, subject, artifact_type, content, annotations)

    def referrers(self, name: str, digest: str) -> dict[str, bytes]:
        registry, repo = self._repo(name)
        with self._reaching(f"artifacts attached to {name}@{digest[:19]}"):
            return registry.referrers(repo, digest)

    def image_size(self, ref: str) -> int | None:
        """Compressed size in the registry: config plus layers of the manifest ``ref`` names."""
        name, reference = split_reference(ref)
        manifest = self.raw_manifest(name, reference)
        if manifest is None or "layers" not in manifest.doc:
            return None
        doc = manifest.doc
        try:
            return int(doc["config"]["size"]) + sum(int(layer["size"]) for layer in doc["layers"])
        except (KeyError, TypeError, ValueError):
            return None  # a manifest without sizes: the size is unknown, nothing more

    def image_config(self, ref: str, arch: str = "amd64") -> dict | None:
        """The image's config JSON read from the registry (no pull): labels, env, user, entrypoint.
        An index is followed to its linux/``arch`` image (doctor asks for the host's; default
        amd64), or its only one. None when not served or when the index has no such platform."""
        name, reference = split_reference(ref)
        manifest = self.raw_manifest(name, reference)
        if manifest is None:
            return None
        doc = manifest.doc
        if "manifests" in doc:
            images = [
                d
                for d in doc["manifests"]
                if (d.get("annotations") or {}).get("vnd.docker.reference.type") != "attestation-manifest"
            ]
            mine = [d for d in images if (d.get("platform") or {}).get("architecture") in (arch, None)]
            if not mine:
                return None
            manifest = self.raw_manifest(name, mine[0]["digest"])
            if manifest is None:
                return None
            doc = manifest.doc
        config = doc.get("config")
        try:
            parsed = json.loads(self.blob(name, config["digest"])) if isinstance(config, dict) else None
        except (ValueError, KeyError, TypeError):
            parsed = None
        if not isinstance(parsed, dict):
            raise RegistryUnavailable(
                f"registry: {ref}: the image config is not a JSON object (a truncated or garbled reply)"
            )
        return parsed

"""Content-addressed writes the escrow needs beside builder/engine/registry.py's client: whether a
blob or manifest is already there (HEAD), a blob streamed from a file (a CUDA base layer or a torch
wheel is GBs: never held in memory), a cross-repository mount, a manifest pushed by digest.

It rides on ``RegistryClient``'s per-host transport (its credentials, its retries, its error
mapping), so a registry out of reach is ``RegistryUnavailable`` (exit 3) here as everywhere.
"""

from __future__ import annotations

import hashlib
import http.client
import time
import urllib.error
import urllib.request
from pathlib import Path

from builder.engine import transport
from builder.engine.registry import ACCEPT, Registry, RegistryClient
from builder.engine.transport import RegistryError, session_url
from builder.errors import RegistryUnavailable


class BlobCopier:
    """HEAD, upload, mount and manifest writes by image name ("host/repo"), through ``client``."""

    def __init__(self, client: RegistryClient) -> None:
        self.client = client

    def _at(self, name: str) -> tuple[Registry, str]:
        return self.client._repo(name)  # the client's one transport per host (credentials, retries)

    def _exists(self, name: str, kind: str, digest: str) -> bool:
        registry, repo = self._at(name)
        try:
            registry._request("HEAD", f"/v2/{repo}/{kind}/{digest}", headers={"Accept": ACCEPT})
            return True
        except RegistryError as exc:
            if exc.status == 404:
                return False
            raise RegistryUnavailable(f"registry: HEAD {name} {kind[:-1]} {digest[:19]}: {exc}") from None

    def has_blob(self, name: str, digest: str) -> bool:
        return self._exists(name, "blobs", digest)

    def has_manifest(self, name: str, digest: str) -> bool:
        return self._exists(name, "manifests", digest)

    def push_file(self, name: str, path: Path, digest: str) -> None:
        """Upload ``path`` as the blob ``digest`` (POST then a monolithic PUT, the body streamed from
        the file; tried again from a new session on a transient failure). The registry checks the
        digest against what it received, so a file that changed under us is refused there."""
        registry, repo = self._at(name)
        post = f"{registry.base}/v2/{repo}/blobs/uploads/"

        def once() -> None:
            _, headers, _ = registry._attempt("POST", post)
            try:
                put = session_url(post, headers.get("Location", ""), digest)
            except ValueError as exc:
                raise RegistryError(f"POST {registry.host}/v2/{repo}/blobs/uploads/: {exc}") from None
            with path.open("rb") as body:
                size = str(path.stat().st_size)
                headers = {"Content-Type": "application/octet-stream", "Content-Length": size}
                registry._attempt("PUT", put, data=body, headers=headers)  # type: ignore[arg-type]

        try:
            registry._retrier.run("PUT", once, again=" from a new upload session")
        except RegistryError as exc:
            raise RegistryUnavailable(f"registry: uploading {path.name} to {name}: {exc}") from None

    def push_bytes(self, name: str, data: bytes) -> str:
        registry, repo = self._at(name)
        try:
            return registry.push_blob(repo, data)
        except RegistryError as exc:
            raise RegistryUnavailable(f"registry: uploading a blob to {name}: {exc}") from None

    def mount(self, name: str, digest: str, from_name: str) -> bool:
        """Cross-repository mount of ``digest`` from ``from_name`` (same host only): True when the
        registry mounted it (201); False when it opened an upload session instead (202: it will not
        mount, e.g. the source repository does not hold it), and the caller copies the bytes."""
        registry, repo = self._at(name)
        src_registry, src_repo = self._at(from_name)
        if src_registry is not registry:
            return False
        try:
            status, _, _ = registry._attempt("POST", f"/v2/{repo}/blobs/uploads/?mount={digest}&from={src_repo}")
        except RegistryError as exc:
            raise RegistryUnavailable(f"registry: mounting {digest[:19]} from {from_name} into {name}: {exc}") from None
        return status == 201

    def push_manifest(self, name: str, raw: bytes, media_type: str, tag: str | None = None) -> str:
        """Push ``raw`` by its digest (or under ``tag``); returns its digest."""
        registry, repo = self._at(name)
        digest = "sha256:" + hashlib.sha256(raw).hexdigest()
        try:
            return registry.push_manifest(repo, tag or digest, raw, media_type)
        except RegistryError as exc:
            raise RegistryUnavailable(f"registry: pushing manifest {tag or digest[:19]} to {name}: {exc}") from None

    def manifest_bytes(self, name: str, reference: str) -> tuple[str, bytes] | None:
        """(media type, bytes) of the manifest ``reference`` as the registry serves it, unchecked
        (a registry serving other bytes is the caller's refusal to make), or None (404)."""
        registry, repo = self._at(name)
        try:
            _, headers, raw = registry._request(
                "GET", f"/v2/{repo}/manifests/{reference}", headers={"Accept": ACCEPT}, limit=transport.MANIFEST_LIMIT
            )
        except RegistryError as exc:
            if exc.status == 404:
                return None
            raise RegistryUnavailable(f"registry: {name} manifest {reference[:19]}: {exc}") from None
        return headers.get("Content-Type", "").split(";")[0], raw

    def download(self, name: str, digest: str, dest: Path) -> str | None:
        """Stream the blob ``digest`` into ``dest``; the sha256 of what arrived ("sha256:..."), which
        the caller compares (a registry serving other bytes is the caller's refusal to make), or
        None when the registry does not have it (404)."""
        registry, repo = self._at(name)
        got = [hashlib.sha256()]
        where = f"GET {registry.host}/{repo} blob {digest[:19]}"

        def once() -> None:
            got[0] = hashlib.sha256()  # a retry starts again from the first byte
            req = urllib.request.Request(f"{registry.base}/v2/{repo}/blobs/{digest}")  # the registry's own origin
            try:
                with transport.open_url(req, registry._token, transport.TIMEOUT) as resp, dest.open("wb") as out:

                    def sink(chunk: bytes) -> None:
                        got[0].update(chunk)
                        out.write(chunk)

                    transport.read_body(resp, time.monotonic(), sink=sink)
            # As RegistryErrors, so the Retrier fetches a stream cut short (or a 503) again.
            except urllib.error.HTTPError as exc:
                raise registry._refused(where, exc) from None
            except (OSError, http.client.HTTPException) as exc:
                if isinstance(exc, OSError) and exc.errno is not None and exc.filename:
                    raise  # our own disk: not the registry's fault
                raise transport.unreached(where, exc) from None

        try:
            registry._request("HEAD", f"/v2/{repo}/blobs/{digest}")  # authenticates, or says 404
            registry._retrier.run("GET", once)
        except RegistryError as exc:
            if exc.status == 404:
                return None
            raise RegistryUnavailable(f"registry: {name} blob {digest[:19]}: {exc}") from None
        return "sha256:" + got[0].hexdigest()

    def delete_blob(self, name: str, digest: str) -> bool:
        """Delete a blob (tests remove what they made; a registry may refuse: False)."""
        registry, repo = self._at(name)
        try:
            registry._request("DELETE", f"/v2/{repo}/blobs/{digest}")
            return True
        except RegistryError:
            return False

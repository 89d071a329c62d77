"""The escrow's blob copier (builder/engine/blobcopy.py) keeps the registry's credentials on the
registry's own origin, as the client it rides on does (builder/engine/transport.py): a blob
download redirected to an object store, and an upload session whose Location names another host,
reach that host without them. Real HTTP servers on 127.0.0.1 (tests/unit/test_registry_redirects.py's)."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

import pytest

from builder.engine.blobcopy import BlobCopier
from builder.engine.registry import RegistryClient
from tests.unit.test_registry_redirects import BASIC, BLOB, DIGEST, Host, Reply, _registry, env, helper, store  # noqa: F401


@pytest.mark.parametrize("code", [302, 307])
def test_a_redirected_download_reaches_the_store_without_the_credential(helper, store, code, tmp_path):  # noqa: F811
    registry = _registry(store, code)
    try:
        helper(registry.host)
        got = BlobCopier(RegistryClient()).download(f"{registry.host}/k3/x", DIGEST, tmp_path / "blob")
        assert got == DIGEST and (tmp_path / "blob").read_bytes() == BLOB
        assert store.seen and store.auths() == []
        assert BASIC in registry.auths()  # it was sent, to the registry
    finally:
        registry.close()


def test_an_upload_session_on_another_host_gets_no_credential(helper, store, tmp_path):  # noqa: F811
    def answer(h: BaseHTTPRequestHandler) -> Reply:
        if h.headers.get("Authorization") != BASIC:
            return 401, {"WWW-Authenticate": 'Basic realm="k3"'}, b""
        if h.command == "POST":
            return 202, {"Location": f"{store.url}/upload/session-1?state=s"}, b""
        return 200, {}, b""

    registry = Host(answer)
    try:
        helper(registry.host)
        (tmp_path / "blob").write_bytes(BLOB)
        BlobCopier(RegistryClient()).push_file(f"{registry.host}/k3/x", tmp_path / "blob", DIGEST)
        puts = [(m, p) for m, p, _ in store.seen if m == "PUT"]
        assert puts and puts[0][1].startswith("/upload/session-1?state=s&digest=sha256%3A")
        assert store.auths() == [] and BASIC in registry.auths()
    finally:
        registry.close()

"""The secret scan of a pushed image (builder/checks/secretscan.py ``scan``) against a registry that
holds the image under its own name only: every read names the repository, the platform manifest
is the one read, a manifest without a config still has its layers scanned, and the message names
the layer and the file as the image has it (a tar's "./" and a leading "/" written once).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest

from builder import log
from builder.checks import secretscan
from builder.engine.registry import Manifest
from builder.errors import BuildError

NAME = "registry.test:5000/k3/smoke"
INDEX = "sha256:" + "1" * 64
SECRET = "k3-TOKEN-0123456789"


@pytest.fixture(autouse=True)
def no_secrets(monkeypatch):
    monkeypatch.setattr(log, "_secrets", set())
    log.register_secret(SECRET)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _layer(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class StrictRegistry:
    """Serves one repository: any read under another name fails the test. The image is pushed
    as an index (INDEX) whose platform manifest is the one holding the layers."""

    def __init__(self, layers: list[bytes], config: bytes | None = b'{"config": {}}') -> None:
        self.blobs = {_digest(b): b for b in [*layers, *([config] if config is not None else [])]}
        self.doc: dict = {"layers": [{"digest": _digest(b)} for b in layers]}
        if config is not None:
            self.doc["config"] = {"digest": _digest(config)}
        self.platform = _digest(json.dumps(self.doc).encode())

    def _name(self, name):
        assert name == NAME, f"read under {name!r}"

    def platform_digest(self, name, digest):
        self._name(name)
        return self.platform if digest == INDEX else digest

    def raw_manifest(self, name, reference):
        self._name(name)
        if reference != self.platform:
            return None
        return Manifest("application/vnd.oci.image.manifest.v1+json", reference, json.dumps(self.doc).encode())

    def blob(self, name, digest):
        self._name(name)
        return self.blobs[digest]

    def blob_to(self, name, digest, dest):
        self._name(name)
        dest.write_bytes(self.blobs[digest])


@pytest.mark.parametrize(
    "member, shown",
    [("./usr/lib/leak.txt", "/usr/lib/leak.txt"), ("/X11/leak", "/X11/leak"), ("opt/k3/leak", "/opt/k3/leak")],
)
def test_the_file_is_named_as_the_image_has_it(member, shown):
    layers = [_layer({"clean": b"nothing\n"}), _layer({member: f"token={SECRET}\n".encode()})]
    registry = StrictRegistry(layers)
    with pytest.raises(BuildError) as err:
        secretscan.scan(registry, NAME, INDEX)
    assert err.value.message == (
        f"{NAME}@{INDEX}: a build secret is in layer 1 ({_digest(layers[1])[:19]}), file {shown}: a build "
        "step copied it into the image; not recorded"
    )


def test_a_secret_in_the_platform_manifest_s_config_is_found():
    registry = StrictRegistry([_layer({"a": b"x"})], config=json.dumps({"config": {"Env": [f"T={SECRET}"]}}).encode())
    with pytest.raises(BuildError, match=r"a build secret is in the image config \(env, labels or history\)"):
        secretscan.scan(registry, NAME, INDEX)


def test_a_manifest_without_a_config_still_has_its_layers_scanned():
    registry = StrictRegistry([_layer({"leak": SECRET.encode()})], config=None)
    with pytest.raises(BuildError, match="file /leak"):
        secretscan.scan(registry, NAME, INDEX)


def test_a_manifest_the_registry_does_not_serve_holds_nothing_to_scan():
    registry = StrictRegistry([_layer({"leak": SECRET.encode()})])
    registry.raw_manifest = lambda name, reference: None  # the index names a manifest the registry lacks
    secretscan.scan(registry, NAME, INDEX)


def test_an_unreadable_layer_is_named_exactly():
    bad = b"this is not a tar file at all" * 40
    registry = StrictRegistry([_layer({"a": b"x"}), bad])
    with pytest.raises(BuildError) as err:
        secretscan.scan(registry, NAME, INDEX)
    assert err.value.message == (
        f"{NAME}@{INDEX}: layer 1 ({_digest(bad)[:19]}) cannot be read to scan it for secrets (ReadError); not recorded"
    )


def test_skipped_layers_are_not_fetched():
    base, added = _layer({"base": SECRET.encode()}), _layer({"ok": b"x"})
    registry = StrictRegistry([base, added])
    secretscan.scan(registry, NAME, INDEX, skip=frozenset({_digest(base)}))

"""The scan of a built image for the build's secrets (issue 21, defect 11): real gzip layer tars,
every written form of a secret, the layer and file named."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile

import pytest

from builder import log
from builder.checks import secretscan
from builder.errors import BuildError


@pytest.fixture(autouse=True)
def no_secrets(monkeypatch):
    monkeypatch.setattr(log, "_secrets", set())


def _layer(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(buf.getvalue())


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class _Registry:
    def __init__(self, layers: list[bytes], config: bytes = b'{"config": {}}') -> None:
        self.blobs = {_digest(b): b for b in [*layers, config]}
        self.doc = {"config": {"digest": _digest(config)}, "layers": [{"digest": _digest(b)} for b in layers]}
        self.fetched: list[str] = []

    def platform_digest(self, name, digest):
        return digest

    def raw_manifest(self, name, reference):
        from builder.engine.registry import Manifest

        return Manifest("application/vnd.oci.image.manifest.v1+json", reference, json.dumps(self.doc).encode())

    def blob(self, name, digest):
        return self.blobs[digest]

    def blob_to(self, name, digest, dest):
        self.fetched.append(digest)
        dest.write_bytes(self.blobs[digest])


def test_nothing_registered_means_nothing_is_fetched():
    reg = _Registry([_layer({"a": b"x"})])
    secretscan.scan(reg, "r/x", "sha256:" + "0" * 64)
    assert reg.fetched == []


def test_a_secret_copied_into_a_layer_is_found_with_its_layer_and_file():
    log.register_secret("hf_0123456789abcdef")
    base, clean = _layer({"etc/os-release": b"debian"}), _layer({"usr/lib/ok.py": b"print(1)"})
    leak = _layer({"usr/lib/python3/site-packages/k3smoke/leak.txt": b"prefix hf_0123456789abcdef suffix"})
    reg = _Registry([base, clean, leak])
    with pytest.raises(
        BuildError,
        match=r"layer 2 \(sha256:[0-9a-f]{12}\), file /usr/lib/python3/site-packages/"
        r"k3smoke/leak\.txt",
    ) as err:
        secretscan.scan(reg, "r/x", "sha256:" + "0" * 64, skip=frozenset({_digest(base)}))
    assert _digest(base) not in reg.fetched  # the pinned base is not ours to scan
    assert "hf_0123456789abcdef" not in err.value.message


def test_the_shell_quoted_form_is_found_too_and_across_chunk_boundaries(monkeypatch):
    log.register_secret_forms("ATKPASS'q9x7Z", ("'ATKPASS'\"'\"'q9x7Z'",))
    monkeypatch.setattr(secretscan, "_CHUNK", 7)  # the value straddles every read
    leak = _layer({"opt/env.sh": b"SCCACHE_REDIS_PASSWORD='ATKPASS'\"'\"'q9x7Z'\n"})
    with pytest.raises(BuildError, match="file /opt/env.sh"):
        secretscan.scan(_Registry([leak]), "r/x", "sha256:" + "0" * 64)


def test_a_secret_in_the_config_is_found():
    log.register_secret("hf_0123456789abcdef")
    config = json.dumps({"config": {"Env": ["T=hf_0123456789abcdef"]}}).encode()
    with pytest.raises(BuildError, match="in the image config"):
        secretscan.scan(_Registry([_layer({"a": b"x"})], config), "r/x", "sha256:" + "0" * 64)


def test_a_clean_image_passes_and_short_words_are_not_scanned_for():
    log.register_secret("abcd")  # registered for redaction, too short to look for in binaries
    log.register_secret("hf_0123456789abcdef")
    secretscan.scan(_Registry([_layer({"bin/x": b"abcd abcd"})]), "r/x", "sha256:" + "0" * 64)
    assert secretscan.needles() == [b"hf_0123456789abcdef"]

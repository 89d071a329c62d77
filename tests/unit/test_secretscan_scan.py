"""The secret scan of a built image before its push (builder/checks/secretscan.py
``find_in_archive``, builder/pipeline/prepush.py ``scan``) on archives shaped as `docker save`
writes them (tests/unit/test_secretscan.py ``_saved``): the message names the layer and the file as
the image has it (a tar's "./" and a leading "/" written once), a secret in the config is found,
every blob is read whatever the manifests name, a skipped layer is never read, and an image that
cannot be read is refused with exactly that said.

(The registry-based scan these tests first pinned is gone with the scan before the push: which
repository a read names and which platform manifest is read no longer exist as behaviour.)
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import tarfile
from types import SimpleNamespace

import pytest

from builder import log
from builder.checks import secretscan
from builder.errors import BuildError
from builder.pipeline import prepush
from tests.unit.test_secretscan import _digest, _files, _layer, _member, _saved

SECRET = "k3-TOKEN-0123456789"
IMAGE_ID = "sha256:" + "7" * 64


@pytest.fixture(autouse=True)
def no_secrets(monkeypatch):
    monkeypatch.setattr(log, "_secrets", set())
    log.register_secret(SECRET)


def _scan(archive: io.BytesIO, skip=frozenset()) -> secretscan.Hit | None:
    return secretscan.find_in_archive(archive, secretscan.needles(), skip)


@pytest.mark.parametrize(
    "member, shown",
    [("./usr/lib/leak.txt", "/usr/lib/leak.txt"), ("/X11/leak", "/X11/leak"), ("opt/k3/leak", "/opt/k3/leak")],
)
def test_the_file_is_named_as_the_image_has_it(member, shown):
    layers = [_files({"clean": b"nothing\n"}), _files({member: f"token={SECRET}\n".encode()})]
    hit = _scan(_saved(layers))
    assert hit == secretscan.Hit(_digest(layers[1]), member, "content")
    assert hit.describe() == f"layer {_digest(layers[1])[:19]}, file '{shown}' (content)"


def test_a_secret_in_the_config_is_found():
    config = json.dumps({"config": {"Env": [f"T={SECRET}"]}}).encode()
    hit = _scan(_saved([_files({"a": b"x"})], config))
    assert hit == secretscan.Hit(_digest(config), "", "blob")
    assert hit.describe() == f"blob {_digest(config)[:19]} (the image config: env, labels or history)"


def test_every_blob_is_read_whatever_the_manifests_name():
    # An archive whose manifest names neither a config nor this layer: its blobs are scanned all the same.
    leak = _files({"leak": SECRET.encode()})
    blobs = {"blobs/sha256/" + _digest(leak)[7:]: leak, "index.json": b'{"manifests": []}', "manifest.json": b"[]"}
    archive = io.BytesIO(_layer([_member(n, d) for n, d in blobs.items()], tarfile.USTAR_FORMAT))
    assert _scan(archive) == secretscan.Hit(_digest(leak), "leak", "content")


def test_a_blob_that_is_no_tar_is_searched_as_bytes():
    odd = b"this is not a tar file at all " * 40 + SECRET.encode()
    assert _scan(_saved([_files({"a": b"x"}), odd])) == secretscan.Hit(_digest(odd), "", "blob")


def test_skipped_layers_are_not_read():
    base, added = _files({"base": SECRET.encode()}), _files({"ok": b"x"})
    assert _scan(_saved([base, added]), skip=frozenset({_digest(base)})) is None
    # a skipped layer that could not even be read: were it read, the scan would raise
    broken = b"\x1f\x8b" + b"\0" * 600
    assert _scan(_saved([broken, added]), skip=frozenset({_digest(broken)})) is None
    with pytest.raises((tarfile.TarError, EOFError, OSError)):
        _scan(_saved([broken, added]))


class SavingEngine:
    """export_image streams ``archive``; remove_image records what it removed."""

    def __init__(self, archive: io.BytesIO) -> None:
        self.archive, self.removed = archive, []

    @contextlib.contextmanager
    def export_image(self, image_id):
        assert image_id == IMAGE_ID
        yield self.archive

    def remove_image(self, image_id):
        self.removed.append(image_id)


def test_an_unreadable_image_is_refused_exactly_and_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(prepush, "base_layers", lambda engine, target: frozenset())
    target = SimpleNamespace(name="smoke", image=SimpleNamespace(name="registry.test:5000/k3/smoke"))
    engine = SavingEngine(_saved([_files({"a": b"x"}), b"\x1f\x8b" + b"\0" * 600]))
    with pytest.raises(BuildError) as err:
        prepush.scan(engine, target, IMAGE_ID, tmp_path / "build.log")
    assert err.value.message.startswith(
        f"registry.test:5000/k3/smoke: the image {IMAGE_ID[:19]} cannot be read to scan it (ReadError); "
        "nothing was pushed"
    )
    assert engine.removed == [IMAGE_ID]
    assert f"refused the local image {IMAGE_ID}; nothing pushed" in (tmp_path / "build.log").read_text()


# --- issue 38's mutation run ----------------------------------------------------------------------


class _Pipe(io.RawIOBase):
    """`docker save`'s stdout: read once, front to back; it cannot seek."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readinto(self, buffer) -> int:
        chunk = self._data.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)


def test_the_archive_is_read_as_a_stream_that_cannot_seek():
    leak = _files({"opt/k3/leak": SECRET.encode()})
    pipe = _Pipe(_saved([_files({"a": b"x"}), leak]).getvalue())
    assert _scan(pipe) == secretscan.Hit(_digest(leak), "opt/k3/leak", "content")


def test_a_blob_of_any_first_block_that_is_no_tar_is_searched_as_bytes():
    # 512 bytes that are neither gzip, ustar, nor an empty archive's zeros: a blob, read whole
    odd = b"X" * 512 + b"\0" * 512 + SECRET.encode()
    assert _scan(_saved([_files({"a": b"x"}), odd])) == secretscan.Hit(_digest(odd), "", "blob")


def test_a_long_path_is_cut_to_two_hundred_characters_in_the_message():
    path = "opt/" + "d" * 300 + "/leak"
    hit = secretscan.Hit("sha256:" + "1" * 64, path, "content")
    quoted = repr("/" + path)[:197] + "..."
    assert hit.describe() == f"layer sha256:{'1' * 12}, file {quoted} (content)"


def test_a_file_name_that_is_not_utf_8_is_read_as_the_tar_stored_it():
    name = b"opt/k3/caf\xe9-" + SECRET.encode()  # latin-1 bytes in the name, the secret after them
    data = b"nothing here\n"
    info = tarfile.TarInfo(name.decode("utf-8", "surrogateescape"))
    info.size = len(data)
    out = io.BytesIO()
    with tarfile.open(
        fileobj=out, mode="w", format=tarfile.GNU_FORMAT, encoding="utf-8", errors="surrogateescape"
    ) as t:
        t.addfile(info, io.BytesIO(data))
    layer = out.getvalue()
    hit = _scan(_saved([layer]))
    assert hit is not None and (hit.blob, hit.where) == (_digest(layer), "name")


def test_a_member_outside_blobs_is_named_by_its_path_not_as_a_digest():
    # the older `docker save` layout: <id>/layer.tar, no blobs/sha256/
    leak = _files({"opt/k3/leak": SECRET.encode()})
    archive = io.BytesIO(_layer([_member("abc123/layer.tar", leak)], tarfile.USTAR_FORMAT))
    assert _scan(archive) == secretscan.Hit("abc123/layer.tar", "opt/k3/leak", "content")


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_bytes_after_a_layers_end_of_archive_are_read_too(compress):
    """A tar writer may append bytes after the end-of-archive blocks: no member holds them, but
    they are pushed with the layer, so the scan reads them."""
    body = io.BytesIO()
    with tarfile.open(fileobj=body, mode="w") as tar:
        info = tarfile.TarInfo("etc/clean.txt")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"clean"))
    clean = body.getvalue()
    for tail, found in ((b"", None), (b"\0" * 10240 + SECRET.encode(), ("", "after the end of the archive"))):
        raw = clean + tail
        layer = gzip.compress(raw) if compress else raw
        assert secretscan.find_in_layer(io.BytesIO(layer), secretscan.needles()) == found

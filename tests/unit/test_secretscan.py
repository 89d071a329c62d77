"""The scan of a built image for the build's secrets (issue 21, defect 11; issue 32, defects 2 and 4),
on real tars shaped as `docker save` writes them (an OCI layout: blobs named by digest, layers
uncompressed and named by diff_id) and as a registry serves them (gzip): every written form of a
secret, in contents and in names (file, directory, long PAX and GNU paths, link targets, PAX
records), the blob and file named."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile

import pytest

from builder import log
from builder.checks import secretscan

SECRET = "hf_0123456789abcdef"


@pytest.fixture(autouse=True)
def no_secrets(monkeypatch):
    monkeypatch.setattr(log, "_secrets", set())


def _member(name: str, data: bytes = b"", **fields) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in fields.items():
        setattr(info, key, value)
    return info, data


def _layer(members: list[tuple[tarfile.TarInfo, bytes]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buf.getvalue()


def _files(files: dict[str, bytes]) -> bytes:
    return _layer([_member(name, data) for name, data in files.items()])


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _saved(layers: list[bytes], config: bytes = b'{"config": {}}') -> io.BytesIO:
    """An image as `docker save` (Docker >= 25) streams it: blobs, then index.json and manifest.json."""
    manifest = json.dumps({"config": {"digest": _digest(config)}, "layers": [{"digest": _digest(b)} for b in layers]})
    top = {
        "index.json": json.dumps({"manifests": [{"digest": _digest(manifest.encode())}]}).encode(),
        "manifest.json": json.dumps([{"Config": "blobs/sha256/" + _digest(config)[7:]}]).encode(),
        "oci-layout": b'{"imageLayoutVersion": "1.0.0"}',
    }
    blobs = {"blobs/sha256/" + _digest(b)[7:]: b for b in [*layers, config, manifest.encode()]}
    return io.BytesIO(_layer([_member(n, d) for n, d in {**blobs, **top}.items()], tarfile.USTAR_FORMAT))


def _scan(layers: list[bytes], config: bytes = b'{"config": {}}', skip=frozenset()) -> secretscan.Hit | None:
    return secretscan.find_in_archive(_saved(layers, config), secretscan.needles(), skip)


def test_a_secret_copied_into_a_layer_is_found_with_its_layer_and_file():
    log.register_secret(SECRET)
    clean = _files({"usr/lib/ok.py": b"print(1)"})
    leak = _files({"usr/lib/python3/site-packages/k3smoke/leak.txt": b"prefix " + SECRET.encode() + b" suffix"})
    hit = _scan([clean, leak])
    assert hit == secretscan.Hit(_digest(leak), "usr/lib/python3/site-packages/k3smoke/leak.txt", "content")
    assert hit.describe().startswith(f"layer {_digest(leak)[:19]}, file '/usr/lib/python3/site-packages/")
    assert SECRET not in hit.describe()


def test_the_bases_layers_are_skipped_by_diff_id_and_a_gzipped_layer_is_read():
    log.register_secret(SECRET)
    base = _files({"etc/base-secret": SECRET.encode()})  # not ours: the pin names it
    assert _scan([base], skip=frozenset({_digest(base)})) is None
    assert _scan([base]) is not None
    leak = gzip.compress(_files({"opt/x": SECRET.encode()}))  # as a registry serves a layer
    assert _scan([leak]) == secretscan.Hit(_digest(leak), "opt/x", "content")


def test_the_shell_quoted_form_is_found_too_and_across_chunk_boundaries(monkeypatch):
    log.register_secret_forms("ATKPASS'q9x7Z", ("'ATKPASS'\"'\"'q9x7Z'",))
    monkeypatch.setattr(secretscan, "_CHUNK", 7)  # the value straddles every read
    leak = _files({"opt/env.sh": b"SCCACHE_REDIS_PASSWORD='ATKPASS'\"'\"'q9x7Z'\n"})
    assert _scan([leak]).path == "opt/env.sh"


def test_a_secret_in_the_config_is_found():
    log.register_secret(SECRET)
    config = json.dumps({"config": {"Env": [f"T={SECRET}"]}}).encode()
    hit = _scan([_files({"a": b"x"})], config)
    assert hit == secretscan.Hit(_digest(config), "", "blob") and "image config" in hit.describe()


def test_a_clean_image_passes_and_short_words_are_not_scanned_for():
    log.register_secret("abcd")  # registered for redaction, too short to look for in binaries
    log.register_secret(SECRET)
    assert _scan([_files({"bin/x": b"abcd abcd"})]) is None
    assert secretscan.needles() == [SECRET.encode()]


LONG = "opt/" + "d" * 90 + "/" + "e" * 90


@pytest.mark.parametrize(
    ("members", "fmt", "where"),
    [
        ([_member(f"opt/k3/{SECRET}", b"x")], tarfile.PAX_FORMAT, "name"),  # a file name
        ([_member(f"opt/{SECRET}", type=tarfile.DIRTYPE)], tarfile.PAX_FORMAT, "name"),  # a directory
        ([_member(f"opt/{SECRET}/cfg.json", b"{}")], tarfile.PAX_FORMAT, "name"),  # a directory in a path
        ([_member(f"{LONG}/{SECRET}/" + "f" * 120, b"x")], tarfile.PAX_FORMAT, "name"),  # a PAX path record
        ([_member(f"{LONG}/{SECRET}/" + "f" * 120, b"x")], tarfile.GNU_FORMAT, "name"),  # a GNU long name
        ([_member("o/" + "p" * 70 + f"/{SECRET}/" + "n" * 60, b"x")], tarfile.USTAR_FORMAT, "name"),  # prefix field
        ([_member("opt/link", type=tarfile.SYMTYPE, linkname=f"/run/{SECRET}")], tarfile.PAX_FORMAT, "link target"),
        (
            [_member("opt/a", b"x"), _member("opt/b", type=tarfile.LNKTYPE, linkname=f"{LONG}/{SECRET}" + "g" * 90)],
            tarfile.PAX_FORMAT,
            "link target",
        ),
        ([_member("opt/x", b"x", pax_headers={"SCHILY.xattr.user.k3": SECRET})], tarfile.PAX_FORMAT, "PAX record"),
    ],
    ids=["file", "dir", "dir-in-path", "pax-path", "gnu-longname", "ustar-prefix", "symlink", "hardlink", "xattr"],
)
def test_a_secret_written_as_a_name_is_found(members, fmt, where):
    log.register_secret(SECRET)
    layer = _layer(members, fmt)
    hit = _scan([_files({"usr/ok": b"ok"}), layer])
    assert hit is not None and (hit.blob, hit.where) == (_digest(layer), where)
    assert SECRET not in hit.describe()  # the path is shown redacted: a name can be the secret itself


def test_a_layer_that_cannot_be_read_raises_so_the_caller_refuses_the_image():
    log.register_secret(SECRET)
    broken = b"\x1f\x8b" + b"\0" * 600  # gzip magic, then garbage
    with pytest.raises((tarfile.TarError, EOFError, OSError)):
        _scan([broken])

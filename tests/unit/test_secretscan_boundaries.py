"""The secret scan's rules pinned exactly (builder/checks/secretscan.py, issue 38): a secret split
across a read at EVERY position (not one lucky offset), with the overlap sized by the longest value
looked for; the minimum length on both sides, through a real layer; what a symlink or hard link is
(its target text is searched, the link is never followed); and bytes after a layer's
end-of-archive at each place a tar writer could put them. Each test states the exact result, so a
mutant that drops a condition, shifts a comparison or skips a step changes it."""

from __future__ import annotations

import gzip
import io
import tarfile

import pytest

from builder import log
from builder.checks import secretscan
from tests.unit.test_secretscan import _digest, _files, _layer, _member, _saved

MIN = secretscan.MIN_SCANNED
SECRET = b"hf_k3Tok3n0123456789abcdef"  # 26 bytes: longer than the small chunks below


@pytest.fixture(autouse=True)
def no_secrets(monkeypatch):
    monkeypatch.setattr(log, "_secrets", set())


def _find(blob: bytes, wanted: list[bytes]) -> bytes | None:
    return secretscan.find_in_stream(io.BytesIO(blob), wanted)


# --- a secret split across reads: every split, every chunk size around the secret's length --------


@pytest.mark.parametrize("chunk", [1, 2, MIN - 1, MIN, 16, len(SECRET) - 1, len(SECRET), len(SECRET) + 1, 64])
@pytest.mark.parametrize("reads_before", [1, 2, 3])
def test_a_secret_is_found_for_every_split_position_across_a_chunk_boundary(monkeypatch, chunk, reads_before):
    monkeypatch.setattr(secretscan, "_CHUNK", chunk)
    boundary = chunk * reads_before
    for split in range(len(SECRET) + 1):  # bytes of the secret before the boundary
        if split > boundary:
            continue
        blob = b"." * (boundary - split) + SECRET + b"." * 5
        assert _find(blob, [SECRET]) == SECRET, (chunk, split)
        # the same bytes with one byte of the secret changed hold nothing: the window is no wider
        garbled = blob.replace(SECRET, SECRET[:-1] + b"#")
        assert _find(garbled, [SECRET]) is None, (chunk, split)


@pytest.mark.parametrize("split", range(1, len(SECRET)))
def test_the_overlap_is_the_longest_value_less_one_whatever_the_order_of_the_values(monkeypatch, split):
    """The tail kept between reads is sized by the LONGEST value looked for: the long one split at
    any position is found beside a short one that is absent, and a short one beside a long one."""
    monkeypatch.setattr(secretscan, "_CHUNK", 32)
    short = b"k3short1"  # MIN bytes, nowhere in the blob
    blob = b"." * (32 - split) + SECRET + b"." * 40
    for wanted in ([SECRET, short], [short, SECRET]):
        assert _find(blob, wanted) == SECRET, (split, wanted)
    # the short value split at the boundary is found too while the long one is looked for
    if split < len(short):
        blob = b"." * (32 - split) + short + b"." * 40
        assert _find(blob, [SECRET, short]) == short


def test_a_secret_split_at_every_position_at_the_real_chunk_size_inside_a_layer_file():
    # The default _CHUNK, as the scan reads a member's bytes; the secret ends exactly at the
    # boundary at split == len(SECRET) and starts exactly at it at split == 0.
    chunk = secretscan._CHUNK
    for split in (0, 1, len(SECRET) // 2, len(SECRET) - 1, len(SECRET)):
        data = b"\0" * (chunk - split) + SECRET + b"\0" * 3
        layer = _files({"opt/k3/model.bin": data})
        assert secretscan.find_in_layer(io.BytesIO(layer), [SECRET]) == ("opt/k3/model.bin", "content"), split


def test_the_first_value_of_the_list_present_is_the_one_returned():
    other = b"k3-other-token-99"
    blob = b"x" + other + b"y" + SECRET
    assert _find(blob, [SECRET, other]) == SECRET
    assert _find(blob, [other, SECRET]) == other
    assert _find(b"", [SECRET]) is None


# --- the minimum length, through the scan of an image ---------------------------------------------


@pytest.mark.parametrize(("length", "reported"), [(MIN - 1, False), (MIN, True), (MIN + 1, True)])
def test_the_minimum_length_in_content_and_in_a_name(length, reported):
    value = ("k3Z9" * 4)[:length]
    log.register_secret(value)
    log.register_secret(SECRET.decode())  # absent from every layer: the scan runs (the build scans
    # only when some value is long enough; an empty list is never passed)
    content = _files({"opt/k3/leak.txt": b"<" + value.encode() + b">"})
    named = _files({f"opt/k3/{value}.txt": b"clean"})
    for layer, where, path in ((content, "content", "opt/k3/leak.txt"), (named, "name", f"opt/k3/{value}.txt")):
        hit = secretscan.find_in_archive(_saved([layer]), secretscan.needles())
        assert hit == (secretscan.Hit(_digest(layer), path, where) if reported else None), (length, where)
    assert secretscan.needles() == ([SECRET, value.encode()] if reported else [SECRET])


def test_the_minimum_is_eight():
    # Pinned by value: a shorter minimum matches by chance in gigabytes of binaries, a longer one
    # misses a registered eight-character password.
    assert MIN == 8


# --- links: the target text is searched, the link is never followed --------------------------------


def test_a_symlink_is_not_followed_its_target_text_is_searched():
    log.register_secret(SECRET.decode())
    # a link to the BuildKit secret mount: the file it names is not in the image; the link's text
    # holds no secret, so nothing is found (following it on the host would read the secret itself)
    to_mount = _layer([_member("etc/k3/token", type=tarfile.SYMTYPE, linkname="/run/secrets/hf_token")])
    assert secretscan.find_in_archive(_saved([to_mount]), secretscan.needles()) is None
    # a link whose target text is the secret: reported as the link, by its own path
    named = _layer([_member("etc/k3/token", type=tarfile.SYMTYPE, linkname="/opt/" + SECRET.decode())])
    assert secretscan.find_in_archive(_saved([named]), secretscan.needles()) == secretscan.Hit(
        _digest(named), "etc/k3/token", "link target"
    )


def test_a_link_into_a_skipped_layer_is_not_followed_there():
    log.register_secret(SECRET.decode())
    base = _files({"opt/base/token": SECRET})  # the base's layer: skipped by its diff_id
    ours = _layer([_member("opt/k3/token", type=tarfile.SYMTYPE, linkname="../base/token")])
    assert secretscan.find_in_archive(_saved([base, ours]), secretscan.needles(), frozenset({_digest(base)})) is None
    hard = _layer([_member("opt/k3/hard", type=tarfile.LNKTYPE, linkname="opt/base/token")])
    assert secretscan.find_in_archive(_saved([base, hard]), secretscan.needles(), frozenset({_digest(base)})) is None


def test_a_hard_link_to_a_file_holding_the_secret_names_the_file_not_the_link():
    log.register_secret(SECRET.decode())
    layer = _layer(
        [_member("opt/k3/real", b"x" + SECRET), _member("opt/k3/alias", type=tarfile.LNKTYPE, linkname="opt/k3/real")]
    )
    assert secretscan.find_in_layer(io.BytesIO(layer), secretscan.needles()) == ("opt/k3/real", "content")


# --- bytes after the end-of-archive -----------------------------------------------------------------


def _tar_blocks(data: bytes) -> bytes:
    """One member's header and data blocks, with no end-of-archive after them."""
    info = tarfile.TarInfo("etc/clean.txt")
    info.size = len(data)
    return info.tobuf(tarfile.USTAR_FORMAT) + data + b"\0" * (-len(data) % 512)


@pytest.mark.parametrize("zero_blocks", [1, 2, 20])
@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_a_secret_after_each_form_of_end_of_archive_is_found(zero_blocks, compress):
    """One zero block ends the archive for tar; two is the standard; 20 is a full record. Bytes
    after any of them belong to no member and are pushed with the layer."""
    log.register_secret(SECRET.decode())
    raw = _tar_blocks(b"clean") + b"\0" * (512 * zero_blocks)
    for tail, found in ((b"", None), (SECRET, ("", "after the end of the archive"))):
        blob = raw + tail
        layer = gzip.compress(blob) if compress else blob
        assert secretscan.find_in_layer(io.BytesIO(layer), secretscan.needles()) == found, (zero_blocks, tail)


@pytest.mark.parametrize("split", [0, 1, len(SECRET) // 2, len(SECRET) - 1])
def test_a_secret_after_the_end_of_archive_split_across_reads_is_found(monkeypatch, split):
    monkeypatch.setattr(secretscan, "_CHUNK", 64)
    log.register_secret(SECRET.decode())
    raw = _tar_blocks(b"clean") + b"\0" * 1024
    # the trailing bytes are read from where tar stopped (after the first zero block): place the
    # secret so that `split` of its bytes come before a 64-byte read boundary of that stream
    trailing = b"\0" * 512 + b"." * (128 - split) + SECRET
    layer = raw[:-1024] + trailing
    assert secretscan.find_in_layer(io.BytesIO(layer), secretscan.needles()) == ("", "after the end of the archive")


def test_a_short_value_after_the_end_of_archive_is_not_looked_for():
    log.register_secret("k3short")  # MIN - 1 characters: registered for redaction only
    layer = _tar_blocks(b"clean") + b"\0" * 1024 + b"k3short"
    assert secretscan.needles() == []
    log.register_secret(SECRET.decode())
    assert secretscan.find_in_layer(io.BytesIO(layer), secretscan.needles()) is None


def test_a_secret_after_the_end_of_a_layer_is_reported_through_the_image_scan():
    log.register_secret(SECRET.decode())
    layer = _tar_blocks(b"clean") + b"\0" * 1024 + SECRET
    hit = secretscan.find_in_archive(_saved([_files({"a": b"ok"}), layer]), secretscan.needles())
    assert hit == secretscan.Hit(_digest(layer), "", "after the end of the archive")
    # the message names the layer and where in it, not the image config (a blob that is no layer)
    assert hit.describe() == f"layer {_digest(layer)[:19]}, after the end of the archive (bytes no file holds)"


# --- what the image scan walks past and what it reads (mutation survivors of the first run) -------


def test_a_clean_pax_record_is_not_a_hit():
    # Only a record whose key or value holds the secret counts: an xattr without it is no finding.
    log.register_secret(SECRET.decode())
    layer = _layer([_member("opt/k3/x", b"clean", pax_headers={"SCHILY.xattr.user.k3": "clean-value"})])
    assert secretscan.find_in_archive(_saved([layer]), secretscan.needles()) is None
    leak = _layer([_member("opt/k3/x", b"clean", pax_headers={"SCHILY.xattr.user.k3": SECRET.decode()})])
    assert secretscan.find_in_layer(io.BytesIO(leak), secretscan.needles()) == ("opt/k3/x", "PAX record")


def _archive(members: list[tuple[tarfile.TarInfo, bytes]]) -> io.BytesIO:
    return io.BytesIO(_layer(members, tarfile.USTAR_FORMAT))


def test_directories_of_the_image_archive_are_walked_past_not_an_end():
    # `docker save` writes blobs/ and blobs/sha256/ as directory entries before the blobs
    log.register_secret(SECRET.decode())
    leak = _files({"opt/k3/leak": SECRET})
    archive = _archive(
        [
            _member("blobs", type=tarfile.DIRTYPE),
            _member("blobs/sha256", type=tarfile.DIRTYPE),
            _member("blobs/sha256/" + _digest(leak)[7:], leak),
        ]
    )
    assert secretscan.find_in_archive(archive, secretscan.needles()) == secretscan.Hit(
        _digest(leak), "opt/k3/leak", "content"
    )


def test_a_skipped_base_layer_before_ours_does_not_end_the_scan():
    log.register_secret(SECRET.decode())
    base = _files({"etc/base": SECRET})
    leak = _files({"opt/k3/leak": SECRET})
    skip = frozenset({_digest(base)})
    assert secretscan.find_in_archive(_saved([base, leak]), secretscan.needles(), skip) == secretscan.Hit(
        _digest(leak), "opt/k3/leak", "content"
    )


def test_a_blob_that_starts_as_an_empty_tar_is_a_layer_and_what_follows_is_after_its_end():
    # the first 512 bytes decide: one zero block is an (empty) tar, so bytes after it are a
    # layer's bytes after its end-of-archive, not a plain blob's
    log.register_secret(SECRET.decode())
    blob = b"\0" * 512 + SECRET
    archive = _archive([_member("blobs/sha256/" + _digest(blob)[7:], blob)])
    assert secretscan.find_in_archive(archive, secretscan.needles()) == secretscan.Hit(
        _digest(blob), "", "after the end of the archive"
    )


def test_nothing_is_carried_between_reads_but_the_stream_s_own_bytes(monkeypatch):
    # a one-byte value keeps no overlap: each read is searched alone, with nothing invented
    monkeypatch.setattr(secretscan, "_CHUNK", 1)
    assert _find(b"abcd", [b"X"]) is None
    assert _find(b"abXd", [b"X"]) == b"X"

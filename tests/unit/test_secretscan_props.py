"""Properties of the secret scan (builder/checks/secretscan.py), on generated inputs (hypothesis):
a secret is found at any offset, wherever the reads split it (a chunk boundary, the short reads of
a gzip stream); every registered value of MIN_SCANNED characters or more is looked for and none
shorter; a symlink's or hard link's target is read as well as a file's bytes, in a layer and in an
image as `docker save` writes it, and only a regular file's bytes are read; a value with
characters outside ASCII is looked for as its UTF-8 bytes, and a registered written form (the
shell-quoted line of a secret file) as itself. Each property runs a few dozen fixed examples
(derandomized, no database): a failure tomorrow means the code changed, not the dice.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from builder import log
from builder.checks import secretscan
from tests.unit.test_secretscan import _digest, _saved

MUTATION_RUN = "K3_HYPOTHESIS_EXAMPLES" in os.environ
SETTINGS = settings(
    max_examples=int(os.environ.get("K3_HYPOTHESIS_EXAMPLES", "40")),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    phases=[Phase.explicit, Phase.generate] if MUTATION_RUN else list(Phase),
)
CHUNK = secretscan._CHUNK
MIN = secretscan.MIN_SCANNED
# A secret: printable, no whitespace (register_secret splits on it), none of the filler byte.
TOKEN = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="."), min_size=MIN, max_size=64
)


class ShortReads(io.RawIOBase):
    """A stream that returns at most ``step`` bytes a read, as a pipe or a gzip member may."""

    def __init__(self, data: bytes, step: int) -> None:
        self.data, self.at, self.step = data, 0, step

    def read(self, n: int = -1) -> bytes:
        n = self.step if n < 0 else min(n, self.step)
        out = self.data[self.at : self.at + n]
        self.at += len(out)
        return out


@pytest.fixture(autouse=True)
def no_secrets(monkeypatch):
    monkeypatch.setattr(log, "_secrets", set())


# --- offsets and reads ----------------------------------------------------------------------------


@SETTINGS
@given(secret=TOKEN, data=st.data())
def test_a_secret_straddling_the_chunk_boundary_is_found_at_every_split(secret, data):
    split = data.draw(st.integers(min_value=0, max_value=len(secret)), label="bytes before the boundary")
    blob = b"." * (CHUNK - split) + secret.encode() + b"." * data.draw(st.integers(0, 64))
    assert secretscan.find_in_stream(io.BytesIO(blob), [secret.encode()]) == secret.encode()


@SETTINGS
@given(
    secret=TOKEN,
    before=st.integers(min_value=0, max_value=3000),
    after=st.integers(min_value=0, max_value=300),
    step=st.integers(min_value=1, max_value=200),
)
def test_a_secret_is_found_at_any_offset_whatever_the_reads_return(secret, before, after, step):
    blob = b"." * before + secret.encode() + b"." * after
    assert secretscan.find_in_stream(ShortReads(blob, step), [secret.encode()]) == secret.encode()
    assert (
        secretscan.find_in_stream(
            ShortReads(blob.replace(secret.encode(), b"." * len(secret)), step), [secret.encode()]
        )
        is None
    )


@SETTINGS
@given(
    secrets=st.lists(TOKEN, min_size=2, max_size=5, unique=True),
    which=st.integers(min_value=0, max_value=4),
    before=st.integers(min_value=0, max_value=400),
    step=st.integers(min_value=1, max_value=64),
)
def test_each_of_several_secrets_of_other_lengths_is_found(secrets, which, before, step):
    secret = secrets[which % len(secrets)]
    blob = b"." * before + secret.encode() + b"."
    found = secretscan.find_in_stream(ShortReads(blob, step), [s.encode() for s in secrets])
    assert found is not None and found in blob


def test_a_secret_split_exactly_at_the_real_chunk_boundary_is_found():
    secret = b"k3-TOKEN-0123456789"
    for split in range(len(secret) + 1):
        blob = b"." * (CHUNK - split) + secret
        assert secretscan.find_in_stream(io.BytesIO(blob), [secret]) == secret, split


def test_an_empty_stream_holds_nothing():
    assert secretscan.find_in_stream(io.BytesIO(b""), [b"k3-TOKEN-0123"]) is None


# --- the minimum length -------------------------------------------------------------------------


@SETTINGS
@given(length=st.integers(min_value=MIN - 3, max_value=MIN + 3), data=st.data())
def test_every_length_at_and_around_the_minimum(length, data):
    value = data.draw(st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=length, max_size=length))
    log._secrets.clear()
    log.register_secret(value)
    needles = secretscan.needles()
    assert (value.encode() in needles) == (length >= MIN)
    assert all(len(n) >= MIN for n in needles)


def test_needles_are_longest_first_and_unique():
    for v in ("k3-secret-long-value", "short-k3", "short-k3", "mid-secret-k3"):
        log.register_secret(v)
    assert secretscan.needles() == [b"k3-secret-long-value", b"mid-secret-k3", b"short-k3"]


def test_the_minimum_counts_characters_as_registered():
    log.register_secret("a" * (MIN - 1))
    assert secretscan.needles() == []
    log.register_secret("b" * MIN)
    assert secretscan.needles() == [b"b" * MIN]


# --- links and layers ---------------------------------------------------------------------------


def _tar(members: list[tuple[str, str, bytes | str]], compress: bool) -> bytes:
    """A layer: (kind, name, content) with kind file, symlink or hardlink (content: its target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for kind, name, content in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                assert isinstance(content, bytes)
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
            else:
                info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
                info.linkname = str(content)
                tar.addfile(info)
    return gzip.compress(buf.getvalue()) if compress else buf.getvalue()


NAMES = st.lists(st.text(alphabet="abcdefghij", min_size=1, max_size=8), min_size=1, max_size=6, unique=True).map(
    lambda names: [f"usr/lib/{n}" for n in names]
)


def _where(kind: str) -> str:
    return "content" if kind == "file" else "link target"


@SETTINGS
@given(names=NAMES, secret=TOKEN, data=st.data())
def test_the_first_member_holding_a_secret_is_named(names, secret, data):
    kinds = [data.draw(st.sampled_from(["file", "symlink", "hardlink"]), label=n) for n in names]
    holder = data.draw(st.integers(0, len(names) - 1), label="holder")
    members = []
    for i, (kind, name) in enumerate(zip(kinds, names, strict=True)):
        if kind == "file":
            pad = data.draw(st.integers(0, 2000), label=f"pad {name}")
            content: bytes | str = b"." * pad + (secret.encode() if i == holder else b"") + b"\n"
        else:
            content = f"../share/{secret}" if i == holder else "../share/target"
        members.append((kind, name, content))
    wanted = [secret.encode()]
    for compress in (False, True):
        layer = _tar(members, compress)
        assert secretscan.find_in_layer(io.BytesIO(layer), wanted) == (names[holder], _where(kinds[holder]))
        # the same layer in an image as `docker save` writes it: the blob and the member named
        found = secretscan.find_in_archive(_saved([_tar([("file", "ok", b"ok")], False), layer]), wanted)
        assert found == secretscan.Hit(_digest(layer), names[holder], _where(kinds[holder]))
    clean = _tar([m for i, m in enumerate(members) if i != holder], True)
    assert secretscan.find_in_layer(io.BytesIO(clean), wanted) is None
    assert secretscan.find_in_archive(_saved([clean]), wanted) is None


def test_a_symlink_to_a_file_holding_the_secret_names_the_file():
    layer = _tar(
        [("symlink", "etc/token", "../opt/k3/token"), ("file", "opt/k3/token", b"k3-TOKEN-0123456789\n")], True
    )
    assert secretscan.find_in_layer(io.BytesIO(layer), [b"k3-TOKEN-0123456789"]) == ("opt/k3/token", "content")


def test_only_regular_files_are_read_directories_and_devices_by_name(monkeypatch):
    # Their names are scanned (as every member's is); only a regular file has bytes to read.
    read: list[str] = []
    extract = tarfile.TarFile.extractfile
    monkeypatch.setattr(tarfile.TarFile, "extractfile", lambda tar, m: (read.append(m.name), extract(tar, m))[1])
    kinds = (tarfile.DIRTYPE, tarfile.FIFOTYPE, tarfile.CHRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE)

    def layer(name: str) -> io.BytesIO:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for kind in kinds:
                info = tarfile.TarInfo(f"{name}-{kind!r}")
                info.type = kind
                info.linkname = "plain" if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
                tar.addfile(info)
            tar.addfile(tarfile.TarInfo("plain"), io.BytesIO(b""))
        return io.BytesIO(buf.getvalue())

    assert secretscan.find_in_layer(layer("clean"), [b"k3-TOKEN-0123456789"]) is None
    assert read == ["plain"]
    assert secretscan.find_in_layer(layer("k3-TOKEN-0123456789"), [b"k3-TOKEN-0123456789"]) == (
        f"k3-TOKEN-0123456789-{tarfile.DIRTYPE!r}",
        "name",
    )


# --- encodings: what the scan claims to see ------------------------------------------------------


@SETTINGS
@given(
    secret=st.text(
        alphabet=st.characters(min_codepoint=0xA1, max_codepoint=0x2FFF, categories=["L", "N", "S"]),
        min_size=MIN,
        max_size=24,
    ),
    before=st.integers(0, 3000),
    step=st.integers(1, 97),
)
def test_a_secret_outside_ascii_is_looked_for_as_its_utf8_bytes(secret, before, step):
    log.register_secret(secret)
    needles = secretscan.needles()
    assert secret.encode("utf-8") in needles
    blob = b"." * before + secret.encode("utf-8") + b"."
    assert secretscan.find_in_stream(ShortReads(blob, step), needles) is not None


def test_a_registered_written_form_is_looked_for_as_written():
    log.register_secret_forms("k3 pass word", ("'k3 pass word'", "K3_PW='k3 pass word'"))
    needles = secretscan.needles()
    assert b"K3_PW='k3 pass word'" in needles and b"'k3 pass word'" in needles
    line = b"export K3_PW='k3 pass word'\n"
    assert secretscan.find_in_stream(io.BytesIO(b"#!/bin/sh\n" + line), needles) == b"K3_PW='k3 pass word'"


def test_nothing_comes_before_the_first_read():
    # A needle that would match only if something were put before the stream's first byte.
    assert secretscan.find_in_stream(io.BytesIO(b"k3-TOKEN-0123456789"), [b"XXXXk3-TOKEN-0123456789"]) is None
    assert secretscan.find_in_stream(ShortReads(b"3-TOKEN-0123456789", 5), [b"k3-TOKEN-0123456789"]) is None

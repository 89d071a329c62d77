"""The layer cache: a layer read once is not parsed again while its bytes are the same, the kept
reading equals a fresh one, and nothing but a blob whose bytes hash to its name is kept or used."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from builder.checks import imagefiles, layercache, layers
from tests.unit.test_runtime_view import LOWER, _saved

UPPER = [
    ("bin/.wh.ls", "file", 0o644, 0, 0, b""),
    ("etc/app/.wh..wh..opq", "file", 0o644, 0, 0, b""),
    ("etc/app/b.conf", "file", 0o644, 0, 0, b"b"),
    ("sbin", "dir", 0o755, 0, 0, b""),
    ("sbin/tool", "symlink", 0o777, 0, 0, b"../bin/ls"),
]


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(layercache, "cache_dir", lambda: tmp_path)
    return tmp_path / "layers"


def _reading(saved: layers.Layers) -> list[dict]:
    return [vars(layer) for layer in saved.ordered]


def test_a_second_reading_comes_from_the_cache_and_equals_the_first(cache, monkeypatch):
    first = layers.read(_saved(LOWER, UPPER))
    assert len(list(cache.glob("*.json"))) == 2
    assert first.ordered[0].capabilities  # what the kept entry has to carry back
    monkeypatch.setattr(layers, "read_layer", lambda *a: pytest.fail("a kept layer was parsed again"))
    second = layers.read(_saved(LOWER, UPPER))
    assert _reading(second) == _reading(first)
    assert second.removed_base_files() == first.removed_base_files()
    assert second.capabilities() == first.capabilities()


def test_a_new_layer_is_read_and_the_shared_one_is_not(cache, monkeypatch):
    layers.read(_saved(LOWER, UPPER))
    parsed = []
    real = layers.read_layer
    monkeypatch.setattr(layers, "read_layer", lambda f, d: parsed.append(d) or real(f, d))
    other = [*UPPER, ("etc/app/c.conf", "file", 0o644, 0, 0, b"c")]
    saved = layers.read(_saved(LOWER, other))
    assert parsed == [saved.ordered[1].digest]
    assert "/etc/app/c.conf" in saved.ordered[1].paths


def test_an_entry_larger_than_load_reads_is_not_written(cache, monkeypatch):
    monkeypatch.setattr(layercache, "MAX_ENTRY", 1000)
    many = [(f"usr/share/k3/{i:04d}-{'x' * 40}", "file", 0o644, 0, 0, b"") for i in range(40)]
    found = layers.read(_saved(LOWER, many))
    assert len(found.ordered[1].paths) == 40  # the layer was read
    assert [p.name.split(".")[0] for p in cache.glob("*.json")] == [found.ordered[0].digest.split(":")[1]]


def _renamed(stream: io.BytesIO, old: str, new: str) -> io.BytesIO:
    """The same save stream with the blob ``old`` (hex) named ``new``, and the manifests saying so."""
    out = io.BytesIO()
    with tarfile.open(fileobj=stream) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read()
            if member.name.endswith(".json") or len(data) < 4096:
                data = data.replace(old.encode(), new.encode())
            info = tarfile.TarInfo(member.name.replace(old, new))
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
    out.seek(0)
    return out


def test_a_blob_that_is_not_its_name_is_read_but_not_kept(cache):
    saved = _saved(LOWER)
    real = layers.read(_saved(LOWER)).ordered[0].digest.split(":")[1]
    for entry in cache.glob("*.json"):
        entry.unlink()
    liar = "ab" * 32
    found = layers.read(_renamed(saved, real, liar))
    assert "/bin/ls" in found.ordered[0].paths
    assert not list(cache.glob("*.json"))


def test_a_kept_reading_is_not_used_for_bytes_that_do_not_hash_to_its_name(cache):
    honest = layers.read(_saved(LOWER, UPPER))
    upper_hex = honest.ordered[1].digest.split(":")[1]
    other = _saved(LOWER, [("etc/app/.wh..wh..opq", "file", 0o644, 0, 0, b"")])
    other_hex = layers.read(other).ordered[1].digest.split(":")[1]
    # the second image's top layer named as the first's: its bytes are not what the entry was kept for
    forged = _renamed(_saved(LOWER, [("etc/app/.wh..wh..opq", "file", 0o644, 0, 0, b"")]), other_hex, upper_hex)
    with pytest.raises(imagefiles.UnreadableImage, match="does not hash to its name"):
        layers.read(forged)


@pytest.mark.parametrize(
    "edit",
    [
        lambda doc: doc["layer"].update(paths="/bin/ls"),
        lambda doc: doc["layer"].update(capabilities={"/bin/ping": "not hex"}),
        lambda doc: doc["layer"].pop("links"),
        lambda doc: doc.update(reader="0" * 16),
        lambda doc: doc.update(digest="cd" * 32),
    ],
)
def test_an_entry_of_the_wrong_shape_is_a_miss_and_the_layer_is_read_again(cache, monkeypatch, edit):
    first = layers.read(_saved(LOWER))
    (entry,) = cache.glob("*.json")
    doc = json.loads(entry.read_text())
    edit(doc)
    entry.write_text(json.dumps(doc))
    parsed = []
    real = layers.read_layer
    monkeypatch.setattr(layers, "read_layer", lambda f, d: parsed.append(d) or real(f, d))
    again = layers.read(_saved(LOWER))
    assert parsed == [first.ordered[0].digest] and _reading(again) == _reading(first)


def _reader_of(tree) -> str:
    """layercache.READER as a fresh interpreter computes it from the copy of builder/ at ``tree``."""
    code = "from builder.checks import layercache; print(layercache.READER)"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True).stdout


@pytest.mark.parametrize("source", ["layers.py", "imagefiles.py"])
def test_an_edit_to_what_the_reading_depends_on_reads_every_layer_again(tmp_path, source):
    """The reader is layers.py and what it takes from imagefiles.py (the members' bounds, the forms a
    file capability takes): a reading kept before an edit to either is not used after it."""
    shutil.copytree(Path(layercache.__file__).parents[1], tmp_path / "builder")
    before = _reader_of(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{16}\n", before), before
    with (tmp_path / "builder" / "checks" / source).open("a") as fh:
        fh.write("# an edit\n")
    assert _reader_of(tmp_path) != before

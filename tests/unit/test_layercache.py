"""The layer cache: a layer read once is not parsed again while its bytes are the same, the kept
reading equals a fresh one, and nothing but a blob whose bytes hash to its name is kept or used."""

from __future__ import annotations

import contextlib
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

from builder.checks import boundary, imagefiles, layercache, layers
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


def _with_diff_ids(stream: io.BytesIO) -> tuple[io.BytesIO, list[str]]:
    """The save stream with its config listing its layers' diff_ids (what the engine's own save
    writes: uncompressed layer blobs named by their diff_id), and those diff_ids."""
    with tarfile.open(fileobj=stream) as src:
        members = [(m, src.extractfile(m).read()) for m in src.getmembers()]
    manifest = json.loads(next(data for m, data in members if m.name == "manifest.json"))
    diff_ids = ["sha256:" + name.rsplit("/", 1)[1] for name in manifest[0]["Layers"]]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as dst:
        for member, data in members:
            if member.name == "blobs/sha256/cfg":
                data = json.dumps({"rootfs": {"diff_ids": diff_ids}}).encode()
            info = tarfile.TarInfo(member.name)
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
    out.seek(0)
    return out, diff_ids


class _Engine:
    """What boundary.read_layers asks of the engine: the image's inspect JSON and its save stream."""

    def __init__(self, *layer_members: list[tuple], inspect: str | None = None) -> None:
        self.saved, self.diff_ids = _with_diff_ids(_saved(*layer_members))
        self.inspect = inspect
        self.streamed = 0

    def image_inspect(self, ref: str) -> str:
        if self.inspect is not None:
            return self.inspect
        return json.dumps([{"Id": ref, "RootFS": {"Type": "layers", "Layers": self.diff_ids}}])

    @contextlib.contextmanager
    def export_image(self, image_id: str):
        self.streamed += 1
        self.saved.seek(0)
        yield self.saved


def test_an_image_whose_every_layer_is_kept_is_not_streamed_again_and_reads_the_same(cache, monkeypatch):
    engine = _Engine(LOWER, UPPER)
    first = boundary.read_layers(engine, "sha256:img")
    assert engine.streamed == 1 and [layer.diff_id for layer in first.ordered] == engine.diff_ids
    monkeypatch.setattr(layers, "read_layer", lambda *a: pytest.fail("a kept layer was parsed again"))
    second = boundary.read_layers(engine, "sha256:img")
    assert engine.streamed == 1  # the engine's diff_ids named kept readings: no second save
    assert _reading(second) == _reading(first)
    assert second.removed_base_files() == first.removed_base_files()
    assert second.capabilities() == first.capabilities()
    assert second.base_count(layers.PinnedBase("base@sha256:x", (engine.diff_ids[0],))) == 1


def test_a_layer_that_is_not_kept_streams_the_image(cache):
    boundary.read_layers(_Engine(LOWER, UPPER), "sha256:img")
    changed = _Engine(LOWER, [*UPPER, ("etc/app/c.conf", "file", 0o644, 0, 0, b"c")])
    found = boundary.read_layers(changed, "sha256:other")
    assert changed.streamed == 1  # its top layer's digest names no kept reading
    assert "/etc/app/c.conf" in found.ordered[1].paths


@pytest.mark.parametrize(
    "inspect",
    [
        "not json",
        "[]",
        "{}",
        json.dumps([{"RootFS": {"Layers": "sha256:ab"}}]),
        json.dumps([{"RootFS": {"Layers": [7]}}]),
        json.dumps([{"RootFS": {}}]),
    ],
)
def test_an_image_the_engine_lists_no_layers_of_is_streamed(cache, inspect):
    boundary.read_layers(_Engine(LOWER), "sha256:img")
    engine = _Engine(LOWER, inspect=inspect)
    assert "/bin/ls" in boundary.read_layers(engine, "sha256:img").ordered[0].paths
    assert engine.streamed == 1


def test_a_kept_entry_of_the_wrong_shape_streams_the_image(cache):
    engine = _Engine(LOWER)
    boundary.read_layers(engine, "sha256:img")
    (entry,) = cache.glob("*.json")
    doc = json.loads(entry.read_text())
    doc["layer"]["paths"] = "/bin/ls"
    entry.write_text(json.dumps(doc))
    assert "/bin/ls" in boundary.read_layers(engine, "sha256:img").ordered[0].paths
    assert engine.streamed == 2


def test_kept_needs_every_layer_and_a_sha256_name(cache):
    saved = layers.read(_saved(LOWER, UPPER))
    names = [layer.digest for layer in saved.ordered]
    assert layers.kept(names) is not None
    assert layers.kept([*names, "sha256:" + "ef" * 32]) is None
    assert layers.kept(["sha512:" + names[0].split(":")[1]]) is None
    assert layers.kept([]) is None

"""What an image index may name (builder/engine/registry.py ``index_entry``): image manifests only,
each entry's platform its config's (os, architecture, variant), matching the matrix's platform key;
and the per-platform builds ask buildx for no attestations (its default provenance would make the
pushed digest an image + attestation index)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from builder.engine.buildx import DockerEngine
from builder.engine.registry import index_entry
from builder.engine.seam import BuildRequest
from builder.errors import BuildError
from tests.unit.fakeengine import FakeEngine

NAME = "registry.test:5000/k3/smoke"


def _image(engine: FakeEngine, tag: str, config: dict) -> str:
    return engine.registry.push(NAME, tag, config, [b"layer " + tag.encode()])


def test_the_entry_takes_os_architecture_and_variant_from_the_config():
    engine = FakeEngine()
    arm = _image(engine, "arm", {"os": "linux", "architecture": "arm64", "variant": "v8"})
    amd = _image(engine, "amd", {"os": "linux", "architecture": "amd64"})
    digest = engine.registry.push_index(NAME, "t", {"linux/amd64": amd, "linux/arm64": arm})
    served = engine.registry.raw_manifest(NAME, digest).doc["manifests"]
    assert [m["platform"] for m in served] == [
        {"os": "linux", "architecture": "amd64"},
        {"os": "linux", "architecture": "arm64", "variant": "v8"},
    ]


def test_a_manifest_of_another_platform_than_its_key_is_refused():
    engine = FakeEngine()
    amd = _image(engine, "amd", {"os": "linux", "architecture": "amd64"})
    with pytest.raises(BuildError, match="its config says linux/amd64, not linux/arm64"):
        index_entry(engine.registry, NAME, "linux/arm64", amd)


def test_a_nested_index_is_refused():
    """buildx with attestations on pushes an image + attestation index: not an image manifest."""
    engine = FakeEngine()
    amd = _image(engine, "amd", {"os": "linux", "architecture": "amd64"})
    nested = engine.registry.push_index(NAME, "nested", {"linux/amd64": amd})
    with pytest.raises(BuildError, match="is not an image manifest"):
        engine.registry.push_index(NAME, "t", {"linux/amd64": nested})


def test_the_platform_builds_turn_buildx_attestations_off(tmp_path: Path):
    seen: dict = {}

    def build(*args, **kwargs):
        seen.update(kwargs)
        return iter(())

    docker = SimpleNamespace(buildx=SimpleNamespace(build=build))
    engine = DockerEngine(docker)  # type: ignore[arg-type]
    req = BuildRequest(tmp_path, tmp_path / "Dockerfile", ("x:t",), {}, platform="linux/arm64")
    list(engine._buildx_lines(req, tmp_path, tmp_path / "meta.json"))
    assert (seen["provenance"], seen["sbom"], seen["platforms"]) == (False, False, ["linux/arm64"])


def test_build_compare_says_which_platform_of_an_index_it_compares():
    from builder.host.compare import Comparison

    empty = {"same": 0, "changed": [], "only_ours": [], "only_reference": []}
    sections = {k: dict(empty) for k in ("python distributions", "os packages", "cuda", "labels")}
    c = Comparison("ours:t", "theirs:t", sections)
    assert c.summary()[2].startswith("platform:  linux/amd64 (of an image index, only")
    assert c.to_json()["platform"] == "linux/amd64"
    assert "platform:" not in c.markdown()  # the folded details start after the header lines

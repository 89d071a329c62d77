"""An edited index record (locks/smoke/image.json of kind image-index) is evidence: refused (exit 2),
never rebuilt over; only the stale case (a platform recorded again since, by a build that failed on
another platform) is published again. Same fixtures as test_multiplatform.py (fake engine)."""

from __future__ import annotations

import json

import pytest

from builder.config import contract
from builder.config.options import BuildOptions
from builder.errors import RecordError
from builder.pipeline import build as pipeline
from builder.records import index
from tests.unit.fakeengine import FakeEngine
from tests.unit.test_multiplatform import both, checks  # noqa: F401
from tests.unit.test_pipeline_ordering import smoke_repos  # noqa: F401


def _edit(plan, change) -> bytes:
    path = plan.record_dir / contract.RECORD_NAME
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path.read_bytes()


def _arm_digest(doc):
    doc["platforms"]["linux/arm64"]["digest"] = "sha256:" + "f" * 64


def _arm_record_sha(doc):
    doc["platforms"]["linux/arm64"]["record_sha256"] = "0" * 64


def _tag(doc):
    doc["tag"] = "other"


def _index_digest(doc):
    doc["digest"] = "sha256:" + "c" * 64
    doc["image"] = doc["image"].split("@")[0] + "@" + doc["digest"]


def _drop_arm(doc):
    del doc["platforms"]["linux/arm64"]


@pytest.mark.parametrize("change", [_arm_digest, _arm_record_sha, _tag, _index_digest, _drop_arm])
def test_an_edited_index_record_is_refused_not_overwritten(both, checks, change):  # noqa: F811
    engine = FakeEngine()
    pipeline.build(both, engine, BuildOptions())
    edited = _edit(both, change)
    with pytest.raises(RecordError, match="the index record set does not hold") as info:
        pipeline.build(both, engine, BuildOptions())
    assert info.value.exit_code == 2
    assert (both.record_dir / contract.RECORD_NAME).read_bytes() == edited  # the evidence left as it was


def test_an_unedited_record_still_rebuilds_as_up_to_date(both, checks):  # noqa: F811
    engine = FakeEngine()
    first = pipeline.build(both, engine, BuildOptions())
    again = pipeline.build(both, engine, BuildOptions())
    assert again.up_to_date and again.digest == first.digest
    assert index.read(both.record_dir / contract.RECORD_NAME).digest == first.digest


def test_each_platform_s_provenance_names_its_own_record_for_the_wheel_records(both, checks):  # noqa: F811
    """wheel_records are in the platform's own image.json; locks/smoke/image.json is the index's."""
    import base64

    pipeline.build(both, FakeEngine(), BuildOptions())
    for sub in ("linux-amd64", "linux-arm64"):
        prov = json.loads((both.record_dir / sub / contract.PROVENANCE_NAME).read_text())
        deps = json.loads(base64.b64decode(prov["payload"]))["predicate"]["buildDefinition"]["resolvedDependencies"]
        (uri,) = [d["uri"] for d in deps if d["name"] == "wheel-records"]
        assert uri.endswith(f"locks/smoke/{sub}/image.json"), uri
        assert json.loads((both.record_dir / sub / "image.json").read_text()).get(contract.RECORD_WHEELS) is not None


def test_build_reproduce_reproduces_each_platform_from_its_own_record(both, checks):  # noqa: F811
    """locks/smoke/image.json is the index's (no inputs): each platform is rebuilt from its own."""
    engine = FakeEngine()
    out = pipeline.build(both, engine, BuildOptions())
    built = len(engine.requests)
    results = pipeline.reproduce_all(both, engine, BuildOptions())
    again = engine.requests[built:]
    assert [(r.platform, r.tags) for r in again] == [
        (p, (f"{both.target.image.name}:{both.target.image.tag}-linux-{a}-reproduce",))
        for p, a in (("linux/amd64", "amd64"), ("linux/arm64", "arm64"))
    ]
    assert [(r.target, r.reproduced, r.recorded) for r in results] == [
        (f"smoke {o.platform}", True, o.digest) for o in out.platforms
    ]

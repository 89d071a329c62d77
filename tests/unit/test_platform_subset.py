"""`build --platform` on a target built into an image index (builder/pipeline/publishindex.py): a
platform left out joins the index only as recorded, unchanged and served. An edited record, changed
inputs, a moved <tag>-<os>-<arch> or no record at all (a target that named one platform until now)
is refused before anything is built, and the tag keeps the index it had. Fake engine, the smoke
matrix naming linux/amd64 and linux/arm64 (tests/unit/test_multiplatform.py)."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from builder.checks import runner
from builder.config import contract, matrix
from builder.config.options import BuildOptions
from builder.errors import ConfigError, RecordError
from builder.pipeline import build as pipeline
from builder.pipeline.plan import Plan
from builder.records import index
from builder.smoke import smoke
from tests.unit.fakeengine import FakeEngine
from tests.unit.test_multiplatform import (  # noqa: F401 (both, checks: fixtures)
    REGISTRY,
    _bases,
    _checkout,
    _lock_all,
    _lock_all_one,
    both,
    checks,
    named_a_second_platform,
)
from tests.unit.test_pipeline_ordering import smoke_repos  # noqa: F401
from tests.unit.test_verify_rows import _checks_passed

ARM_ONLY = BuildOptions(platforms=("linux/arm64",))


def _tagged(engine: FakeEngine, plan: Plan) -> str:
    return engine.registry.resolve_digest(plan.target.image.tagged)


def _changed_amd64(tmp_path, monkeypatch, smoke_repos):  # noqa: F811
    """Built once; then amd64's runtime base changes (its input key with it), arm64's does not."""
    monkeypatch.setattr(runner, "run", _checks_passed)
    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "checkout"
    root.mkdir()
    plan = _checkout(root, smoke_repos, _bases())
    _lock_all(plan)
    engine = FakeEngine()
    pipeline.build(plan, engine, BuildOptions())
    bases = _bases()
    bases["linux/amd64"]["runtime"] = bases["linux/amd64"]["runtime"][:-64] + "9" * 64
    return _checkout(root, smoke_repos, bases), engine


def test_an_edited_record_of_a_platform_not_built_is_refused(both, checks):  # noqa: F811
    engine = FakeEngine()
    pipeline.build(both, engine, BuildOptions())
    before, built = _tagged(engine, both), len(engine.requests)
    amd = both.record_dir / "linux-amd64" / contract.RECORD_NAME
    doc = json.loads(amd.read_text())
    doc["digest"] = "sha256:" + "f" * 64
    doc["image"] = doc["image"].split("@")[0] + "@" + doc["digest"]
    amd.write_text(json.dumps(doc, indent=2) + "\n")
    with pytest.raises(RecordError, match=r"linux-amd64/image.json: the record set does not hold") as e:
        pipeline.build(both, engine, ARM_ONLY)
    assert e.value.exit_code == 2 and "\n" not in e.value.message
    assert _tagged(engine, both) == before and len(engine.requests) == built  # nothing built, nothing pushed


def test_a_platform_not_built_whose_tag_moved_is_refused(both, checks):  # noqa: F811
    engine = FakeEngine()
    out = pipeline.build(both, engine, BuildOptions())
    arm = {o.platform: o.digest for o in out.platforms}["linux/arm64"]
    name, tag = both.target.image.name, both.target.image.tag
    engine.registry.tags[(name, contract.platform_tag(tag, "linux/amd64"))] = arm  # pushed over by hand
    with pytest.raises(RecordError, match=r"smoke linux/amd64: .*:smoke-linux-amd64 resolves to .*not the recorded"):
        pipeline.build(both, engine, ARM_ONLY)
    assert _tagged(engine, both) == out.digest


def test_a_platform_not_built_whose_inputs_changed_is_refused_not_up_to_date(tmp_path, monkeypatch, smoke_repos):  # noqa: F811
    changed, engine = _changed_amd64(tmp_path, monkeypatch, smoke_repos)
    before = _tagged(engine, changed)
    with pytest.raises(ConfigError, match=r"smoke linux/amd64: its inputs changed.*build it too.*drop --platform"):
        pipeline.build(changed, engine, ARM_ONLY)
    assert _tagged(engine, changed) == before
    out = pipeline.build(changed, engine, BuildOptions(platforms=("linux/amd64",)))  # the changed one: fine
    assert not out.up_to_date and out.changed
    assert pipeline.build(changed, engine, ARM_ONLY).up_to_date  # now every platform is


def test_a_subset_build_with_a_platform_never_recorded_is_refused(tmp_path, monkeypatch, smoke_repos, checks):  # noqa: F811
    """A target that named one platform until now: its old one-image record is no amd64 record, so an
    arm64-only build would push an index without amd64 under the tag."""
    _, engine, one, plan = named_a_second_platform(tmp_path, monkeypatch, smoke_repos)
    with pytest.raises(RecordError, match=r"smoke linux/amd64: no record in .*build all platforms first"):
        pipeline.build(plan, engine, ARM_ONLY)
    assert _tagged(engine, plan) == one.digest  # the one image, not an index without amd64
    out = pipeline.build(plan, engine, BuildOptions())
    assert list(index.read(plan.record_dir / contract.RECORD_NAME).platforms) == ["linux/amd64", "linux/arm64"]
    assert _tagged(engine, plan) == out.digest


def _edit_index_entry(plan: Plan, field: str, value: str) -> None:
    path = plan.record_dir / contract.RECORD_NAME
    doc = json.loads(path.read_text())
    doc["platforms"]["linux/arm64"][field] = value
    path.write_text(json.dumps(doc, indent=2) + "\n")


def test_an_edited_index_entry_is_refused_whatever_the_file_times(both, checks):  # noqa: F811
    """A git checkout may write linux-arm64/image.json after image.json: a record_sha256 edit is
    still an edit (the arm64 provenance is the one the index provenance names), never rewritten."""
    import os

    engine = FakeEngine()
    pipeline.build(both, engine, BuildOptions())
    _edit_index_entry(both, "record_sha256", "0" * 64)
    edited = (both.record_dir / contract.RECORD_NAME).read_text()
    arm, st = both.record_dir / "linux-arm64" / contract.RECORD_NAME, (both.record_dir / contract.RECORD_NAME).stat()
    os.utime(arm, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(RecordError, match=r"linux/arm64: linux-arm64/image.json differs from what the index"):
        pipeline.build(both, engine, BuildOptions())
    assert (both.record_dir / contract.RECORD_NAME).read_text() == edited


def test_an_edited_field_of_a_platform_record_is_refused(both, checks):  # noqa: F811
    """A field the platform's own record set does not cover (its checks): the index names its bytes."""
    engine = FakeEngine()
    pipeline.build(both, engine, BuildOptions())
    arm = both.record_dir / "linux-arm64" / contract.RECORD_NAME
    doc = json.loads(arm.read_text())
    doc["checks"] = "passed-EDITED"
    arm.write_text(json.dumps(doc, indent=2) + "\n")
    with pytest.raises(RecordError, match=r"linux/arm64: linux-arm64/image.json differs from what the index"):
        pipeline.build(both, engine, BuildOptions())


def test_an_index_entry_naming_another_file_is_refused(both, checks):  # noqa: F811
    engine = FakeEngine()
    pipeline.build(both, engine, BuildOptions())
    _edit_index_entry(both, "record", "linux-arm64/../linux-arm64/image.json")
    with pytest.raises(RecordError, match=r"linux/arm64: names 'linux-arm64/../linux-arm64/image.json', not"):
        pipeline.build(both, engine, BuildOptions())


def test_the_first_platform_keeps_its_cache_mount_ids(both):  # noqa: F811
    """The first platform's BuildKit caches keep the ids they had before the target named
    platforms (k3-<kind>-<target>), so adding arm64 does not empty amd64's warm caches."""
    import re

    ids = {}
    for pp in both.platform_plans():
        ids[str(pp.platform)] = set(re.findall(r"--mount=type=cache,id=([^,]+),", pp.dockerfile.read_text()))
    assert ids["linux/amd64"] and all(re.fullmatch(r"k3-[a-z]+-smoke", i) for i in ids["linux/amd64"])
    assert ids["linux/arm64"] == {f"{i}-linux-arm64" for i in ids["linux/amd64"]}


def test_reproduce_of_a_platform_the_target_does_not_name_fails(both, checks):  # noqa: F811
    from builder.pipeline import reproduce

    engine = FakeEngine()
    pipeline.build(both, engine, BuildOptions())
    built = len(engine.requests)
    with pytest.raises(
        ConfigError,
        match=r"--platform linux/arm46: .*built for linux/amd64, linux/arm64 \(did you mean 'linux/arm64'\?\)",
    ) as e:
        reproduce.reproduce_all(both, engine, BuildOptions(platforms=("linux/arm46",)))
    assert e.value.exit_code == 2 and len(engine.requests) == built  # nothing rebuilt, no success


def test_platform_on_a_one_image_target_is_refused(tmp_path, monkeypatch, smoke_repos, checks):  # noqa: F811
    from builder.pipeline import reproduce

    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path / "cache"))
    text = smoke.matrix_text(REGISTRY, _bases()["linux/amd64"], smoke_repos, dt.date.today() + dt.timedelta(days=180))
    (tmp_path / "matrix.yaml").write_text(text)
    pipeline.render_all(matrix.load(tmp_path / "matrix.yaml"), ["smoke"], check=False)
    alone = Plan.of(matrix.load(tmp_path / "matrix.yaml"), "smoke")
    _lock_all_one(alone)
    engine = FakeEngine()
    for run in (pipeline.build, reproduce.reproduce_all):
        with pytest.raises(
            ConfigError, match=r"--platform linux/amd64: target smoke names no platforms .*drop --platform"
        ):
            run(alone, engine, BuildOptions(platforms=("linux/amd64",)))
    assert not engine.requests


def test_every_platform_s_emulation_refusal_comes_before_any_build(both, checks, monkeypatch):  # noqa: F811
    """On an amd64-only builder a cu129 arm64 compile is refused before the amd64 one runs (the
    smoke is exempt from the refusal, so it stands in for cu129 here)."""
    from builder.engine.seam import EngineInfo
    from builder.pipeline import context, publishindex

    engine = FakeEngine()
    info = EngineInfo("27.5.1", "0.20.0", "fake", engine.driver, 4, 2**34, native=("linux/amd64",))
    monkeypatch.setattr(engine, "preflight", lambda builder=None: info)
    real = context.emulated_refused
    monkeypatch.setattr(publishindex, "emulated_refused", lambda t, p, n, a: real("cu129", p, n, a), raising=False)
    with pytest.raises(ConfigError, match=r"cu129 linux/arm64: .*emulated"):
        pipeline.build(both, engine, BuildOptions())
    assert not engine.requests  # amd64 not built first
    pipeline.build(both, engine, BuildOptions(allow_emulated=True))
    assert [r.platform for r in engine.requests] == ["linux/amd64", "linux/arm64"]

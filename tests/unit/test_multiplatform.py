"""One build, one image index (builder/pipeline/publishindex.py), on the smoke target naming
linux/amd64 and linux/arm64 as `build smoke-init --arm64` makes it, with the fake engine
(tests/unit/fakeengine.py): each platform built with --platform, pushed as <tag>-<os>-<arch>,
recorded in locks/smoke/<os>-<arch>/; one index under the tag naming both manifests, recorded in
locks/smoke/image.json (builder/records/index.py) with its provenance; per-platform "up to date";
`build verify` over every platform's record set and the index rows.

Real: the smoke matrix and repositories, both Dockerfiles as rendered, the offline checks, the
context, the SBOMs and provenances, the record sets. Stand-ins, as in test_pipeline_ordering.py:
the locks (build lock's format, for the matrix's inputs, wheels in the cache), and the image checks
(builder/checks/runner.py ``run``).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json

import pytest

from builder.checks import runner
from builder.config import contract, matrix
from builder.config.options import BuildOptions
from builder.engine.buildx import ImageConfig
from builder.errors import ConfigError, RecordError
from builder.pipeline import build as pipeline
from builder.pipeline.plan import Plan
from builder.records import artifacts, index, verifyindex
from builder.records.verify import verify_targets
from builder.smoke import smoke, smokearm64
from builder.source import pinned as source
from tests.conftest import REPO
from tests.unit.fakeengine import FakeEngine, two_platform_base
from tests.unit.test_pipeline_ordering import BUILD, REGISTRY, RUNTIME, Checks, _write_lock, smoke_repos  # noqa: F401
from tests.unit.test_verify_rows import _checks_passed

PLATFORMS = ("linux/amd64", "linux/arm64")


def _bases(arm_runtime: str = "a") -> dict:
    """smokearm64.index_bases' shape, with made-up digests (the fake registry serves no bases)."""
    amd = {
        "devel": f"{REGISTRY}/k3/smoke-devel:t@sha256:" + "d" * 64,
        "runtime": f"{REGISTRY}/k3/smoke-base:t@sha256:" + "b" * 64,
    }
    arm = {
        "devel": f"{REGISTRY}/k3/smoke-devel:t@sha256:" + "e" * 64,
        "runtime": f"{REGISTRY}/k3/smoke-base:t@sha256:" + arm_runtime * 64,
    }
    return {
        "linux/amd64": amd,
        "linux/arm64": arm,
        "index": {"devel": "sha256:" + "1" * 64, "runtime": "sha256:" + "2" * 64},
    }


def _checkout(root, repos, bases: dict) -> Plan:
    text = smoke.matrix_text(REGISTRY, bases["linux/amd64"], repos, dt.date.today() + dt.timedelta(days=180))
    (root / "matrix.yaml").write_text(smokearm64.with_platforms(text, bases))
    loaded = matrix.load(root / "matrix.yaml")
    pipeline.render_all(loaded, ["smoke"], check=False)
    return Plan.of(loaded, "smoke")


def _lock_all(plan: Plan) -> None:
    pinned = source.fetch(plan.target.source)
    for pp in plan.platform_plans():
        _write_lock(pp, pinned, "runtime", RUNTIME)
        _write_lock(pp, pinned, "build", BUILD)


@pytest.fixture()
def both(tmp_path, monkeypatch, smoke_repos):  # noqa: F811
    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "checkout"
    root.mkdir()
    plan = _checkout(root, smoke_repos, _bases())
    assert plan.indexed and plan.target.platform_names() == PLATFORMS
    _lock_all(plan)
    return plan


@pytest.fixture()
def checks(monkeypatch):
    return Checks(monkeypatch)


def _platform_arch(engine: FakeEngine, name: str, digest: str) -> str:
    doc = engine.registry.raw_manifest(name, digest).doc
    return json.loads(engine.registry.blobs[doc["config"]["digest"]])["architecture"]


def test_one_build_makes_one_index_of_both_platforms(both, checks):
    engine = FakeEngine()
    out = pipeline.build(both, engine, BuildOptions())
    name = both.target.image.name
    # Each platform built for itself, with its own Dockerfile, and pushed under <tag>-<os>-<arch>.
    assert [r.platform for r in engine.requests] == list(PLATFORMS)
    assert [r.tags for r in engine.requests] == [
        (f"{name}:{both.target.image.tag}-linux-{a}",) for a in ("amd64", "arm64")
    ]
    assert engine.requests[0].dockerfile.read_text() != engine.requests[1].dockerfile.read_text()
    # One index under the tag, naming both manifests by digest, each its platform's image.
    assert engine.registry.resolve_digest(both.target.image.tagged) == out.digest
    served = engine.registry.raw_manifest(name, out.digest).doc
    entries = {f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"] for m in served["manifests"]}
    assert entries == {o.platform: o.digest for o in out.platforms}
    assert {p: _platform_arch(engine, name, d) for p, d in entries.items()} == {
        "linux/amd64": "amd64",
        "linux/arm64": "arm64",
    }
    # Each platform checked on its own image; the index record names both, with their records.
    assert checks.images == [f"{name}@{entries[p]}" for p in PLATFORMS]
    rec = index.read(both.record_dir / contract.RECORD_NAME)
    assert rec is not None and (rec.digest, rec.image) == (out.digest, f"{name}@{out.digest}")
    assert rec.manifests() == entries and rec.tag == both.target.image.tag
    assert [e["record"] for e in rec.platforms.values()] == ["linux-amd64/image.json", "linux-arm64/image.json"]
    for p in PLATFORMS:
        one = json.loads((both.record_dir / p.replace("/", "-") / "image.json").read_text())
        assert (one["platform"], one["digest"]) == (p, entries[p])
    # The index provenance: subjects the index then every manifest; attached to the index.
    prov = (both.record_dir / contract.PROVENANCE_NAME).read_bytes()
    subjects = json.loads(base64.b64decode(json.loads(prov)["payload"]))["subject"]
    assert ["sha256:" + s["digest"]["sha256"] for s in subjects] == [out.digest, *entries.values()]
    assert engine.registry.referrers(name, out.digest)[artifacts.PROVENANCE_TYPE] == prov
    for p in PLATFORMS:  # each platform's provenance names the files that platform's build read
        own = json.loads((both.record_dir / p.replace("/", "-") / contract.PROVENANCE_NAME).read_text())
        deps = json.loads(base64.b64decode(own["payload"]))["predicate"]["buildDefinition"]["resolvedDependencies"]
        uris = {d["name"]: d["uri"] for d in deps}
        sub = "/linux-arm64" if p == "linux/arm64" else ""
        assert uris["lock"].endswith(f"locks/smoke{sub}/requirements.txt")
        assert uris["dockerfile"].endswith(f"dockerfiles/smoke{sub}/Dockerfile")
    from builder.commands.build import _build_doc  # `build --json`: the index, then each platform

    doc = _build_doc(out)
    assert (doc["digest"], [(p["platform"], p["digest"]) for p in doc["platforms"]]) == (
        out.digest,
        list(entries.items()),
    )


def test_unchanged_inputs_are_up_to_date_per_platform(both, checks):
    engine = FakeEngine()
    first = pipeline.build(both, engine, BuildOptions())
    record = (both.record_dir / contract.RECORD_NAME).read_bytes()
    again = pipeline.build(both, engine, BuildOptions())
    assert engine.builds() == 2  # nothing built the second time
    assert again.up_to_date and again.digest == first.digest and all(o.up_to_date for o in again.platforms)
    assert (both.record_dir / contract.RECORD_NAME).read_bytes() == record


def test_an_arm64_only_change_leaves_the_amd64_manifest_alone(tmp_path, monkeypatch, smoke_repos, checks):  # noqa: F811
    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "checkout"
    root.mkdir()
    plan = _checkout(root, smoke_repos, _bases("a"))
    _lock_all(plan)
    engine = FakeEngine()
    first = pipeline.build(plan, engine, BuildOptions())
    amd_record = (plan.record_dir / "linux-amd64" / "image.json").read_bytes()
    changed = _checkout(root, smoke_repos, _bases("c"))  # another arm64 runtime base, nothing else
    second = pipeline.build(changed, engine, BuildOptions())
    assert engine.builds() == 3  # arm64 alone built again
    assert engine.requests[-1].platform == "linux/arm64"
    amd_first, arm_first = (o.digest for o in first.platforms)
    amd_second, arm_second = (o.digest for o in second.platforms)
    assert amd_second == amd_first and second.platforms[0].up_to_date
    assert arm_second != arm_first and second.digest != first.digest
    assert (plan.record_dir / "linux-amd64" / "image.json").read_bytes() == amd_record
    assert index.read(plan.record_dir / "image.json").manifests() == {
        "linux/amd64": amd_first,
        "linux/arm64": arm_second,
    }


def test_verify_passes_then_finds_a_tampered_arm64_record(both, monkeypatch):
    monkeypatch.setattr(runner, "run", _checks_passed)  # with the gpu facts a passing build records
    engine = FakeEngine()
    pipeline.build(both, engine, BuildOptions())
    loaded = matrix.load(both.root / "matrix.yaml")
    rows = verify_targets(loaded, ["smoke"], engine, explicit=True)
    failed = [(row.check, row.detail) for _, row in rows if not row.ok]
    assert failed == []
    checked = [row.check for _, row in rows]
    assert [name for name, _, _ in verifyindex.INDEX_ROWS] == checked[: len(verifyindex.INDEX_ROWS)]
    assert any(c.startswith("linux/arm64: ") for c in checked) and any(c.startswith("linux/amd64: ") for c in checked)
    arm = both.record_dir / "linux-arm64" / "image.json"
    doc = json.loads(arm.read_text())
    doc["digest"] = "sha256:" + "f" * 64
    doc["image"] = doc["image"].split("@")[0] + "@" + doc["digest"]
    arm.write_text(json.dumps(doc, indent=2) + "\n")
    rows = verify_targets(loaded, ["smoke"], engine, explicit=True)
    failed = {row.check: row.detail for _, row in rows if not row.ok}
    assert "index <-> platform records" in failed and "linux/arm64" in failed["index <-> platform records"]
    assert "linux/arm64: image.json <-> audit files" in failed
    assert not any(c.startswith("linux/amd64: ") for c in failed)
    with pytest.raises(RecordError, match="linux-arm64/image.json: the record set does not hold"):
        pipeline.build(both, engine, BuildOptions())  # evidence: refused, never rebuilt over


def test_the_auditor_page_lists_the_index_rows():
    assert verifyindex.table_markdown() in (REPO / "docs" / "auditor.md").read_text()


def test_build_test_checks_each_platform_on_its_platform(both, checks, monkeypatch):
    engine = FakeEngine()
    out = pipeline.build(both, engine, BuildOptions())
    seen = []

    def run(engine, ref, expect, junit):
        seen.append((ref, expect.platform, expect.emulated))
        junit.parent.mkdir(parents=True, exist_ok=True)  # as the real runner makes it
        return checks.run(engine, ref, expect, junit)

    monkeypatch.setattr(runner, "run", run)
    monkeypatch.setattr(runner, "host_platform", lambda: "linux/amd64")
    reports = pipeline.test(both, engine, None)
    name = both.target.image.name
    want = [(f"{name}@{o.digest}", o.platform, o.platform == "linux/arm64") for o in out.platforms]
    assert seen == want and [r.image for r in reports] == [w[0] for w in want]
    seen.clear()  # --image an index: each platform's manifest it names
    pipeline.test(both, engine, out.image)
    assert seen == want
    with pytest.raises(ConfigError, match="not an image index naming linux/amd64, linux/arm64"):
        pipeline.test(both, engine, out.platforms[0].image)


def test_build_test_platform_checks_one_platform_image(both, checks, monkeypatch):
    """`build test --platform P`: one platform of the target, from the record, from an index, or
    from one image of P (a plain manifest); without --platform, a one-platform image is refused
    naming the option; an image of another platform, or a platform no target names, is refused."""
    engine = FakeEngine()
    out = pipeline.build(both, engine, BuildOptions())
    seen = []

    def run(engine, ref, expect, junit):
        seen.append((ref, expect.platform, expect.emulated))
        junit.parent.mkdir(parents=True, exist_ok=True)
        return checks.run(engine, ref, expect, junit)

    monkeypatch.setattr(runner, "run", run)
    monkeypatch.setattr(runner, "host_platform", lambda: "linux/amd64")
    amd, arm = out.platforms
    for image, platform, want in (
        (amd.image, "linux/amd64", (amd.image, "linux/amd64", False)),  # one image: a plain manifest
        (arm.image, "linux/arm64", (arm.image, "linux/arm64", True)),
        (out.image, "linux/arm64", (arm.image, "linux/arm64", True)),  # the index: its arm64 manifest
        (None, "linux/amd64", (amd.image, "linux/amd64", False)),  # the recorded amd64 manifest
    ):
        seen.clear()
        reports = pipeline.test(both, engine, image, platform)
        assert seen == [want] and [r.image for r in reports] == [want[0]]
    seen.clear()
    with pytest.raises(ConfigError, match="one linux/amd64 image, not an image index .* pass --platform linux/amd64"):
        pipeline.test(both, engine, amd.image)
    with pytest.raises(ConfigError, match="a linux/arm64 image, not linux/amd64"):
        pipeline.test(both, engine, arm.image, "linux/amd64")
    with pytest.raises(ConfigError, match=r"--platform linux/amd46: .* \(did you mean 'linux/amd64'\?\)"):
        pipeline.test(both, engine, amd.image, "linux/amd46")
    assert seen == []  # nothing checked on a refusal
    # An index that lacks the platform --platform names: refused naming it; the platform it has is checked.
    name, digest = amd.image.split("@")
    only_amd = f"{name}@" + engine.registry.push_index(name, "amd-only", {"linux/amd64": digest})
    with pytest.raises(ConfigError, match=r"not an image index naming linux/arm64 \(target smoke"):
        pipeline.test(both, engine, only_amd, "linux/arm64")
    with pytest.raises(ConfigError, match=r"not an image index naming linux/arm64 \(target smoke"):
        pipeline.test(both, engine, only_amd)  # without --platform: every platform of the target
    assert seen == []
    assert [r.image for r in pipeline.test(both, engine, only_amd, "linux/amd64")] == [amd.image]
    seen.clear()
    # A plain manifest whose config does not say its platform (unreadable, or an artifact): refused
    # as such, never named a "None/None image" nor matched to --platform.
    monkeypatch.setattr(engine.registry, "image_config", lambda ref, arch="amd64": {"os": "linux"})
    for platform in (None, "linux/amd64"):
        with pytest.raises(ConfigError, match="its config names no platform") as info:
            pipeline.test(both, engine, amd.image, platform)
        assert "None" not in str(info.value)
    assert seen == []


def test_build_test_platform_json_names_the_platform_checked_and_the_targets(both, checks, monkeypatch, capsys):
    """`build --json test --platform P --image ONE`: the report of P's image, with the platform it
    was checked as and the target's platforms (so a reader sees the others were not checked)."""
    from builder.cli import main

    engine = FakeEngine()
    out = pipeline.build(both, engine, BuildOptions())
    monkeypatch.setattr("builder.commands.test.docker_engine", lambda: engine)
    monkeypatch.setattr(runner, "host_platform", lambda: "linux/amd64")

    def run(engine, ref, expect, junit):
        junit.parent.mkdir(parents=True, exist_ok=True)
        return checks.run(engine, ref, expect, junit)

    monkeypatch.setattr(runner, "run", run)
    amd = out.platforms[0]
    argv = ["--matrix", str(both.matrix_path), "--json", "test", "--target", "smoke", "--platform", "linux/amd64"]
    with pytest.raises(SystemExit) as info:
        main([*argv, "--image", amd.image])
    data = json.loads(capsys.readouterr().out)
    assert info.value.code == 0, data
    assert data["platform"] == "linux/amd64" and data["target_platforms"] == list(PLATFORMS)
    assert data["image"] == amd.image and "platforms" not in data


def test_an_emulated_command_is_not_checked_and_says_so():
    """test_os_packages under QEMU: a failing os_packages.runs command is NOT CHECKED (a skip with
    the reason), natively the same failure fails; any other problem fails either way."""
    from builder.checks import checklist

    osp = runner.OsExpectations(locked=(("numactl", "1", "arm64"),), listed=(), loads=(), runs=(("numactl", "--show"),))
    failing = {"checked": 1, "problems": ["numactl --show exited 1: get_mempolicy: Function not implemented"]}
    image = "127.0.0.1:5000/k3/smoke@sha256:" + "a" * 64  # the linux/arm64 manifest the checks ran on

    def outcome(emulated: bool, facts: dict):
        fields = {"os_packages": osp, "emulated": emulated, "platform": "linux/arm64"}
        expect = type("E", (), {**fields, "native_command": runner.Expectations.native_command})()
        original = checklist.run_probe
        checklist.run_probe = lambda host, name, request: facts
        try:
            checklist.test_os_packages(None, expect, lambda w: None, ImageConfig(image, "", {}, {}, "", ()))
        except pytest.skip.Exception as exc:
            return "skip", str(exc)
        except AssertionError as exc:
            return "FAIL", str(exc)
        finally:
            checklist.run_probe = original
        return "pass", ""

    status, why = outcome(True, failing)
    assert status == "skip" and why.startswith(
        "NOT CHECKED (emulated, linux/arm64 under QEMU): numactl --show exited 1"
    )  # and how to run it natively: this platform's own image, checked on its own machine
    assert why.endswith(f"natively, on a linux/arm64 machine run `build test --platform linux/arm64 --image {image}`")
    assert outcome(False, failing)[0] == "FAIL"
    assert outcome(True, {"checked": 1, "problems": ["numactl: /usr/bin/numactl missing"]})[0] == "FAIL"
    assert outcome(True, {"checked": 1, "problems": []}) == ("pass", "")


def test_prune_doctor_and_the_recorded_image_read_the_index(both, checks, monkeypatch):
    from builder.host import doctor
    from builder.pipeline.targetlock import prune

    engine = FakeEngine()
    out = pipeline.build(both, engine, BuildOptions())
    assert pipeline.recorded_image(both) == out.image  # doctor and compare: the index
    mine = doctor.image_record(both, "arm64")  # the host's platform (hostctx.host_platform), not this machine's
    assert mine is not None and (mine["image"], mine["platform"], mine["checks"]) == (
        out.image,
        "linux/arm64",
        "passed",
    )
    assert mine["record"].endswith("locks/smoke/linux-arm64/image.json")
    kept = {
        json.loads((both.record_dir / p.replace("/", "-") / "image.json").read_text())["build"]["id"] for p in PLATFORMS
    }
    artifacts_dir = both.root / "artifacts" / "smoke"
    for n in range(3):
        (artifacts_dir / f"20000101T00000{n}Z-old{n}").mkdir(parents=True)
    prune(both.root, ["smoke"], keep=0)
    assert {p.name for p in artifacts_dir.iterdir() if not p.name.startswith("test-")} == kept


def test_the_secret_scan_skips_the_layers_of_its_own_platform_s_base(both):
    """A base pinned through its index: the scan skips the layers of the platform being built,
    not the engine's own (an arm64 build skipping amd64's layers would scan the whole arm64 base)."""
    from builder.config.platforms import BaseImage, Bases
    from builder.pipeline import prepush

    engine = FakeEngine()
    name = f"{REGISTRY}/k3/base-index"
    digest = two_platform_base(engine, name)
    for pp, arch in zip(both.platform_plans(), ("amd64", "arm64"), strict=True):
        t = pp.target
        pinned = t.model_copy(update={"bases": Bases(build=t.bases.build, runtime=BaseImage(name=name, digest=digest))})
        assert prepush.base_layers(engine, pinned) == {f"sha256:{arch}"}


def test_a_platform_that_failed_its_checks_leaves_the_index_to_the_next_build(both, checks, monkeypatch):
    """amd64 recorded again, arm64's checks failed: the index record is stale (it names amd64's old
    record), the build fails; the next build publishes the index again instead of refusing."""
    from builder.errors import CheckFailed

    engine = FakeEngine()
    pipeline.build(both, engine, BuildOptions())
    before = (both.record_dir / contract.RECORD_NAME).read_bytes()

    def run(engine, ref, expect, junit):
        checks.failing = "labels" if expect.platform == "linux/arm64" else None
        return checks.run(engine, ref, expect, junit)

    monkeypatch.setattr(runner, "run", run)
    with pytest.raises(CheckFailed):
        pipeline.build(both, engine, BuildOptions(force=True))
    assert (both.record_dir / contract.RECORD_NAME).read_bytes() == before  # the index record untouched
    assert index.set_problems(both.root, index.read(both.record_dir / contract.RECORD_NAME))  # and stale
    again = pipeline.build(both, engine, BuildOptions())
    rec = index.read(both.record_dir / contract.RECORD_NAME)
    assert rec is not None and index.set_problems(both.root, rec) == [] and rec.digest == again.digest


def named_a_second_platform(tmp_path, monkeypatch, repos):
    """A smoke built for amd64 alone (a one-image record), then its matrix naming linux/arm64 too,
    rendered and locked: (the one-image plan, the engine, its build, the two-platform plan)."""
    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "checkout"
    root.mkdir()
    bases = _bases()
    text = smoke.matrix_text(REGISTRY, bases["linux/amd64"], repos, dt.date.today() + dt.timedelta(days=180))
    (root / "matrix.yaml").write_text(text)
    pipeline.render_all(matrix.load(root / "matrix.yaml"), ["smoke"], check=False)
    alone = Plan.of(matrix.load(root / "matrix.yaml"), "smoke")
    _lock_all_one(alone)
    engine = FakeEngine()
    one = pipeline.build(alone, engine, BuildOptions())
    plan = _checkout(root, repos, bases)
    for pp in plan.platform_plans()[1:]:  # the first platform's locks are the one-image target's, where they were
        _lock_all_one(pp)
    return alone, engine, one, plan


def test_a_target_that_names_a_second_platform_replaces_its_one_image_record(
    tmp_path,
    monkeypatch,
    smoke_repos,  # noqa: F811
    checks,
):
    """Built for amd64 alone first (locks/smoke/image.json of one image, its SBOM beside it); then
    the matrix names linux/arm64: the index record replaces the one-image set, no SBOM left over."""
    alone, engine, one, plan = named_a_second_platform(tmp_path, monkeypatch, smoke_repos)
    assert (alone.record_dir / contract.SBOM_NAME).is_file() and not alone.indexed
    out = pipeline.build(plan, engine, BuildOptions())
    assert index.read(plan.record_dir / contract.RECORD_NAME).digest == out.digest
    assert not (plan.record_dir / contract.SBOM_NAME).exists()
    assert one.record == plan.record_dir / contract.RECORD_NAME  # the same file, now the index's


def _lock_all_one(plan: Plan) -> None:
    pinned = source.fetch(plan.target.source)
    _write_lock(plan, pinned, "runtime", RUNTIME)
    _write_lock(plan, pinned, "build", BUILD)


def test_build_test_image_an_index_entry_without_a_digest_is_no_platform_s_manifest(both, checks, monkeypatch):
    """An index from a registry is untrusted: an entry for a platform with no digest (or not a
    sha256 digest), or an entry that is not an object, names no manifest: refused (exit 2) as an
    index not naming that platform, never checked as `<name>@None` nor a crash."""
    engine = FakeEngine()
    out = pipeline.build(both, engine, BuildOptions())
    monkeypatch.setattr(runner, "run", lambda *a: pytest.fail(f"checked {a[1]}"))
    name, amd = out.platforms[0].image.split("@")
    for arm in ({}, {"digest": None}, {"digest": "latest"}, {"digest": ["sha256:" + "a" * 64]}):
        doc = {
            "schemaVersion": 2,
            "manifests": [
                "not an entry",
                {"digest": amd, "platform": {"os": "linux", "architecture": "amd64"}},
                {**arm, "platform": {"os": "linux", "architecture": "arm64"}},
            ],
        }
        raw = json.dumps(doc).encode()
        digest = "sha256:" + hashlib.sha256(raw).hexdigest()
        engine.registry.manifests[(name, digest)] = raw
        with pytest.raises(ConfigError, match=r"not an image index naming linux/arm64 \(target smoke") as info:
            pipeline.test(both, engine, f"{name}@{digest}", "linux/arm64")
        assert info.value.exit_code == 2


def test_build_test_image_an_index_naming_a_platform_twice_is_checked_at_its_first_entry(both, checks, monkeypatch):
    """A pull picks the first entry that matches its platform (containerd and Docker alike): the
    manifest checked as an index's arm64 image is that one, not a later entry for the same platform."""
    engine = FakeEngine()
    out = pipeline.build(both, engine, BuildOptions())
    seen = []

    def run(engine, ref, expect, junit):
        seen.append(ref)
        junit.parent.mkdir(parents=True, exist_ok=True)
        return checks.run(engine, ref, expect, junit)

    monkeypatch.setattr(runner, "run", run)
    monkeypatch.setattr(runner, "host_platform", lambda: "linux/amd64")
    (name, amd), (_, arm) = (o.image.split("@") for o in out.platforms)
    arm64 = {"os": "linux", "architecture": "arm64"}
    doc = {"schemaVersion": 2, "manifests": [{"digest": arm, "platform": arm64}, {"digest": amd, "platform": arm64}]}
    raw = json.dumps(doc).encode()
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    engine.registry.manifests[(name, digest)] = raw
    pipeline.test(both, engine, f"{name}@{digest}", "linux/arm64")
    assert seen == [f"{name}@{arm}"]

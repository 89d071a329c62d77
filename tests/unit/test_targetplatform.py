"""One platform of one target (builder/config/targetplatform.py): the first platform's files in
place, each further one's under its slug, every platform's record set and tag its own. Every
place that reads or writes a platform's files (the plan, `build verify`, the provenance, the
escrow, the renderer) gives the answer this one module gives, on the repository's two-platform
cu129 target, and no other module spells a platform's slug."""

from __future__ import annotations

import re

import pytest

from builder.config import contract, matrix
from builder.config.targetplatform import TargetPlatform, index_manifests
from builder.dockerfile import render
from builder.escrow.inputs import platform_files
from builder.pipeline.plan import Plan
from builder.records import slsa
from builder.records.verify import Verifier
from tests.conftest import REPO
from tests.unit.test_attest import record_of

PLATFORMS = ("linux/amd64", "linux/arm64")


@pytest.fixture(scope="module")
def loaded():
    m = matrix.load(REPO / "matrix.yaml")
    assert m.target("cu129").platform_names() == PLATFORMS
    return m


def test_the_first_platform_s_files_are_in_place_and_every_record_and_tag_is_its_own(loaded):
    t = loaded.target("cu129")
    amd, arm = (TargetPlatform.of(t, p) for p in PLATFORMS)
    assert amd.dockerfile(REPO) == REPO / "dockerfiles/cu129/Dockerfile"
    assert arm.dockerfile(REPO) == REPO / "dockerfiles/cu129/linux-arm64/Dockerfile"
    assert amd.lock_paths(REPO).runtime == REPO / "locks/cu129/requirements.txt"
    assert arm.lock_paths(REPO).os == REPO / "locks/cu129/linux-arm64/os-packages.txt"
    assert amd.record_dir(REPO) == REPO / "locks/cu129/linux-amd64"
    assert arm.record_dir(REPO) == REPO / "locks/cu129/linux-arm64"
    assert (amd.image_tag, arm.image_tag) == (f"{t.image.tag}-linux-amd64", f"{t.image.tag}-linux-arm64")
    assert (amd.cache_id, arm.cache_id) == ("cu129", "cu129-linux-arm64")
    whole = TargetPlatform.of(t, None)
    assert (whole.record_dir(REPO), whole.image_tag) == (REPO / "locks/cu129", t.image.tag)
    # A platform's view of the target (Target.for_platform) is the same platform.
    assert [TargetPlatform.of(t.for_platform(p), p) for p in PLATFORMS] == [amd, arm]


def test_the_plan_verify_the_escrow_and_the_renderer_ask_the_one_rule(loaded):
    t = loaded.target("cu129")
    rendered = [path for path, _ in render.outputs(t, REPO / "matrix.yaml")]
    escrowed = platform_files(REPO, t)
    for i, p in enumerate(PLATFORMS):
        where = TargetPlatform.of(t, p)
        plan, v = Plan.of(loaded, "cu129", p), Verifier(REPO, t, p)
        assert (plan.dockerfile, plan.lock_paths, plan.record_dir, plan.tag) == (
            where.dockerfile(REPO),
            where.lock_paths(REPO),
            where.record_dir(REPO),
            where.image_tag,
        )
        locks = where.lock_paths(REPO)
        assert (v.dockerfile, v.lock, v.build_lock, v.os_lock, v.record_dir, v.tag) == (
            where.dockerfile(REPO),
            locks.runtime,
            locks.build,
            locks.os,
            where.record_dir(REPO),
            where.image_tag,
        )
        assert rendered[i] == where.dockerfile(REPO)
        e = escrowed[i]
        assert (e.platform, e.record_dir, e.locks, e.dockerfile) == (
            p,
            where.record_dir(REPO),
            where.lock_dir(REPO),
            where.dockerfile(REPO),
        )


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_provenance_names_the_platform_s_own_files(loaded, tmp_path, platform):
    """Its lock, build lock, Dockerfile and record: where the platform keeps them, whether or not a
    file is there (a missing file is the offline checks' to refuse, not a reason to name another's)."""
    t = loaded.target("cu129")
    view = t.for_platform(platform)
    record = record_of(view, view.bases, source_date_epoch=0, platform=platform, wheel_records={})
    where = TargetPlatform.of(view, platform)
    deps = {d["name"]: d["uri"] for d in slsa.resolved_dependencies(view, record, tmp_path, {}, {})}
    assert deps["lock"] == where.lock_paths(tmp_path).runtime.resolve().as_uri()
    assert deps["build-lock"] == where.lock_paths(tmp_path).build.resolve().as_uri()
    assert deps["dockerfile"] == where.dockerfile(tmp_path).resolve().as_uri()
    assert deps["wheel-records"] == (where.record_dir(tmp_path) / contract.RECORD_NAME).resolve().as_uri()


def test_an_index_s_manifest_for_each_platform():
    a, b, c = ("sha256:" + x * 64 for x in "abc")
    doc = {
        "manifests": [
            {"digest": a, "platform": {"os": "linux", "architecture": "amd64"}},
            {"digest": b, "platform": {"os": "linux", "architecture": "arm64"}},
            {"digest": c},  # no platform: named as such, never taken for one
        ]
    }
    assert index_manifests(doc) == {"linux/amd64": a, "linux/arm64": b, "None/None": c}
    assert index_manifests({}) == {}
    # Untrusted: an entry that is no object is still named; a digest that is none is None.
    odd = {"manifests": ["x", {"digest": "sha256:a", "platform": {"os": "linux", "architecture": "arm64"}}]}
    assert index_manifests(odd) == {"None/None": None, "linux/arm64": None}


def test_no_module_but_the_contract_spells_a_platform_s_slug():
    """The slug (linux/arm64 -> linux-arm64) is contract.platform_slug; a second spelling is how the
    first-platform rule came to be written in four places."""
    spelled = re.compile(r"""(platform|\bp)\)?\.replace\(\s*["']/["']\s*,\s*["']-["']\s*\)""")
    found = [
        f"{path.relative_to(REPO)}:{n}"
        for path in sorted((REPO / "builder").rglob("*.py"))
        if path.name != "contract.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if spelled.search(line)
    ]
    assert found == []

"""A target built into an image index: --platform builds a subset (the index names the others' last
recorded manifests), and a compile the builder would run under QEMU is refused unless
--allow-emulated, for every target but the smoke (builder/pipeline/context.py)."""

from __future__ import annotations

import fcntl
import os
from collections import Counter

import pytest

from builder.commands.parser import build_parser
from builder.config import contract
from builder.config.options import BuildOptions
from builder.config.platforms import native_platforms
from builder.errors import ConfigError
from builder.pipeline import build as pipeline
from builder.pipeline.context import emulated_refused
from builder.records import index
from tests.unit.fakeengine import FakeEngine
from tests.unit.test_multiplatform import both, checks  # noqa: F401
from tests.unit.test_pipeline_ordering import plan, smoke_repos  # noqa: F401


def test_native_platforms_are_the_engine_s_and_each_node_s_first():
    assert native_platforms("x86_64", [["linux/amd64", "linux/amd64/v2", "linux/arm64"]]) == ("linux/amd64",)
    assert native_platforms("x86_64", [["linux/amd64"], ["linux/arm64", "linux/arm/v7"]]) == (
        "linux/amd64",
        "linux/arm64",
    )
    assert native_platforms("aarch64", []) == ("linux/arm64",)


def test_an_emulated_compile_is_refused_but_for_the_smoke_or_when_allowed():
    with pytest.raises(ConfigError, match=r"cu129 linux/arm64: .*emulated.*docker buildx create --append"):
        emulated_refused("cu129", "linux/arm64", ("linux/amd64",), False)
    emulated_refused("cu129", "linux/arm64", ("linux/amd64",), True)  # --allow-emulated
    emulated_refused("smoke", "linux/arm64", ("linux/amd64",), False)  # minutes, not hours
    emulated_refused("cu129", "linux/arm64", ("linux/amd64", "linux/arm64"), False)  # a native node
    emulated_refused("cu129", None, ("linux/amd64",), False)  # a one-platform target: the builder's own


def test_the_flags_reach_the_build_options():
    from builder.config import cascade

    args = build_parser().parse_args(
        ["build", "--platform", "linux/amd64", "--platform", "linux/arm64", "--allow-emulated"]
    )
    opts = cascade.build_options(vars(args), set())
    assert (opts.platforms, opts.allow_emulated) == (("linux/amd64", "linux/arm64"), True)


def test_platform_builds_a_subset_and_the_index_keeps_the_other_s_recorded_manifest(both, checks):  # noqa: F811
    engine = FakeEngine()
    first = pipeline.build(both, engine, BuildOptions())
    arm = {o.platform: o.digest for o in first.platforms}["linux/arm64"]
    built = len(engine.requests)
    pipeline.build(both, engine, BuildOptions(force=True, platforms=("linux/amd64",)))
    assert [r.platform for r in engine.requests[built:]] == ["linux/amd64"]  # arm64 not built again
    rec = index.read(both.record_dir / contract.RECORD_NAME)
    assert list(rec.platforms) == ["linux/amd64", "linux/arm64"] and rec.manifests()["linux/arm64"] == arm
    with pytest.raises(ConfigError, match="--platform linux/s390x"):
        pipeline.build(both, engine, BuildOptions(platforms=("linux/s390x",)))


def test_each_platform_s_dockerfile_has_its_own_cache_mounts(both):  # noqa: F811
    """BuildKit cache mounts are keyed by id alone: an arm64 apt/pip/sccache cache must not be amd64's."""
    import re

    ids = {}
    for pp in both.platform_plans():
        ids[str(pp.platform)] = set(re.findall(r"--mount=type=cache,id=([^,]+),", pp.dockerfile.read_text()))
    assert ids["linux/amd64"] and ids["linux/arm64"] and not ids["linux/amd64"] & ids["linux/arm64"]
    assert all(i.endswith("-smoke-linux-arm64") for i in ids["linux/arm64"])


@pytest.mark.parametrize("allow_emulated", [False, True])
def test_each_platform_s_offline_checks_run_once_per_build(both, checks, monkeypatch, allow_emulated):  # noqa: F811
    """The emulation refusal reads every chosen platform's Dockerfile and locks before the engine is
    asked (issue 53: each platform's build then read them a second time); its build uses that read."""
    from builder.dockerfile import render

    read: Counter = Counter()
    real = render.check_committed

    def counted(target, path):
        read[path] += 1
        return real(target, path)

    monkeypatch.setattr(render, "check_committed", counted)
    engine, once = FakeEngine(), Counter({pp.dockerfile: 1 for pp in both.platform_plans()})
    pipeline.build(both, engine, BuildOptions(allow_emulated=allow_emulated))
    assert read == once and len(engine.requests) == 2
    read.clear()
    assert pipeline.build(both, engine, BuildOptions(allow_emulated=allow_emulated)).up_to_date
    assert read == once


def test_build_platform_is_read_before_the_engine_is_asked(monkeypatch, capsys):
    """`build --platform` with a value no target can name: exit 2 with a "did you mean", read with the
    options (platforms.flag, as `build test` reads its own), before any engine or target lock."""
    from builder.cli import main
    from builder.commands import build as command
    from tests.conftest import REPO

    def asked():
        raise AssertionError("the engine was asked for")

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(command, "docker_engine", asked)
    with pytest.raises(SystemExit) as info:
        main(["build", "--target", "cu129", "--platform", "linux/arm46"])
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert "--platform linux/arm46: no target is built for it" in err and "did you mean 'linux/arm64'?" in err


def test_a_platform_the_target_does_not_name_is_refused_before_its_lock(plan):  # noqa: F811
    """A held target lock (another build running) is not what --platform on a one-image target hears."""
    fd = os.open(plan.lock_paths.runtime.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ConfigError, match=r"--platform linux/amd64: target smoke names no platforms") as e:
            pipeline.build(plan, FakeEngine(), BuildOptions(platforms=("linux/amd64",)))
        assert e.value.exit_code == 2
    finally:
        os.close(fd)

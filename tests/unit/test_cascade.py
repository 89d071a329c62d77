"""The options cascade: flags > environment > target > defaults: > built-in, stated once in
builder/config/cascade.py, and where each value came from."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.cli import _parser
from builder.config import cascade, matrix
from builder.errors import ConfigError
from tests.conftest import REPO

SRC = (REPO / "matrix.yaml").read_text()


def _flags(*argv: str) -> dict:
    return vars(_parser().parse_args(["build", "--target", "cu129", *argv]))


def test_the_order_is_stated_once():
    assert cascade.ORDER == ("flags", "environment", "target", "defaults", "built-in")
    assert cascade.__doc__ and "flags > environment > target > defaults: > built-in" in cascade.__doc__


def test_the_compile_cache_flag_wins_over_its_variable_and_says_where_it_came_from():
    env = {"K3_COMPILE_CACHE": "redis://env:6379"}
    assert cascade.flag_or_env("--compile-cache", "redis://flag:1", env) == cascade.Setting(
        "redis://flag:1", "flags", "--compile-cache"
    )
    assert cascade.flag_or_env("--compile-cache", None, env) == cascade.Setting(
        "redis://env:6379", "environment", "$K3_COMPILE_CACHE"
    )
    assert cascade.flag_or_env("--compile-cache", None, {"K3_COMPILE_CACHE": ""}).layer == "built-in"
    assert cascade.flag_or_env("--no-cache", False, env) == cascade.Setting(None, "built-in")


def test_build_options_from_the_command_line_and_the_environment():
    options = cascade.build_options(_flags(), set(), {})
    assert (options.compile_cache, options.compile_cache_from_env, options.run_checks) == (None, False, True)
    options = cascade.build_options(_flags("--no-checks", "--jobs", "2"), set(), {"K3_COMPILE_CACHE": "gha://"})
    assert (options.compile_cache, options.compile_cache_from_env) == ("gha://", True)
    assert (options.run_checks, options.jobs) == (False, 2)
    flagged = cascade.build_options(_flags("--compile-cache", "s3://b"), set(), {"K3_COMPILE_CACHE": "gha://"})
    assert (flagged.compile_cache, flagged.compile_cache_from_env) == ("s3://b", False)
    with pytest.raises(ConfigError, match="--max-jobs: must be between 1 and 512"):
        cascade.build_options(_flags("--max-jobs", "0"), set(), {})


def test_a_target_entry_is_defaults_then_the_target_then_the_environment():
    defaults = {"owner": "a@example.org", "image": {"registry": "d.example", "tag": "d"}}
    entry = {"owner": "b@example.org", "image": {"tag": "t"}}
    overrides = cascade.environment_overrides({"K3_TAG": "e", "K3_REPOSITORY": ""})
    assert overrides == {"image": {"tag": "e"}}
    assert cascade.target_entry("x", entry, defaults, overrides) == {
        "name": "x",
        "owner": "b@example.org",
        "image": {"registry": "d.example", "tag": "e"},
    }
    assert cascade.target_entry("x", "not a mapping", defaults, overrides) == "not a mapping"
    assert cascade.env_source(("image", "tag", "x"), {"K3_TAG": "e"}) == "K3_TAG"
    assert cascade.env_source(("image", "tag"), {}) is None
    assert cascade.from_defaults(("image", "registry"), {"owner": "x"}, defaults)
    assert not cascade.from_defaults(("image", "registry"), entry, defaults)


def test_the_layers_meet_in_the_parsed_matrix(monkeypatch):
    monkeypatch.setenv("K3_TAG", "from-env")
    text = SRC.replace("defaults:\n", "defaults:\n  vendor: From defaults\n", 1)
    t = matrix.parse(text, Path("matrix.yaml")).target("cu129")
    # environment, defaults:, built-in
    assert (t.image.tag, t.vendor, t.cuda.compat_dir) == ("from-env", "From defaults", "/usr/local/cuda/compat")


def _cu129(**compile_keys) -> matrix.Target:
    t = matrix.parse(SRC, Path("matrix.yaml")).target("cu129")
    return t.model_copy(update={"compile": t.compile.model_copy(update=compile_keys)})


def test_max_jobs_is_the_flag_then_the_target_then_derived():
    t = _cu129(max_jobs=12)
    assert cascade.max_jobs(4, t) == cascade.Setting(4, "flags", "--max-jobs")
    assert cascade.max_jobs(None, t) == cascade.Setting(12, "target", "compile.max_jobs")
    assert cascade.max_jobs(None, _cu129(max_jobs=None)) == cascade.Setting(None, "built-in")


def test_the_compile_cache_is_the_flag_or_its_variable_then_the_target():
    t = _cu129(cache_url="redis://matrix:6379")
    flag = cascade.build_options(_flags("--compile-cache", "redis://flag:1"), set(), environ={})
    env = cascade.build_options(_flags(), set(), environ={"K3_COMPILE_CACHE": "redis://env:2"})
    none = cascade.build_options(_flags(), set(), environ={})
    assert cascade.compile_cache(flag, t) == cascade.Setting("redis://flag:1", "flags", "--compile-cache")
    assert cascade.compile_cache(env, t) == cascade.Setting("redis://env:2", "environment", "$K3_COMPILE_CACHE")
    assert cascade.compile_cache(none, t) == cascade.Setting("redis://matrix:6379", "target", "compile.cache_url")
    assert cascade.compile_cache(none, _cu129(cache_url=None)).value is None


def test_the_attestation_identities_are_the_environment_then_the_target():
    env = {"K3_BUILDER_ID": "https://ci.example/runner"}
    got = cascade.environment_or_target("K3_BUILDER_ID", "https://matrix.example/b", env)
    assert got == cascade.Setting("https://ci.example/runner", "environment", "$K3_BUILDER_ID")
    assert cascade.environment_or_target("K3_BUILDER_ID", "https://matrix.example/b", {"K3_BUILDER_ID": ""}).layer == (
        "target"
    )
    assert cascade.environment_or_target("K3_BUILDER_ID", None, {}) == cascade.Setting(None, "built-in")

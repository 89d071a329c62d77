"""The compile cache's URL parsing, secret file and statistics (builder/dockerfile/compilecache.py)."""

from __future__ import annotations

import json
import stat
import subprocess
import urllib.parse

import pytest

from builder import log
from builder.config import contract
from builder.dockerfile import compilecache
from builder.errors import ConfigError


@pytest.fixture(autouse=True)
def _no_ambient_credentials(monkeypatch):
    for name in compilecache._PASSTHROUGH:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://10.0.0.5:6379/2", {"SCCACHE_REDIS_ENDPOINT": "redis://10.0.0.5:6379", "SCCACHE_REDIS_DB": "2"}),
        (
            "rediss://u:p%40ss@cache.internal",
            {
                "SCCACHE_REDIS_ENDPOINT": "rediss://cache.internal:6379",
                "SCCACHE_REDIS_USERNAME": "u",
                "SCCACHE_REDIS_PASSWORD": "p@ss",
            },
        ),
        (
            "s3://k3-cache/vllm?region=eu-west-1",
            {"SCCACHE_BUCKET": "k3-cache", "SCCACHE_S3_KEY_PREFIX": "vllm", "SCCACHE_REGION": "eu-west-1"},
        ),
        (
            "gcs://bucket/pre",
            {"SCCACHE_GCS_BUCKET": "bucket", "SCCACHE_GCS_KEY_PREFIX": "pre", "SCCACHE_GCS_RW_MODE": "READ_WRITE"},
        ),
        ("webdavs://cache.example/k3", {"SCCACHE_WEBDAV_ENDPOINT": "https://cache.example/k3"}),
        ("gha://", {"SCCACHE_GHA_ENABLED": "on", "SCCACHE_GHA_VERSION": "k3"}),
    ],
)
def test_each_backend_maps_to_sccache_environment(url, expected):
    assert compilecache.env_lines(url) == expected


def test_backend_credentials_are_carried_from_the_environment(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    assert compilecache.env_lines("s3://b/p")["AWS_ACCESS_KEY_ID"] == "AKIAEXAMPLE"


@pytest.mark.parametrize("url", ["http://cache:80", "cache:6379", "", "file:///tmp/cache"])
def test_unknown_scheme_is_a_config_error(url):
    with pytest.raises(ConfigError, match="--compile-cache") as err:
        compilecache.env_lines(url)
    assert err.value.exit_code == 2


@pytest.mark.parametrize(
    "url", ["redis://h:1/0\nX=1", "redis://:pw\x1b@h:1", "redis://h:99999", "redis:///0", "redis://h:1/db0"]
)
def test_malformed_or_line_breaking_urls_are_config_errors(url):
    with pytest.raises(ConfigError, match="--compile-cache"):
        compilecache.env_lines(url)


def test_the_secret_file_sources_to_exactly_the_values(tmp_path):
    """Passwords with shell characters reach sccache unchanged and run nothing when sourced."""
    password = 'p\'$(touch pwned)`id`;\\ "x"&|<>*'
    url = "redis://k3:" + urllib.parse.quote(password, safe="") + "@cache.internal:6380/1"
    compilecache.secret(url, tmp_path)
    script = f"set -a; . {tmp_path / contract.COMPILE_CACHE_SECRET}; set +a; printf '%s' \"$SCCACHE_REDIS_PASSWORD\""
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, cwd=tmp_path, check=True).stdout
    assert out == password and not (tmp_path / "pwned").exists()


def test_secret_file_is_private_and_its_values_are_redacted(tmp_path):
    url = "redis://user:hunter2pass@cache.internal:6379/0"
    spec = compilecache.secret(url, tmp_path)
    path = tmp_path / contract.COMPILE_CACHE_SECRET
    assert spec == f"id={contract.COMPILE_CACHE_SECRET},src={path}"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == (
        "SCCACHE_REDIS_DB=0\nSCCACHE_REDIS_ENDPOINT=redis://cache.internal:6379\n"
        "SCCACHE_REDIS_PASSWORD=hunter2pass\nSCCACHE_REDIS_USERNAME=user\n"
    )
    assert "hunter2pass" not in log.redact(f"endpoint {url} password hunter2pass")


def test_describe_drops_credentials_and_path():
    assert compilecache.describe("redis://user:pw@cache.internal:6379/3") == "redis://cache.internal"
    assert compilecache.describe("s3://bucket/prefix?region=x") == "s3://bucket"


def _sccache_json(hits: int, misses: int, requests: int) -> str:
    return json.dumps(
        {
            "stats": {
                "compile_requests": requests,
                "cache_hits": {"counts": {"C/C++": hits}},
                "cache_misses": {"counts": {"C/C++": misses, "CUDA": 0}},
            }
        }
    )


def test_stats_reads_the_last_marker_line():
    text = "\n".join(
        [
            "#12 1.0 building",
            f"#12 2.0 {contract.STATS_MARKER}{_sccache_json(0, 9, 9)}",
            f"#12 9.0 {contract.STATS_MARKER}{_sccache_json(7, 2, 9)}",
        ]
    )
    got = compilecache.stats(text)
    assert (got.requests, got.hits, got.misses) == (9, 7, 2)
    assert got.hit_rate == pytest.approx(7 / 9)
    assert got.line() == "compile cache: 7 hits, 2 misses, hit rate 0.78"


@pytest.mark.parametrize("text", ["", "no marker here", f"{contract.STATS_MARKER}{{not json"])
def test_stats_absent_or_garbled_is_none(text):
    assert compilecache.stats(text) is None


def test_no_compilations_has_no_hit_rate():
    got = compilecache.stats(contract.STATS_MARKER + _sccache_json(0, 0, 0))
    assert got.hit_rate is None and got.line().endswith("hit rate -")


def test_the_fallback_is_read_from_output_lines_not_the_echoed_command():
    command = f'#13 [build 3/9] RUN cd /src && echo "{contract.FALLBACK_MARKER}: compiling with the local cache only"'
    stats_line = f"#13 20.0 {contract.STATS_MARKER}{_sccache_json(0, 3, 3)}"
    assert not compilecache.stats(command + "\n" + stats_line).backend_unreachable
    said = f"#13 10.2 {contract.FALLBACK_MARKER}: compiling with the local cache only"
    got = compilecache.stats("\n".join([command, said, stats_line]))
    assert got.backend_unreachable and got.line().endswith("(backend unreachable: local cache only)")


def _target(tmp_path, **compile_keys):
    import yaml

    from builder.config import matrix
    from tests.conftest import REPO

    doc = yaml.safe_load((REPO / "matrix.yaml").read_text())
    doc["targets"]["cu129"]["compile"].update(compile_keys)
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(doc))
    return matrix.load(tmp_path / "matrix.yaml").target("cu129")


def test_which_backend_a_build_uses(tmp_path):
    from builder.config.options import BuildOptions
    from builder.pipeline.context import _cache_secret

    offline = _target(tmp_path, remote_cache=False)
    assert _cache_secret(offline, BuildOptions(), tmp_path) == ()
    # A CI-wide $K3_COMPILE_CACHE does not give network to a target that compiles without it...
    assert (
        _cache_secret(offline, BuildOptions(compile_cache="redis://c:1", compile_cache_from_env=True), tmp_path) == ()
    )
    # ...but asking for it on the command line is a contradiction, reported.
    with pytest.raises(ConfigError, match=r"targets\.cu129\.compile\.remote_cache") as err:
        _cache_secret(offline, BuildOptions(compile_cache="redis://c:1"), tmp_path)
    assert err.value.exit_code == 2
    secret = tmp_path / contract.COMPILE_CACHE_SECRET
    from_matrix = _target(tmp_path, remote_cache=False, cache_url="s3://k3-cache/vllm?region=eu-west-1")
    assert _cache_secret(from_matrix, BuildOptions(), tmp_path) == (f"id={contract.COMPILE_CACHE_SECRET},src={secret}",)
    assert "SCCACHE_BUCKET=k3-cache" in secret.read_text()
    _cache_secret(from_matrix, BuildOptions(compile_cache="redis://flag-wins:6379"), tmp_path)
    assert "SCCACHE_REDIS_ENDPOINT=redis://flag-wins:6379" in secret.read_text()


def test_the_shell_quoted_password_the_secret_file_holds_is_redacted_too(tmp_path, monkeypatch):
    """A compile step that shows its secret file printed `SCCACHE_REDIS_PASSWORD='ATKPASS'"'"'q9x7Z'`:
    only the raw value was registered (issue 21)."""
    monkeypatch.setattr(log, "_secrets", set())
    compilecache.secret("redis://u:" + urllib.parse.quote("ATKPASS'q9x7Z", safe="") + "@cache.internal/0", tmp_path)
    written = (tmp_path / contract.COMPILE_CACHE_SECRET).read_text()
    assert "ATKPASS" in written  # the file itself holds it, quoted
    shown = log.redact(written)
    assert "ATKPASS" not in shown and "q9x7Z" not in shown
    traced = subprocess.run(
        ["bash", "-xc", f"set -a; . {tmp_path / contract.COMPILE_CACHE_SECRET}"], capture_output=True, text=True
    ).stderr  # how a shell tracing it prints it
    assert "q9x7Z" in traced and "q9x7Z" not in log.redact(traced)

"""The rebuild from the escrow reads nothing but the escrow: a sealed cache refuses every download
(builder/fsutil.py ``cache_scope``), and a bundle is held to the pinned commit and fsck-checked
before its tree is used (builder/source/bundles.py). No registry, no network."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from builder.deps import buildcontext
from builder.deps.oslock import DebEntry
from builder.errors import LockError, SourceError, Unreachable
from builder.fsutil import cache_dir, cache_scope
from builder.source import bundles
from tests.unit.test_source import _src, _tp, third, upstream  # noqa: F401 (fixtures)

GIT = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}


def _deb() -> DebEntry:
    # Nothing listens on port 9 (discard): a download of it fails there.
    return DebEntry("k3-none", "1", "amd64", "http://127.0.0.1:9/k3-none_1_amd64.deb", 10, "0" * 64)


def test_a_sealed_cache_refuses_a_download_an_open_one_tries_it(tmp_path):
    entry = _deb()
    with cache_scope(tmp_path / "run", sealed=True):
        assert cache_dir() == tmp_path / "run"
        with pytest.raises(LockError, match="downloads nothing"):
            buildcontext.fetch_deb(entry)
    with cache_scope(tmp_path / "open"), pytest.raises(Unreachable):
        buildcontext.fetch_deb(entry)  # the same entry, unsealed: the download is attempted (and fails here)
    assert cache_dir() != tmp_path / "run"


def _repo(tmp_path: Path) -> tuple[str, str, Path]:
    src = tmp_path / "src"
    subprocess.run(["git", "init", "-q", "-b", "main", str(src)], check=True, env=GIT)
    (src / "a.txt").write_text("a\n")
    for args in (["add", "a.txt"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a"]):
        subprocess.run(["git", "-C", str(src), *args], check=True, env=GIT)
    commit = subprocess.run(
        ["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    bundle = tmp_path / "src.bundle"
    subprocess.run(["git", "-C", str(src), "branch", "pinned"], check=True, env=GIT)
    subprocess.run(["git", "-C", str(src), "bundle", "create", "-q", str(bundle), "refs/heads/pinned"], check=True)
    return f"file://{src}", commit, bundle


def test_a_bundle_is_unbundled_into_the_runs_own_mirror_held_to_its_commit(tmp_path):
    url, commit, bundle = _repo(tmp_path)
    with cache_scope(tmp_path / "run", sealed=True):
        with pytest.raises(SourceError, match=f"the record pins {'1' * 12}"):
            bundles.unbundle(url, "1" * 40, bundle, shallow=False)
        bundles.unbundle(url, commit, bundle, shallow=False)
        mirrors = list((tmp_path / "run" / "git").iterdir())
    assert len(mirrors) == 1  # in the run's cache, nowhere else
    bundle.write_bytes(b"# v2 git bundle\n" + b"0" * 40 + b" refs/heads/pinned\n\nnot a pack")
    with cache_scope(tmp_path / "run2", sealed=True), pytest.raises(SourceError, match="untrusted input"):
        bundles.unbundle(url, commit, bundle, shallow=False)


def test_each_platforms_wheel_is_the_one_its_own_lock_installed(tmp_path, monkeypatch):
    """A lock entry names every platform's wheel by sha256; the escrow keeps, for each platform's
    lock, the file that platform's wheelhouse holds (not the first hash cached anywhere)."""
    from types import SimpleNamespace

    from builder.escrow import collect
    from builder.escrow.inputs import PlatformFiles, WheelInput
    from builder.fsutil import sha256_file

    amd, arm = tmp_path / "locks" / "t", tmp_path / "locks" / "t" / "linux-arm64"
    houses = {}
    for where, data in ((amd, b"x86_64 wheel"), (arm, b"aarch64 wheel")):
        where.mkdir(parents=True, exist_ok=True)
        (where / "build-requirements.txt").write_text("# lock\n")
        houses[where / "build-requirements.txt"] = tmp_path / f"house-{where.name}"
        houses[where / "build-requirements.txt"].mkdir()
        (houses[where / "build-requirements.txt"] / f"cmake-{where.name}.whl").write_bytes(data)
    files = [
        PlatformFiles(p, tmp_path, w, tmp_path / "Dockerfile") for p, w in (("linux/amd64", amd), ("linux/arm64", arm))
    ]
    monkeypatch.setattr(collect, "platform_files", lambda root, target: files)
    monkeypatch.setattr(collect.buildcontext, "wheelhouse", lambda target, lock: houses[lock])
    target = SimpleNamespace(for_platform=lambda platform: None)
    wheels = collect._wheel_files(tmp_path, target)
    hashes = tuple(sorted(sha256_file(next(h.iterdir())) for h in houses.values()))
    for where, data in ((amd, b"x86_64 wheel"), (arm, b"aarch64 wheel")):
        item = WheelInput(f"{where.relative_to(tmp_path)}/build-requirements.txt", "cmake", "4.4.5", hashes)
        assert collect._local(tmp_path, target, item, wheels, tmp_path).path.read_bytes() == data


def test_an_escrowed_third_party_tag_is_not_asked_of_its_host(third, upstream):  # noqa: F811
    """cu129 pins some third-party trees by tag: the normal path asks the host where the tag is now
    (ls-remote), a rebuild from the escrow (``live=False``) asks nothing: the host may be gone."""
    import shutil

    from builder.source import pinned as source

    lib, _ = third
    pinned = source.fetch(_src(upstream))
    spec = _tp(lib, ref="v1.0")
    source.fetch_third_party("lib", spec, pinned)  # the mirror now holds the pinned commit
    shutil.rmtree(lib.working_dir)  # the host is gone
    with pytest.raises((SourceError, Unreachable), match="cannot resolve 'v1.0'"):
        source.fetch_third_party("lib", spec, pinned)
    assert source.fetch_third_party("lib", spec, pinned, live=False).commit == spec.commit

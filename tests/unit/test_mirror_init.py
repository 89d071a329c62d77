"""A git mirror appears in the shared cache whole or not at all (builder/source/newmirror.py,
``newmirror.init_mirror``): two builds sharing an empty cache, one made it in place and the other opened the
directory before its HEAD existed (InvalidGitRepositoryError, seen in the suite on 2026-12-07)."""

from __future__ import annotations

import git

from builder.source import newmirror, pinned


def test_a_mirror_is_never_initialised_in_place(tmp_path, monkeypatch):
    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path / "cache"))
    url = "file:///nowhere/upstream.git"
    final = pinned._mirror_path(url)
    inits = []
    real = git.Repo.init

    def init(path, *args, **kwargs):
        inits.append((str(path), final.exists()))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(git.Repo, "init", init)
    repo = pinned._mirror(url)
    assert [p for p, _ in inits] and all(p != str(final) for p, _ in inits), inits  # made beside it
    assert repo.bare and (final / "HEAD").exists()
    assert [p.name for p in final.parent.iterdir()] == [final.name]  # nothing left beside it


def test_a_mirror_another_build_finished_first_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path / "cache"))
    url = "file:///nowhere/upstream.git"
    final = pinned._mirror_path(url)
    theirs = pinned._mirror(url)
    (final / "theirs").write_text("1")
    newmirror.init_mirror(final)  # lost the race: the rename fails, theirs stays
    assert (final / "theirs").exists() and pinned._mirror(url).git_dir == theirs.git_dir
    assert [p.name for p in final.parent.iterdir()] == [final.name]

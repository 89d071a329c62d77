"""The escrow's git bundles (builder/escrow/collect.py ``bundle``) on a real repository: a shallow
mirror (a third-party tree fetched by id at depth 1) still bundles its pinned commit, and says so."""

from __future__ import annotations

import subprocess

from builder.escrow.collect import bundle, is_shallow
from builder.escrow.inputs import SourceInput


def test_a_shallow_mirror_bundles_its_pinned_commit_and_says_so(tmp_path, monkeypatch):
    """A third-party tree fetched by id (depth 1) leaves a shallow mirror: its bundle holds the
    commit and its tree, is marked shallow, and unbundles where the commit is marked shallow."""
    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path / "cache"))
    up = tmp_path / "up"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-C", str(up)]
    subprocess.run(["git", "init", "--quiet", str(up)], check=True)
    subprocess.run([*git, "commit", "--quiet", "--allow-empty", "-m", "one"], check=True)
    (up / "a").write_text("a\n")
    subprocess.run([*git, "add", "a"], check=True)
    subprocess.run([*git, "commit", "--quiet", "-m", "two"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    made = bundle(SourceInput("third_party/x", f"file://{up}", head), tmp_path)
    assert is_shallow(made)
    into = tmp_path / "into"
    subprocess.run(["git", "init", "--quiet", "--bare", str(into)], check=True)
    (into / "shallow").write_text(head + "\n")
    subprocess.run(
        ["git", "-C", str(into), "fetch", "--quiet", str(made), "refs/heads/pinned:refs/heads/pinned"], check=True
    )
    shown = subprocess.run(["git", "-C", str(into), "show", "pinned:a"], capture_output=True, text=True, check=True)
    assert shown.stdout == "a\n"

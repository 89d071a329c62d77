"""docs/auditor.md's hand rebuild, verbatim, up to its build, on the two-platform smoke's escrow
(tests/unit/test_escrow.py's ``escrowed``: a real escrow on the local registry, stand-in bases that
no engine could build from). ``docker`` on PATH is a script that writes its arguments and stops
there: what is tested is what the block hands to buildx, and what it refuses before. The build itself
runs in tests/integration/test_escrow.py.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

from builder.escrow.run import escrow_target
from tests.conftest import REPO
from tests.unit.test_escrow import LOCAL, escrowed, pytestmark  # noqa: F401
from tests.unit.test_pipeline_ordering import smoke_repos  # noqa: F401

BLOCK = (REPO / "docs" / "auditor.md").read_text().split("<!-- hand-rebuild:begin -->", 1)[1]
SCRIPT = BLOCK.split("<!-- hand-rebuild:end -->", 1)[0].split("```bash\n", 1)[1].rsplit("```", 1)[0]


def _run(root: Path, work: Path, platform: str) -> subprocess.CompletedProcess:
    shim = work.parent / "bin"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "docker").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$W/docker-args"\nexit 7\n')
    (shim / "docker").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("E", "TOKEN", "BUILDER", "CACHE")}
    env |= {"T": "smoke", "P": platform, "SCHEME": "http", "TO": f"{LOCAL}/unused:hand", "W": str(work)}
    env |= {"TEMPLATES": str(REPO / "builder" / "dockerfile" / "templates"), "PATH": f"{shim}:{env['PATH']}"}
    return subprocess.run(["bash", "-c", SCRIPT], cwd=root, env=env, capture_output=True, text=True)


def _edit_escrow(root: Path, key_prefix: str, **changes: str) -> str:
    """The checkout's escrow manifest with one entry changed (its signature no longer holds: the block
    does not check it, so its own links must). Returns the entry's key."""
    path = root / "locks" / "smoke" / "escrow.json"
    envelope = json.loads(path.read_text())
    doc = json.loads(base64.b64decode(envelope["payload"]))
    key = sorted(k for k in doc["predicate"]["inputs"] if k.startswith(key_prefix))[0]
    doc["predicate"]["inputs"][key] |= changes
    envelope["payload"] = base64.b64encode(json.dumps(doc).encode()).decode()
    path.write_text(json.dumps(envelope))
    return key


def test_each_platform_of_an_index_reaches_the_build_and_what_the_manifest_cannot_vouch_for_stops_it(
    escrowed,  # noqa: F811
    tmp_path,
):
    """One escrow (the fixture builds a smoke), three runs: each platform reaches the build with its
    own files; a title that is a path, and a bundle of another commit of the same tree and time (only
    the commit check can tell), each stop it before anything is written outside or built."""
    loaded, dest, made = escrowed
    root = loaded.path.parent
    escrow = escrow_target(loaded, "smoke", dest)
    for platform, dockerfile in (
        ("linux/amd64", "dockerfiles/smoke/Dockerfile"),
        ("linux/arm64", "dockerfiles/smoke/linux-arm64/Dockerfile"),
    ):
        work = tmp_path / platform.replace("/", "-")
        run = _run(root, work, platform)
        assert run.returncode == 7, run.stderr[-2000:]  # the shim's: every link before the build held
        args = (work / "docker-args").read_text().splitlines()
        assert args[args.index("-f") + 1] == dockerfile and args[args.index("--platform") + 1] == platform
        lock = root / "locks" / "smoke" / ("" if platform == "linux/amd64" else "linux-arm64") / "requirements.txt"
        (context,) = work.glob("context-*")  # named for the platform's recorded digest (BuildKit's synced copies)
        assert args[-1] == str(context) and len(context.name) == len("context-") + 32
        assert (context / "requirements.txt").read_bytes() == lock.read_bytes()
    signed = (root / "locks" / "smoke" / "escrow.json").read_text()
    key = _edit_escrow(root, "wheel ", title="../../../../escaped.whl")
    run = _run(root, tmp_path / "title" / "work", "linux/amd64")
    assert run.returncode == 1 and f"{key}: its title ../../../../escaped.whl is not a plain file name" in run.stderr
    assert not list(tmp_path.rglob("escaped.whl")) and not (tmp_path / "title" / "work" / "docker-args").exists()
    (root / "locks" / "smoke" / "escrow.json").write_text(signed)
    key, other = _other_commit_escrowed(escrow.manifest.entries, made, dest, tmp_path)
    _edit_escrow(root, key, digest=other[1])
    run = _run(root, tmp_path / "commit" / "work", "linux/amd64")
    assert run.returncode == 1, run.stderr[-2000:]
    assert f"{key}: the bundle's refs/heads/pinned is {other[0]}, not {key.rsplit('@', 1)[1]}" in run.stderr
    assert not (tmp_path / "commit" / "work" / "docker-args").exists()


def _other_commit_escrowed(entries, made, dest: str, tmp_path: Path) -> tuple[str, tuple[str, str]]:
    """The source's key, and (commit, blob digest) of a bundle, pushed to ``dest``, whose
    refs/heads/pinned is another commit of the source's tree at the same time."""
    key = next(k for k in entries if k.startswith("source source@"))
    commit = key.rsplit("@", 1)[1]
    repo = tmp_path / "other"
    git = ["git", "-C", str(repo)]
    subprocess.run(["git", "clone", "-q", "--bare", entries[key].pin["url"], str(repo)], check=True)
    when = subprocess.run([*git, "show", "-s", "--format=%ct", commit], capture_output=True, text=True).stdout.strip()
    who = {f"GIT_{r}_{f}": v for r in ("AUTHOR", "COMMITTER") for f, v in (("NAME", "x"), ("EMAIL", "x@x"))}
    stamp = {"GIT_COMMITTER_DATE": f"@{when} +0000", "GIT_AUTHOR_DATE": f"@{when} +0000", **who}
    made_commit = subprocess.run(
        [*git, "commit-tree", f"{commit}^{{tree}}", "-m", "not the pinned commit"],
        env={**os.environ, **stamp},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    subprocess.run([*git, "update-ref", "refs/heads/pinned", made_commit], check=True)
    subprocess.run([*git, "bundle", "create", "-q", str(tmp_path / "other.bundle"), "refs/heads/pinned"], check=True)
    digest = made.copier.push_bytes(dest, (tmp_path / "other.bundle").read_bytes())
    made.blobs.append((dest, digest))
    return key, (made_commit, digest)

"""The pinned source: fetched with GitPython into a local mirror, verified, exported.

The build never sees a live checkout: it gets ``git archive`` of the pinned commit, extracted
with every mtime set to the commit's time (which is also SOURCE_DATE_EPOCH), so the context is
a pure function of the commit.
"""

from __future__ import annotations

import hashlib
import io
import posixpath
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

import git

from builder.errors import SourceError
from builder.fsutil import cache_dir, clamp_mtimes
from builder.matrix import Source


@dataclass(frozen=True)
class PinnedSource:
    """A verified commit in the local mirror."""

    repo: git.Repo
    commit: str
    branch_head: str
    source_date_epoch: int
    subject: str

    def read(self, path: str) -> bytes | None:
        """A file's bytes at the pinned commit, or None when it does not exist there."""
        try:
            blob = self.repo.commit(self.commit).tree / path
        except KeyError:
            return None
        if blob.type != "blob":
            return None
        return blob.data_stream.read()

    def export(self, dest: Path) -> Path:
        """Extract ``git archive <commit>`` into dest (replaced), mtimes fixed to the commit time."""
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        data = self.repo.git.archive("--format=tar", self.commit, stdout_as_string=False)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(dest, filter="data")
        clamp_mtimes(dest, self.source_date_epoch)
        return dest


# Only these transports, ever (ext:: and friends run commands); never prompt for credentials.
GIT_ENV = {"GIT_ALLOW_PROTOCOL": "https:file", "GIT_TERMINAL_PROMPT": "0"}


def git_reason(exc: git.GitCommandError) -> str:
    detail = [ln.strip().removeprefix("stderr: ").strip("'") for ln in (exc.stderr or "").strip().splitlines()]
    detail = [ln for ln in detail if ln]
    return detail[-1] if detail else f"git exited {exc.status}"


def _mirror_path(url: str) -> Path:
    return cache_dir() / "git" / (hashlib.sha256(url.encode()).hexdigest()[:24] + ".git")


def fetch(source: Source) -> PinnedSource:
    """Fetch ``refs/heads/<branch>`` into the mirror; verify the pinned commit is on it."""
    mirror = _mirror_path(source.url)
    repo = git.Repo(mirror) if mirror.exists() else git.Repo.init(mirror, bare=True, mkdir=True)
    ref = f"refs/heads/{source.branch}"
    local = f"refs/k3/{source.branch}"
    try:
        # Full ref names only: a tag or another ref of the same short name is never picked.
        with repo.git.custom_environment(**GIT_ENV):
            repo.git.fetch("--no-tags", "--force", source.url, f"+{ref}:{local}")
    except git.GitCommandError as exc:
        reason = git_reason(exc)
        if "couldn't find remote ref" in (exc.stderr or ""):
            raise SourceError(
                f"source {source.url}: branch {source.branch!r} not found ({ref}); check source.branch in the matrix"
            ) from None
        raise SourceError(
            f"source {source.url}: cannot fetch {ref}: {reason} (is the source's host reachable from here?)"
        ) from None
    head = repo.git.rev_parse(f"{local}^{{commit}}")
    try:
        repo.git.cat_file("-e", f"{source.commit}^{{commit}}")
    except git.GitCommandError:
        raise SourceError(
            f"source {source.url}: pinned commit {source.commit} does not exist on {ref} (head {head}); "
            "was the branch force-pushed? re-pin source.commit"
        ) from None
    if head != source.commit and not repo.is_ancestor(source.commit, head):
        raise SourceError(
            f"source {source.url}: pinned commit {source.commit} is not on {ref} (head {head}); re-pin source.commit"
        )
    commit = repo.commit(source.commit)
    return PinnedSource(
        repo=repo,
        commit=source.commit,
        branch_head=head,
        source_date_epoch=int(commit.committed_date),
        subject=commit.summary if isinstance(commit.summary, str) else commit.summary.decode(),
    )


def resolve_includes(pinned: PinnedSource, paths: tuple[str, ...]) -> dict[str, bytes]:
    """The named requirement files plus every ``-r``/``-c`` file they include, by path."""
    found: dict[str, bytes] = {}
    queue = list(paths)
    while queue:
        path = posixpath.normpath(queue.pop(0))
        if path in found:
            continue
        if path.startswith("../") or path.startswith("/"):
            raise SourceError(f"source: requirement include {path!r} points outside the source tree")
        data = pinned.read(path)
        if data is None:
            raise SourceError(f"source at {pinned.commit[:12]}: requirement file {path!r} does not exist")
        found[path] = data
        for line in data.decode("utf-8", "replace").splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] in ("-r", "--requirement", "-c", "--constraint"):
                queue.append(posixpath.join(posixpath.dirname(path), words[1]))
    return found

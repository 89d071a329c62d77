"""The pinned trees read from git bundles (a build's escrow) instead of their hosts: each bundle
fetched into the mirror of its URL (builder/source/pinned.py's, in the run's own cache directory:
``fsutil.cache_scope``), every object it brought checked with ``git fsck`` (a bundle is untrusted
input: git before 2.46 does not fsck what it unbundles, whatever ``fetch.fsckObjects`` says), and
the pinned commit required to be the bundle's one ref. The trees are then exported exactly as a
fetched tree is (builder/source/export.py's rules), and the third-party trees and submodules
resolved from the mirrors with no fetch (``pinned._commit_repo`` finds the commit there).
"""

from __future__ import annotations

from pathlib import Path

from builder.config.matrix import Source
from builder.errors import SourceError
from builder.source import pinned
from builder.source.export import Limits

BUNDLE_REF = "refs/heads/pinned"  # the one ref `build escrow` puts in a bundle (builder/escrow/collect.py)


def unbundle(url: str, commit: str, bundle: Path, shallow: bool) -> None:
    """The commit of ``bundle`` into the mirror of ``url`` (made, with pinned.MIRROR_CONFIG).
    ``shallow``: the bundle holds the commit but not its parents (a tree fetched by id at depth 1),
    so the mirror is marked shallow there first, as the fetch that made it had left it."""
    import git

    repo = pinned._mirror(url)  # pinned.py is at its line limit: its private helper, called from here
    if shallow:
        with Path(repo.git_dir, "shallow").open("a") as fh:
            fh.write(commit + "\n")
    local = f"refs/k3/escrow/{commit}"
    try:
        with repo.git.custom_environment(**pinned.GIT_ENV):
            repo.git.fetch("--no-tags", "--force", "--", str(bundle), f"+{BUNDLE_REF}:{local}")
            got = repo.git.rev_parse("--verify", "--end-of-options", f"{local}^{{commit}}")
            repo.git.fsck("--strict", "--no-dangling", "--no-progress")
    except git.GitCommandError as exc:
        raise SourceError(
            f"escrowed source {pinned._shown(url, 200)} @ {commit[:12]}: {bundle.name}: {pinned.git_reason(exc)}; "
            "refused: a bundle is untrusted input"
        ) from None
    if got != commit:
        raise SourceError(
            f"escrowed source {pinned._shown(url, 200)}: {bundle.name} holds {got[:12]} as {BUNDLE_REF}, "
            f"the record pins {commit[:12]}; refused"
        )


def from_mirror(source: Source) -> pinned.PinnedSource:
    """The pinned source from its mirror (``unbundle`` filled it), with no fetch: the commit must
    be there. Its branch is not read (the escrow keeps the commit, not the branch): the head is
    the pin."""
    repo = pinned._mirror(source.url)
    if not pinned._has_commit(repo, source.commit):
        raise SourceError(f"source {source.url}: the escrow's bundle does not hold the pinned commit {source.commit}")
    commit = repo.commit(source.commit)
    return pinned.PinnedSource(
        limits=Limits(source.export.max_bytes, source.export.max_files),
        repo=repo,
        commit=source.commit,
        branch_head=source.commit,
        source_date_epoch=pinned.commit_time(
            f"source {source.url} at {source.commit[:12]}", int(commit.committed_date)
        ),
    )

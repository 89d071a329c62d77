"""Where the kernel plan reads the source at the pin: the local mirror when an earlier fetch already
put the pinned commit there and verified it on the branch (no network: `build plan` stays offline
and fast wherever the source was locked, built or tracked), else the git host (fetched into the
mirror, as `build lock` does), or PyPI's sdist (``--rehearse``, machines that reach only PyPI)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from builder.config.matrix import Source, Target
from builder.errors import Unreachable
from builder.source import pinned
from builder.source.export import Limits

if TYPE_CHECKING:
    from builder.source.requirements import SourceTree

# How each way is named where the plan says which source it read.
GIT, MIRROR, SDIST = "git", "mirror", "sdist"


def from_mirror(source: Source) -> pinned.PinnedSource | None:
    """The pinned commit from the local mirror without fetching, when the mirror's copy of the branch
    (``refs/k3/<branch>``, written only by a fetch of that branch from ``source.url``) carries it;
    None when it does not (never fetched, or the pin is newer than the last fetch)."""
    import git

    path = pinned._mirror_path(source.url)  # the mirror `build lock`/`track` fetch into (keyed by URL)
    if not (path / "HEAD").is_file():
        return None
    repo = git.Repo(path)
    try:
        head = repo.git.rev_parse("--verify", "--quiet", "--end-of-options", f"refs/k3/{source.branch}^{{commit}}")
    except git.GitCommandError:
        return None
    if not pinned._has_commit(repo, source.commit):
        return None
    if head != source.commit and not pinned._is_ancestor(repo, source.commit, head):
        return None
    return pinned.PinnedSource(
        limits=Limits(source.export.max_bytes, source.export.max_files),
        repo=repo,
        commit=source.commit,
        branch_head=head,
        source_date_epoch=pinned.commit_time(
            f"source {source.url} at {source.commit[:12]}", int(repo.commit(source.commit).committed_date)
        ),
    )


def read_source(target: Target, how: str) -> tuple[SourceTree, str]:
    """The source at the pin and where it came from. ``how``: SDIST (PyPI's sdist), GIT (fetch the
    branch from the git host, re-verifying the pin is on it) or MIRROR (the mirror when it holds the
    pin, else as GIT). A git host out of reach is exit 3, naming the ways around it."""
    src = target.source
    if how == SDIST:
        from builder.source.sdist import sdist_source

        return sdist_source(src), f"PyPI sdist {src.package}=={src.version} @ {src.commit[:12]}"
    cached = from_mirror(src) if how == MIRROR else None
    if cached is not None:
        return cached, f"git {src.url} @ {src.commit[:12]} (local mirror)"
    try:
        return pinned.fetch(src), f"git {src.url} @ {src.commit[:12]}"
    except Unreachable as exc:
        raise Unreachable(
            f"{exc.message}; the kernel plan reads the pinned commit: `build plan --target {target.name} --rehearse` "
            "reads it from PyPI's sdist instead, `--no-source` shows the plan without it"
        ) from None

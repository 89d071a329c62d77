"""`build track`: follow the K3 branch. Resolve its head with ls-remote (no clone), and when it has
moved past the pin, move the pin in matrix.yaml (that one line, comments and order untouched),
re-render, and list the commit subjects in between when the history is available."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import git
import ruamel.yaml

from builder.config.matrix import Matrix, parse
from builder.dockerfile import render
from builder.errors import ConfigError, SourceError, Unreachable, is_network_failure
from builder.fsutil import atomic_write
from builder.log import printable
from builder.source import export
from builder.source import pinned as source
from builder.source.bump import BumpReport

FILE_URLS_ENV = "K3_ALLOW_FILE_URLS"  # tests and local mirrors only


@dataclass
class TrackResult:
    target: str
    branch: str
    old: str
    new: str
    subjects: list[str] = field(default_factory=list)
    updated: bool = False
    # Third-party sources whose pin the new commit's build files no longer name: name -> what they
    # name now (the GIT_TAG / *_TAG / *_REVISION values found in declared_in).
    third_party_changed: dict[str, list[str]] = field(default_factory=dict)
    # What the new commit's build files will fetch and compile, against the old pin's
    # (builder/source/bump.py); None when the branch did not move.
    report: BumpReport | None = None

    @property
    def moved(self) -> bool:
        return self.old != self.new

    def to_json(self) -> dict:
        return {
            "target": self.target,
            "branch": self.branch,
            "old": self.old,
            "new": self.new,
            "moved": self.moved,
            "updated": self.updated,
            "subjects": self.subjects,
            "third_party_changed": self.third_party_changed,
            "report": self.report.to_json() if self.report else None,
            "ready": self.report.ready if self.report else True,
        }


def remote_head(url: str, branch: str) -> str:
    """The commit ``refs/heads/<branch>`` points at, by ls-remote on that exact ref."""
    if url.startswith("file://") and os.environ.get(FILE_URLS_ENV) != "1":
        raise SourceError(f"source {url}: file:// URLs are only followed with {FILE_URLS_ENV}=1 (tests, local mirrors)")
    ref = f"refs/heads/{branch}"
    client = git.cmd.Git()
    try:
        with client.custom_environment(**source.GIT_ENV):
            out = cast(str, client.ls_remote(url, ref))  # GitPython's union of result forms; called so, str
    except git.GitCommandError as exc:
        kind = Unreachable if is_network_failure(exc.stderr or "") else SourceError
        raise kind(f"source {url}: cannot reach the remote: {source.git_reason(exc)}") from None
    for line in out.splitlines():
        sha, _, name = line.partition("\t")
        if name == ref:
            return sha
    raise SourceError(f"source {url}: branch {branch!r} no longer exists ({ref}); re-pin source.branch and commit")


_NAMED_REF = re.compile(r"""(?:GIT_TAG|_TAG|_REVISION)["'\s]+["']?([A-Za-z0-9][A-Za-z0-9._/+-]*)""")


def third_party_changes(t, repo: git.Repo, commit: str) -> dict[str, list[str]]:
    """Each pinned third-party source whose ``declared_in`` file at ``commit`` no longer names its
    ``ref``, with the refs that file names now (for the person re-pinning it)."""
    changed = {}
    for name, spec in sorted(t.source.third_party.items()):
        try:
            data = (repo.commit(commit).tree / spec.declared_in).data_stream.read().decode("utf-8", "replace")
        except KeyError:
            changed[name] = [f"({spec.declared_in} is gone)"]
            continue
        if spec.ref not in data:
            changed[name] = sorted(set(_NAMED_REF.findall(data))) or ["(no GIT_TAG found)"]
    return changed


def bump_report(t, pinned: source.PinnedSource, old: str, sandbox) -> BumpReport:
    """The fetch inventory and the kernel plan at ``old`` and at the new commit ``pinned``, compared."""
    from dataclasses import replace

    from builder.source.bump import compare
    from builder.source.kernelmap import compute

    trees = (replace(pinned, commit=old), pinned)
    return compare(compute(trees[0], t, old, sandbox), compute(trees[1], t, pinned.commit, sandbox), trees, t)


def _commit_line(text: str, target: str, old: str) -> int:
    doc = ruamel.yaml.YAML().load(text)
    try:
        src = doc["targets"][target]["source"]
        line = src.lc.value("commit")[0]
    except (KeyError, TypeError):
        raise ConfigError(
            f"targets.{target}.source.commit: not written in the target's own entry; "
            "track moves only a pin the target spells out"
        ) from None
    if old not in text.splitlines()[line]:
        raise ConfigError(f"targets.{target}.source.commit: the pin is not on one line; edit it by hand")
    return line


def track(matrix_path: Path, matrix: Matrix, name: str, *, check: bool, sandbox) -> TrackResult:
    """Move ``name``'s pin to its branch head (``check``: report only); ``sandbox`` runs the kernel plan's CMake."""
    t = matrix.target(name)
    old = t.source.commit
    new = remote_head(t.source.url, t.source.branch)
    result = TrackResult(name, t.source.branch, old, new)
    if not result.moved:
        return result
    # History: fetch the branch into the mirror; the old pin must still be on it (no force-push).
    moved_source = t.source.model_copy(update={"commit": new})
    pinned = source.fetch(moved_source)
    if pinned.branch_head != new:
        raise SourceError(f"source {t.source.url}: {t.source.branch} moved again while tracking; run track again")
    repo = pinned.repo
    try:
        repo.git.cat_file("-e", f"{old}^{{commit}}")
        # GitPython types the revs as Commit objects; it hands them to merge-base, which takes any rev.
        reachable = repo.is_ancestor(old, new)  # type: ignore[arg-type]
    except git.GitCommandError:
        reachable = False
    if not reachable:
        raise SourceError(
            f"source {t.source.url}: {t.source.branch} was rewritten: the pin {old[:12]} is not "
            f"an ancestor of the new head {new[:12]} (force-push?); review and re-pin by hand"
        )
    # The new tree is checked as the export will check it (no duplicate entry, no link out of the
    # tree, the caps): a pin the build would refuse is not moved to. A mirror filled before its
    # objects were checked by fsck would otherwise let one through here.
    export.plan(repo, new, export.Budget(pinned.limits), f"source {t.source.url} at {new[:12]}")
    # Subjects are upstream text: control characters escaped before a terminal or the PR body.
    result.subjects = [printable(s) for s in repo.git.log("--format=%h %s", f"{old}..{new}").splitlines()]
    result.third_party_changed = third_party_changes(t, repo, new)
    result.report = bump_report(t, pinned, old, sandbox)
    if check:
        return result
    text = matrix_path.read_text()
    line = _commit_line(text, name, old)
    lines = text.splitlines(keepends=True)
    lines[line] = lines[line].replace(old, new, 1)
    new_text = "".join(lines)
    new_matrix = parse(new_text, matrix_path)  # validate before anything is written
    dockerfiles = render.outputs(new_matrix.target(name), matrix_path)  # one per platform
    atomic_write(matrix_path, new_text)
    for path, dockerfile in dockerfiles:
        atomic_write(path, dockerfile)
    result.updated = True
    return result

"""The pinned source and its pinned third-party sources (with their submodules): fetched with
GitPython into local mirrors, verified, exported. Its requirement files are
builder/source/requirements.py's to read; its PyPI sdist, builder/source/sdist.py's.

The build never sees a live checkout: it gets the pinned commit's tree, written by
builder/source/export.py (which trusts no path check: the tree is untrusted input) with every
mtime set to the commit's time (which is also SOURCE_DATE_EPOCH), so the context is a pure
function of the commit. Every mirror checks the objects it receives (``transfer.fsckObjects``),
so git itself refuses a malformed tree at the fetch.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from builder.config.matrix import Source, ThirdParty
from builder.errors import RESOURCE_ERRNOS, SourceError, failure_kind
from builder.fsutil import cache_dir, cache_sealed, clamp_mtimes
from builder.source.export import Budget, Limits, export_tree, export_trees
from builder.source.newmirror import mirror_at

if TYPE_CHECKING:  # GitPython costs ~40 ms to import: only the commands that fetch pay it
    import git


# A checkout's package data is what its VCS tracks: setuptools includes the files setuptools-scm's
# file finder lists (include_package_data, on by default for a pyproject project), and the finder
# asks git. An export has no .git, so the finder lists nothing and every non-Python file under the
# package (vLLM 0.30.0: numa_wrapper.sh, which --numa-bind execs, and 42 tuning configs and
# READMEs) silently drops out of the wheel. With .git_archival.txt naming a commit (as `git archive`
# writes it for a repository that asks for export-subst), the finder lists every file of the
# archive instead: an archive holds exactly the tracked files. It is written by the tool from the
# pin (replacing any the tree carries), and the package_files check holds the result.
ARCHIVAL_NAME = ".git_archival.txt"


@dataclass(frozen=True)
class PinnedSource:
    """A verified commit in the local mirror."""

    repo: git.Repo
    commit: str
    branch_head: str
    source_date_epoch: int
    limits: Limits  # source.export: caps on each exported tree (this one, each third-party tree)

    def read(self, path: str) -> bytes | None:
        """A file's bytes at the pinned commit, or None when it does not exist there."""
        try:
            blob = self.repo.commit(self.commit).tree / path
        except KeyError:
            return None
        if blob.type != "blob":
            return None
        return blob.data_stream.read()

    def _regular_files(self, directory: str) -> list:
        """The regular files (100644 or 100755) the commit carries under ``directory``: traverse()
        yields blobs, trees and submodules (typed as a union with tuples); symlinks are not files."""
        try:
            tree = self.repo.commit(self.commit).tree / directory
        except KeyError:
            return []
        if tree.type != "tree":
            return []
        return [i for i in tree.traverse() if getattr(i, "type", None) == "blob" and i.mode & 0o170000 == 0o100000]  # type: ignore[union-attr]

    def files_under(self, directory: str) -> dict[str, bool]:
        """Every regular file under ``directory`` (relative to the root) -> git records it executable."""
        return {str(i.path): bool(i.mode & 0o111) for i in self._regular_files(directory)}

    def blob_ids_under(self, directory: str) -> dict[str, str]:
        """The same files -> git blob id (sha1 of ``blob <size>`` NUL + the bytes, which the commit pins)."""
        return {str(i.path): str(i.hexsha) for i in self._regular_files(directory)}

    def export(self, dest: Path) -> Path:
        """The commit's tree written into dest (replaced), mtimes fixed to the commit time, with a
        ``.git_archival.txt`` naming the commit (ARCHIVAL_NAME: why) in place of the tree's own."""
        _fresh(dest)
        export_tree(
            self.repo,
            self.commit,
            dest,
            Budget(self.limits),
            f"source tree at {self.commit[:12]}",
            extra={ARCHIVAL_NAME: f"node: {self.commit}\n".encode()},
        )
        clamp_mtimes(dest, self.source_date_epoch)
        return dest


def _fresh(dest: Path) -> None:
    """An empty directory at dest (the tool's own build directory): a previous export removed."""
    if dest.is_symlink() or dest.is_file():
        dest.unlink()
    elif dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)


# Only these transports, ever (ext:: and friends run commands); never prompt for credentials.
GIT_ENV = {"GIT_ALLOW_PROTOCOL": "https:file", "GIT_TERMINAL_PROMPT": "0"}


def git_reason(exc: git.GitCommandError) -> str:
    text = (exc.stderr or "").strip().removeprefix("stderr: ")
    if len(text) > 1 and text[0] == text[-1] == "'":  # GitPython's quoting: stderr: '...'
        text = text[1:-1]
    detail = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # git's "fatal:" lines say why (e.g. "detected dubious ownership"); the rest is advice.
    fatal = [ln.removeprefix("fatal: ") for ln in detail if ln.startswith("fatal:")]
    if fatal:
        return "; ".join(dict.fromkeys(fatal))
    return detail[-1] if detail else f"git exited {exc.status}"


def _mirror_path(url: str) -> Path:
    return cache_dir() / "git" / (hashlib.sha256(url.encode()).hexdigest()[:24] + ".git")


# Set in every mirror, old ones included: git checks each object it receives (a tree with a
# duplicate entry, a '..' or '.git' name, a malformed object), so a hostile tree is refused at the
# fetch, before the export's own checks see it. The attributes file is /dev/null: nothing the
# host's configuration says about attributes applies to a mirror (the export reads no attributes
# at all; this keeps any other git command on the mirror from reading them either).
MIRROR_CONFIG = {
    "transfer.fsckObjects": "true",
    "fetch.fsckObjects": "true",
    "receive.fsckObjects": "true",
    "core.attributesFile": "/dev/null",
}


def _mirror(url: str) -> git.Repo:
    """The local bare mirror of ``url``, made on first use, with MIRROR_CONFIG set."""
    import git

    path = _mirror_path(url)
    repo = git.Repo(mirror_at(path))
    for attempt in range(20):  # written only when needed; another build may hold config.lock a moment
        reader = repo.config_reader("repository")
        missing = {}
        for key, value in MIRROR_CONFIG.items():
            section, _, option = key.rpartition(".")
            # GitPython reads "true" back as a bool: compared as git would, case-insensitively.
            if not reader.has_option(section, option) or str(reader.get_value(section, option)).lower() != value:
                missing[(section, option)] = value
        if not missing:
            return repo
        try:
            with repo.config_writer("repository") as config:
                for (section, option), value in missing.items():
                    config.set_value(section, option, value)
        except OSError as exc:
            if exc.errno in RESOURCE_ERRNOS or attempt == 19:
                raise
            time.sleep(0.1)
    return repo


# git's own words when fsck refuses what a fetch received.
_FSCK_REFUSALS = ("fsck error", "object fails fsck")


def _refuse_malformed(what: str, exc: git.GitCommandError) -> None:
    """A fetch fsck refused is bad upstream input (SourceError, exit 2), said in one line."""
    text = exc.stderr or ""
    if any(marker in text for marker in _FSCK_REFUSALS) and failure_kind(text, SourceError) is SourceError:
        # "error: object <id>: duplicateEntries: contains duplicate file entries": the check's name
        detail = [m.group(1) for m in re.finditer(r"error: object [0-9a-f]+: ([^\n]+)", text)]
        raise SourceError(
            f"{what}: git refused a malformed object (transfer.fsckObjects"
            + (f": {_shown(detail[0], 160)}" if detail else "")
            + "); refused: a tree is untrusted input, review the upstream commit"
        ) from None


def fetch(source: Source) -> PinnedSource:
    """Fetch ``refs/heads/<branch>`` into the mirror; verify the pinned commit is on it."""
    import git

    repo = _mirror(source.url)
    ref = f"refs/heads/{source.branch}"
    local = f"refs/k3/{source.branch}"
    try:
        # Full ref names only: a tag or another ref of the same short name is never picked.
        with repo.git.custom_environment(**GIT_ENV):
            repo.git.fetch("--no-tags", "--force", "--", source.url, f"+{ref}:{local}")
    except git.GitCommandError as exc:
        reason = git_reason(exc)
        _refuse_malformed(f"source {source.url}: {ref}", exc)
        if "couldn't find remote ref" in (exc.stderr or ""):
            raise SourceError(
                f"source {source.url}: branch {source.branch!r} not found ({ref}); check source.branch in the matrix"
            ) from None
        kind = failure_kind(exc.stderr or reason, SourceError)
        raise kind(
            f"source {source.url}: cannot fetch {ref}: {reason} (is the source's host reachable from here?)"
        ) from None
    head = repo.git.rev_parse("--verify", "--end-of-options", f"{local}^{{commit}}")
    if not _has_commit(repo, source.commit):
        raise SourceError(
            f"source {source.url}: pinned commit {source.commit} does not exist on {ref} (head {head}); "
            "was the branch force-pushed? re-pin source.commit"
        ) from None
    if head != source.commit and not _is_ancestor(repo, source.commit, head):
        raise SourceError(
            f"source {source.url}: pinned commit {source.commit} is not on {ref} (head {head}); re-pin source.commit"
        )
    commit = repo.commit(source.commit)
    return PinnedSource(
        limits=Limits(source.export.max_bytes, source.export.max_files),
        repo=repo,
        commit=source.commit,
        branch_head=head,
        source_date_epoch=commit_time(f"source {source.url} at {source.commit[:12]}", int(commit.committed_date)),
    )


CLOCK_SKEW_SECONDS = 300  # how far a commit may be ahead of this host's clock (clocks drift)


def commit_time(what: str, epoch: int, now: float | None = None) -> int:
    """A commit's time as SOURCE_DATE_EPOCH. Beyond a small skew into the future it is refused:
    every mtime in the context would be newer than the build's clock (ninja then loops "manifest
    still dirty"), and the record would date the image before its source. Within the skew: a warning."""
    import datetime as dt

    from builder import log

    now = time.time() if now is None else now
    if epoch <= now:
        return epoch
    when = dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    clock = dt.datetime.fromtimestamp(now, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if epoch > now + CLOCK_SKEW_SECONDS:
        raise SourceError(
            f"{what}: the commit is dated {when}, ahead of this host's clock ({clock}) by more than "
            f"{CLOCK_SKEW_SECONDS}s; refused: fix the host's clock, or review the commit's date and re-pin"
        )
    log.warn(
        f"{what}: the commit is dated {when}, {epoch - now:.0f}s ahead of this host's clock ({clock}): "
        "is the clock behind?"
    )
    return epoch


# --- third-party sources -------------------------------------------------------------------------

_HEX40 = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class Submodule:
    path: str  # inside the third-party tree, e.g. csrc/cutlass (nested ones: a/b/c)
    url: str
    commit: str  # the gitlink recorded in the parent's tree: pinned by the parent's commit


@dataclass(frozen=True)
class PinnedThirdParty:
    """A third-party source at its pinned commit, with every submodule it exports resolved."""

    name: str
    url: str
    commit: str
    source_date_epoch: int
    submodules: tuple[Submodule, ...]
    limits: Limits  # the main source's source.export caps, for this tree with its submodules

    def to_json(self) -> dict:
        return {
            "url": self.url,
            "commit": self.commit,
            "submodules": [{"path": s.path, "url": s.url, "commit": s.commit} for s in self.submodules],
        }

    def export(self, dest: Path) -> Path:
        """The tree as FetchContent would have checked it out (submodules included), mtimes fixed.
        Each submodule is written into its gitlink's directory, reached without following a link."""
        _fresh(dest)
        top = f"third-party source {self.name} at {self.commit[:12]}"
        parts = [(_commit_repo(self.url, self.commit), self.commit, "", top)]
        for sub in self.submodules:
            where = f"third-party source {self.name}: submodule {sub.path} at {sub.commit[:12]}"
            parts.append((_commit_repo(sub.url, sub.commit), sub.commit, sub.path, where))
        export_trees(parts, dest, Budget(self.limits))  # every link resolved across the assembled tree
        clamp_mtimes(dest, self.source_date_epoch)
        return dest


def _has_commit(repo: git.Repo, commit: str) -> bool:
    import git

    try:
        repo.git.cat_file("-e", "--end-of-options", f"{commit}^{{commit}}")
        return True
    except git.GitCommandError:
        return False


def _is_ancestor(repo: git.Repo, ancestor: str, head: str) -> bool:
    import git

    try:
        repo.git.merge_base("--is-ancestor", "--end-of-options", ancestor, head)
        return True
    except git.GitCommandError:
        return False


def _commit_repo(url: str, commit: str) -> git.Repo:
    """A mirror of ``url`` that holds ``commit``: fetched by id (GitHub serves any reachable commit),
    else every branch and tag; the commit must exist either way."""
    import git

    repo = _mirror(url)
    if _has_commit(repo, commit):
        return repo
    if cache_sealed():  # a rebuild from the escrow: every commit came in a bundle, none is fetched
        raise SourceError(f"{_shown(url, 200)}: commit {commit[:12]} is not in the escrow; nothing is fetched")
    # `--` first: a URL is never an option (git would run `--upload-pack=<command>` on the host).
    attempts = (
        ["--depth=1", "--", url, commit],
        ["--", url, "+refs/heads/*:refs/k3/heads/*", "+refs/tags/*:refs/k3/tags/*"],
    )
    reason = ""
    for args in attempts:
        try:
            with repo.git.custom_environment(**GIT_ENV):
                repo.git.fetch("--no-tags", "--force", *args)
        except git.UnsafeOptionError as exc:  # GitPython's own guard, behind `--` and the URL rule
            reason = str(exc)
            continue
        except git.GitCommandError as exc:
            _refuse_malformed(f"third-party source {_shown(url, 200)}: commit {commit[:12]}", exc)
            reason = git_reason(exc)
            continue
        if _has_commit(repo, commit):
            return repo
    kind = failure_kind(reason, SourceError)
    raise kind(
        f"third-party source {_shown(url, 200)}: commit {commit} cannot be fetched"
        + (f" ({reason})" if reason else "")
        + "; is the host reachable, and is the commit right?"
    )


def _peeled_ref(url: str, ref: str) -> str | None:
    """What a tag or branch name points at on the remote now (annotated tags peeled)."""
    import git

    client = git.cmd.Git()
    try:
        with client.custom_environment(**GIT_ENV):
            # GitPython types a command's result as every form it can take; called so, it is str.
            out = cast(
                str, client.ls_remote("--", url, f"refs/tags/{ref}", f"refs/tags/{ref}^{{}}", f"refs/heads/{ref}")
            )
    except git.UnsafeOptionError as exc:  # GitPython's own guard, behind `--` and the URL rule
        raise SourceError(f"third-party source {_shown(url, 200)}: cannot resolve {ref!r}: {exc}") from None
    except git.GitCommandError as exc:
        kind = failure_kind(exc.stderr or "", SourceError)
        raise kind(f"third-party source {url}: cannot resolve {ref!r}: {git_reason(exc)}") from None
    pairs = (line.split("\t", 1) for line in out.splitlines() if "\t" in line)  # "<sha>\t<ref name>"
    found = {name: sha for sha, name in pairs}
    for name in (f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}"):
        if name in found:
            return found[name]
    return None


def _relative_url(base: str, rel: str) -> str:
    """A relative submodule URL resolved against the superproject's URL, as git does."""
    scheme, _, rest = base.partition("://")
    return (
        f"{scheme}://" + posixpath.normpath(posixpath.join(rest.rstrip("/"), rel)).lstrip("/")
        if scheme != "file"
        else "file://" + posixpath.normpath(posixpath.join(rest.rstrip("/"), rel))
    )


def _gitmodules(repo: git.Repo, commit: str) -> list[dict[str, str]]:
    """The ``submodule.<name>.path/url`` entries of ``commit``'s .gitmodules (none without one)."""
    import git

    try:
        # -z: a value with a newline in it cannot forge a second entry.
        listing = repo.git.config("-z", f"--blob={commit}:.gitmodules", "--list")
    except git.GitCommandError:
        return []  # no .gitmodules
    entries: dict[str, dict[str, str]] = {}
    for item in listing.split("\0"):
        key, _, value = item.partition("\n")
        m = re.fullmatch(r"submodule\.(.+)\.(path|url)", key)
        if m:
            entries.setdefault(m.group(1), {})[m.group(2)] = value
    return sorted(entries.values(), key=lambda e: e.get("path", ""))


def _tree_url(owner: str, parent_url: str, path: str, url: str) -> str:
    """A submodule URL from an untrusted tree, resolved and held to the matrix's own GitUrl rule
    (https:// or file://, no credentials, quotes, spaces or a leading '-'); a tree under an
    https:// source may not name a file:// one (that would copy a host repository into the build)."""
    from pydantic import TypeAdapter, ValidationError

    from builder.config.patterns import GitUrl, RelPath

    where = f"third-party source {owner}: submodule {_shown(path)} in .gitmodules"
    try:
        TypeAdapter(RelPath).validate_python(path)
    except ValidationError:
        raise SourceError(
            f"{where}: the path is not a relative path inside the tree (no '..', no leading "
            "'/'); refused: a tree is untrusted input"
        ) from None
    if url.startswith("../") or url.startswith("./"):
        url = _relative_url(parent_url, url)
    try:
        TypeAdapter(GitUrl).validate_python(url)
    except ValidationError:
        raise SourceError(
            f"{where}: url {_shown(url)} is not an https:// or file:// git URL without credentials, "
            "quotes, spaces or shell characters; refused: a tree is untrusted input"
        ) from None
    if url.startswith("file://") and not parent_url.startswith("file://"):
        raise SourceError(f"{where}: url {_shown(url)} is a host path under an https:// source; refused")
    return url


def _shown(value: str, limit: int = 80) -> str:
    """Untrusted text in a message: redacted first (a credential is never cut in half), then cut."""
    from builder.log import shown

    return shown(value, limit)


def _submodules(repo: git.Repo, url: str, commit: str, wanted, owner: str, prefix: str = "") -> list[Submodule]:
    """Submodules of ``commit`` (recursively), as ``git submodule update --init --recursive`` would
    check them out; ``wanted`` is "all", "none" or a tuple of top-level paths."""
    if wanted == "none":
        return []
    found: list[Submodule] = []
    for entry in _gitmodules(repo, commit):
        path, sub_url = entry.get("path"), entry.get("url")
        if not path or not sub_url or (wanted != "all" and path not in wanted):
            continue
        full = f"{prefix}{path}"
        sub_url = _tree_url(owner, url, full, sub_url)
        tree_line = repo.git.ls_tree("--end-of-options", commit, "--", path)
        mode, _, rest = tree_line.partition(" ")
        if mode != "160000" or not _HEX40.fullmatch(rest.split()[1]):
            continue  # declared in .gitmodules but not a gitlink at this commit
        sub_commit = rest.split()[1]
        found.append(Submodule(full, sub_url, sub_commit))
        sub_repo = _commit_repo(sub_url, sub_commit)
        found += _submodules(sub_repo, sub_url, sub_commit, "all", owner, prefix=f"{full}/")
    return found


def fetch_third_party(name: str, spec: ThirdParty, pinned: PinnedSource, live: bool = True) -> PinnedThirdParty:
    """Fetch one pinned third-party source and check it is what the source's build names."""
    declared = pinned.read(spec.declared_in)
    if declared is None or spec.ref.encode() not in declared:
        raise SourceError(
            f"source at {pinned.commit[:12]}: {spec.declared_in} no longer names {spec.ref!r} for third-party "
            f"{name!r}; the source moved this dependency: re-pin source.third_party.{name} (ref and commit)"
        )
    if _HEX40.fullmatch(spec.ref) and spec.ref != spec.commit:
        raise SourceError(f"source.third_party.{name}: ref {spec.ref} is a commit, so commit must equal it")
    if not _HEX40.fullmatch(spec.ref) and live:  # a mutable tag must still be at the pin (live: not escrowed)
        now = _peeled_ref(spec.url, spec.ref)
        if now != spec.commit:
            raise SourceError(
                f"third-party source {spec.url}: {spec.ref!r} points at {now or 'nothing'}, the matrix pins "
                f"{spec.commit} (source.third_party.{name}.commit); a moved tag is a new input: review and re-pin"
            )
    repo = _commit_repo(spec.url, spec.commit)
    commit = repo.commit(spec.commit)
    subs = _submodules(repo, spec.url, spec.commit, spec.submodules, name)
    if spec.subdir:
        try:
            commit.tree / spec.subdir
        except KeyError:
            raise SourceError(
                f"source.third_party.{name}.subdir: {spec.subdir!r} is not in {spec.url} at {spec.commit[:12]}"
            ) from None
    epoch = commit_time(f"third-party source {name} at {spec.commit[:12]}", int(commit.committed_date))
    return PinnedThirdParty(name, spec.url, spec.commit, epoch, tuple(subs), pinned.limits)


def fetch_all_third_party(source: Source, pinned: PinnedSource, live: bool = True) -> dict[str, PinnedThirdParty]:
    return {name: fetch_third_party(name, spec, pinned, live) for name, spec in sorted(source.third_party.items())}

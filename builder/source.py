"""The pinned source: fetched with GitPython into a local mirror, verified, exported.

The build never sees a live checkout: it gets ``git archive`` of the pinned commit, extracted
with every mtime set to the commit's time (which is also SOURCE_DATE_EPOCH), so the context is
a pure function of the commit.
"""

from __future__ import annotations

import hashlib
import io
import posixpath
import re
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from builder.errors import SourceError, Unreachable, is_network_failure
from builder.fsutil import cache_dir, clamp_mtimes
from builder.matrix import Source, ThirdParty

if TYPE_CHECKING:  # GitPython costs ~40 ms to import: only the commands that fetch pay it
    import git


@dataclass(frozen=True)
class PinnedSource:
    """A verified commit in the local mirror."""

    repo: git.Repo
    commit: str
    branch_head: str
    source_date_epoch: int

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
        _archive_into(self.repo, self.commit, dest)
        clamp_mtimes(dest, self.source_date_epoch)
        return dest


def _archive_into(repo: git.Repo, commit: str, dest: Path) -> None:
    data = repo.git.archive("--format=tar", commit, stdout_as_string=False)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4 / 3.12
            tar.extractall(dest, filter="data")
        else:  # Debian 12's 3.11.2: the same refusals, by hand
            tar.extractall(dest, members=_data_members(tar, dest))


def _data_members(tar: tarfile.TarFile, dest: Path):
    """Members of a source archive that stay inside ``dest`` (what tarfile's "data" filter allows):
    files, directories and links whose path and link target resolve under it, nothing else."""
    root = dest.resolve()
    for member in tar.getmembers():
        path = (root / member.name).resolve()
        if member.name.startswith("/") or not path.is_relative_to(root):
            raise SourceError(f"source archive: {member.name!r} points outside the source tree")
        if member.issym() or member.islnk():
            base = path.parent if member.issym() else root
            target = (base / member.linkname).resolve()
            if member.linkname.startswith("/") or not target.is_relative_to(root):
                raise SourceError(f"source archive: link {member.name!r} points outside the source tree")
        elif not (member.isfile() or member.isdir()):
            continue  # devices and fifos have no place in a source tree
        member.mode &= 0o755 if member.isdir() or member.mode & 0o111 else 0o644
        yield member


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


def fetch(source: Source) -> PinnedSource:
    """Fetch ``refs/heads/<branch>`` into the mirror; verify the pinned commit is on it."""
    import git
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
        kind = Unreachable if is_network_failure(exc.stderr or reason) else SourceError
        raise kind(
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

    def to_json(self) -> dict:
        return {"url": self.url, "commit": self.commit,
                "submodules": [{"path": s.path, "url": s.url, "commit": s.commit} for s in self.submodules]}

    def export(self, dest: Path) -> Path:
        """The tree as FetchContent would have checked it out (submodules included), mtimes fixed."""
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        _archive_into(_commit_repo(self.url, self.commit), self.commit, dest)
        for sub in self.submodules:
            target = dest / sub.path
            target.mkdir(parents=True, exist_ok=True)
            _archive_into(_commit_repo(sub.url, sub.commit), sub.commit, target)
        clamp_mtimes(dest, self.source_date_epoch)
        return dest


def _has_commit(repo: git.Repo, commit: str) -> bool:
    import git
    try:
        repo.git.cat_file("-e", f"{commit}^{{commit}}")
        return True
    except git.GitCommandError:
        return False


def _commit_repo(url: str, commit: str) -> git.Repo:
    """A mirror of ``url`` that holds ``commit``: fetched by id (GitHub serves any reachable commit),
    else every branch and tag; the commit must exist either way."""
    import git
    mirror = _mirror_path(url)
    repo = git.Repo(mirror) if mirror.exists() else git.Repo.init(mirror, bare=True, mkdir=True)
    if _has_commit(repo, commit):
        return repo
    attempts = (["--depth=1", url, commit], [url, "+refs/heads/*:refs/k3/heads/*", "+refs/tags/*:refs/k3/tags/*"])
    reason = ""
    for args in attempts:
        try:
            with repo.git.custom_environment(**GIT_ENV):
                repo.git.fetch("--no-tags", "--force", *args)
        except git.GitCommandError as exc:
            reason = git_reason(exc)
            continue
        if _has_commit(repo, commit):
            return repo
    kind = Unreachable if is_network_failure(reason) else SourceError
    raise kind(f"third-party source {url}: commit {commit} cannot be fetched"
               + (f" ({reason})" if reason else "") + "; is the host reachable, and is the commit right?")


def _peeled_ref(url: str, ref: str) -> str | None:
    """What a tag or branch name points at on the remote now (annotated tags peeled)."""
    import git
    client = git.cmd.Git()
    try:
        with client.custom_environment(**GIT_ENV):
            out = client.ls_remote(url, f"refs/tags/{ref}", f"refs/tags/{ref}^{{}}", f"refs/heads/{ref}")
    except git.GitCommandError as exc:
        kind = Unreachable if is_network_failure(exc.stderr or "") else SourceError
        raise kind(f"third-party source {url}: cannot resolve {ref!r}: {git_reason(exc)}") from None
    found = dict(reversed(line.split("\t", 1)) for line in out.splitlines() if "\t" in line)
    for name in (f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}"):
        if name in found:
            return found[name]
    return None


def _relative_url(base: str, rel: str) -> str:
    """A relative submodule URL resolved against the superproject's URL, as git does."""
    scheme, _, rest = base.partition("://")
    return f"{scheme}://" + posixpath.normpath(posixpath.join(rest.rstrip("/"), rel)).lstrip("/") \
        if scheme != "file" else "file://" + posixpath.normpath(posixpath.join(rest.rstrip("/"), rel))


def _submodules(repo: git.Repo, url: str, commit: str, wanted, prefix: str = "") -> list[Submodule]:
    """Submodules of ``commit`` (recursively), as ``git submodule update --init --recursive`` would
    check them out; ``wanted`` is "all", "none" or a tuple of top-level paths."""
    import git
    if wanted == "none":
        return []
    try:
        listing = repo.git.config("--blob", f"{commit}:.gitmodules", "--list")
    except git.GitCommandError:
        return []  # no .gitmodules
    entries: dict[str, dict[str, str]] = {}
    for line in listing.splitlines():
        key, _, value = line.partition("=")
        m = re.fullmatch(r"submodule\.(.+)\.(path|url)", key)
        if m:
            entries.setdefault(m.group(1), {})[m.group(2)] = value
    found: list[Submodule] = []
    for entry in sorted(entries.values(), key=lambda e: e.get("path", "")):
        path, sub_url = entry.get("path"), entry.get("url")
        if not path or not sub_url or (wanted != "all" and path not in wanted):
            continue
        tree_line = repo.git.ls_tree(commit, path)
        mode, _, rest = tree_line.partition(" ")
        if mode != "160000":
            continue  # declared in .gitmodules but not a gitlink at this commit
        sub_commit = rest.split()[1]
        if sub_url.startswith("../") or sub_url.startswith("./"):
            sub_url = _relative_url(url, sub_url)
        full = f"{prefix}{path}"
        found.append(Submodule(full, sub_url, sub_commit))
        sub_repo = _commit_repo(sub_url, sub_commit)
        found += _submodules(sub_repo, sub_url, sub_commit, "all", prefix=f"{full}/")
    return found


def fetch_third_party(name: str, spec: ThirdParty, pinned: PinnedSource) -> PinnedThirdParty:
    """Fetch one pinned third-party source and check it is what the source's build names."""
    declared = pinned.read(spec.declared_in)
    if declared is None or spec.ref.encode() not in declared:
        raise SourceError(
            f"source at {pinned.commit[:12]}: {spec.declared_in} no longer names {spec.ref!r} for third-party "
            f"{name!r}; the source moved this dependency: re-pin source.third_party.{name} (ref and commit)")
    if not _HEX40.fullmatch(spec.ref):
        # A tag or branch is mutable: it must still point at the pinned commit.
        now = _peeled_ref(spec.url, spec.ref)
        if now != spec.commit:
            raise SourceError(
                f"third-party source {spec.url}: {spec.ref!r} points at {now or 'nothing'}, the matrix pins "
                f"{spec.commit} (source.third_party.{name}.commit); a moved tag is a new input: review and re-pin")
    elif spec.ref != spec.commit:
        raise SourceError(f"source.third_party.{name}: ref {spec.ref} is a commit, so commit must equal it")
    repo = _commit_repo(spec.url, spec.commit)
    commit = repo.commit(spec.commit)
    subs = _submodules(repo, spec.url, spec.commit, spec.submodules)
    if spec.subdir:
        try:
            commit.tree / spec.subdir
        except KeyError:
            raise SourceError(f"source.third_party.{name}.subdir: {spec.subdir!r} is not in {spec.url} "
                              f"at {spec.commit[:12]}") from None
    return PinnedThirdParty(name, spec.url, spec.commit, int(commit.committed_date), tuple(subs))


def fetch_all_third_party(source: Source, pinned: PinnedSource) -> dict[str, PinnedThirdParty]:
    return {name: fetch_third_party(name, spec, pinned) for name, spec in sorted(source.third_party.items())}


# --- the source as published on PyPI (for the lock rehearsal on machines without the git host) ---

@dataclass(frozen=True)
class SdistSource:
    """The files of ``package==version``'s PyPI sdist, tied to the pinned commit by its _version.py.

    Offers ``read`` and ``commit`` like PinnedSource, so lock inputs can be computed from it.
    """

    commit: str
    files: dict[str, bytes]
    url: str

    def read(self, path: str) -> bytes | None:
        return self.files.get(posixpath.normpath(path))


def sdist_source(source: Source, index_json: str = "https://pypi.org/pypi") -> SdistSource:
    import json
    import urllib.parse
    import urllib.request

    from builder.fsutil import atomic_write, sha256_file

    page = f"{index_json}/{source.package}/json"
    try:
        with urllib.request.urlopen(page, timeout=60) as resp:  # noqa: S310 - fixed https URL
            doc = json.load(resp)
    except OSError as exc:
        raise Unreachable(f"source {source.package}=={source.version}: cannot read {page}: {exc}") from None
    except ValueError as exc:
        raise SourceError(f"source {source.package}=={source.version}: {page} is not JSON: {exc}") from None
    files = [f for f in doc.get("releases", {}).get(source.version, []) if f.get("packagetype") == "sdist"]
    if not files:
        raise SourceError(f"source {source.package}=={source.version}: PyPI has no sdist of this version")
    meta = files[0]
    url = urllib.parse.urljoin(page, meta["url"])
    dest = cache_dir() / "sdist" / meta["filename"]
    if not dest.exists() or sha256_file(dest) != meta["digests"]["sha256"]:
        try:
            with urllib.request.urlopen(url, timeout=300) as resp:  # noqa: S310
                atomic_write(dest, resp.read())
        except OSError as exc:
            raise Unreachable(f"source {source.package}=={source.version}: cannot download {url}: {exc}") from None
        if sha256_file(dest) != meta["digests"]["sha256"]:
            dest.unlink()
            raise SourceError(f"{url}: sha256 differs from what PyPI lists for it")
    contents: dict[str, bytes] = {}
    with tarfile.open(dest) as tar:
        for member in tar.getmembers():
            if member.isfile() and "/" in member.name:
                data = tar.extractfile(member)
                if data is not None:
                    contents[posixpath.normpath(member.name.split("/", 1)[1])] = data.read()
    version_py = contents.get(f"{source.package}/_version.py", b"").decode("utf-8", "replace")
    m = re.search(r"commit_id\s*=\s*commit_id\s*=\s*'g?([0-9a-f]{7,40})'|commit_id\s*=\s*'g?([0-9a-f]{7,40})'", version_py)
    sdist_commit = (m.group(1) or m.group(2)) if m else None
    if not sdist_commit or not source.commit.startswith(sdist_commit):
        raise SourceError(f"{meta['filename']}: its _version.py names commit {sdist_commit or '(none)'}, the matrix "
                          f"pins {source.commit}; the sdist is not the pinned source")
    return SdistSource(source.commit, contents, url)

"""The source as published on PyPI, for the lock rehearsal on machines without the git host: the
files of ``package==version``'s sdist, tied to the pinned commit by the commit its _version.py names.
"""

from __future__ import annotations

import posixpath
import re
import tarfile
from dataclasses import dataclass

from builder.config.matrix import Source
from builder.errors import SourceError, Unreachable
from builder.fsutil import cache_dir


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
    m = re.search(
        r"commit_id\s*=\s*commit_id\s*=\s*'g?([0-9a-f]{7,40})'|commit_id\s*=\s*'g?([0-9a-f]{7,40})'", version_py
    )
    sdist_commit = (m.group(1) or m.group(2)) if m else None
    if not sdist_commit or not source.commit.startswith(sdist_commit):
        raise SourceError(
            f"{meta['filename']}: its _version.py names commit {sdist_commit or '(none)'}, the matrix "
            f"pins {source.commit}; the sdist is not the pinned source"
        )
    return SdistSource(source.commit, contents, url)

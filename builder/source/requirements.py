"""The source's requirement files, read as untrusted input: every logical line is an include
inside the tree, an index option (dropped: indexes come from the matrix) or a requirement by name
and version; anything that would reach outside the tree (a path or URL, ``-e``, ``${VAR}``, an
option we do not know) is a SourceError naming the file and line.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from builder.errors import SourceError


class SourceTree(Protocol):
    """Where requirement files are read from: the pinned commit (builder/source/pinned.py) or the
    source's PyPI sdist (builder/source/sdist.py)."""

    @property
    def commit(self) -> str: ...

    def read(self, path: str) -> bytes | None: ...


def resolve_includes(pinned: SourceTree, paths: tuple[str, ...]) -> dict[str, bytes]:
    """The named requirement files plus every ``-r``/``-c`` file they include, by path; every line
    checked (``requirement_lines``) so nothing in them reaches outside the tree."""
    found: dict[str, bytes] = {}
    queue = list(paths)
    while queue:
        path = posixpath.normpath(queue.pop(0))
        if path in found:
            continue
        if path.startswith("../") or path.startswith("/") or path == "..":
            raise SourceError(f"source: requirement include {_shown(path)} points outside the source tree")
        data = pinned.read(path)
        if data is None:
            raise SourceError(f"source at {pinned.commit[:12]}: requirement file {_shown(path)} does not exist")
        found[path] = data
        for line in requirement_lines(path, data):
            if line.kind == "include":
                queue.append(posixpath.join(posixpath.dirname(path), line.value))
    return found


@dataclass(frozen=True)
class ReqLine:
    """One logical line of a requirements file (continuations joined, comment stripped)."""

    lineno: int  # of its first physical line
    last: int  # its last physical line (a `\` continuation spans several)
    kind: str  # "include" (-r/-c, value: the path as written), "index" (dropped), "requirement"
    value: str


# pip and uv read these in a requirements file; -r/-c include (inside the tree only), the index
# family is dropped (indexes come from the matrix), everything else (-e, --pre, -Z, abbreviations
# that optparse would expand, ...) is refused: a source tree is untrusted input.
_INCLUDE_OPTS = ("--requirement", "--constraint", "-r", "-c")
_INDEX_OPTS = ("--index-url", "--extra-index-url", "--find-links", "--trusted-host", "--no-index", "-i", "-f")
_OPTION = re.compile(r"(--[A-Za-z][A-Za-z0-9-]*|-[A-Za-z])(?:(?:=|\s+)?(.*))?")
_REQ_START = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\s*(?:\[[A-Za-z0-9._,\s-]*\])?\s*")
_HTTPS_VALUE = r"https://[A-Za-z0-9.-]+(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~%+/-]*)?"


def _logical_lines(data: bytes) -> Iterator[tuple[int, int, str]]:
    """(first line, last line, text) with pip's joining of backslash-continued lines and its comments."""
    first, parts = 0, []  # 0: no line begun (line numbers start at 1)
    for lineno, raw in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        first = first or lineno
        if raw.endswith("\\"):
            parts.append(raw[:-1])
            continue
        parts.append(raw)
        text = re.sub(r"(^|\s+)#.*$", "", "".join(parts)).strip()
        yield first, lineno, text
        first, parts = 0, []
    if parts:
        yield first, first + len(parts) - 1, re.sub(r"(^|\s+)#.*$", "", "".join(parts)).strip()


def requirement_lines(path: str, data: bytes) -> list[ReqLine]:
    """Every meaningful line of a source requirements file; SourceError (file and line) for any
    that would leave the tree: a path or URL, an include outside it, -e, ${VAR} expansion, an
    index that is not a plain https:// URL, an option we do not know."""
    out = []
    for first, last, text in _logical_lines(data):
        if not text:
            continue
        where = f"source requirement file {path}:{first}"
        if "${" in text:
            raise SourceError(f"{where}: ${{...}} expands the host's environment; refused")
        line = ReqLine(
            first, last, *(_option_line(where, text) if text.startswith("-") else _requirement_line(where, text))
        )
        if line.kind == "include" and posixpath.normpath(
            posixpath.join(posixpath.dirname(path), line.value)
        ).startswith(("../", "/")):
            raise SourceError(f"{where}: include {_shown(line.value)} points outside the source tree; refused")
        out.append(line)
    return out


def _option_line(where: str, text: str) -> tuple[str, str]:
    # -rX, -r X, -r=X (uv's spelling), --requirement=X, --requirement X: one name, one value.
    m = _OPTION.fullmatch(text)
    name, value = (m.group(1), (m.group(2) or "").strip()) if m else (text.split()[0], "")
    if name in _INCLUDE_OPTS:
        if not value or "://" in value or value.startswith(("/", "~", "file:")) or "\\" in value:
            raise SourceError(f"{where}: {name} {_shown(value)} points outside the source tree; refused")
        return "include", value
    if name in _INDEX_OPTS:
        rule = {"--no-index": r"", "--trusted-host": r"[A-Za-z0-9.-]+(?::[0-9]{1,5})?"}.get(name, _HTTPS_VALUE)
        if not re.fullmatch(rule, value):
            raise SourceError(
                f"{where}: {name} {_shown(value)} is not a plain https:// URL or host (a path or "
                "file: URL reads the build host's files); refused"
            )
        return "index", value
    raise SourceError(
        f"{where}: option {_shown(name)} is not accepted in a source requirement file "
        "(only -r/-c includes inside the tree; indexes come from the matrix); refused"
    )


def _requirement_line(where: str, text: str) -> tuple[str, str]:
    m = _REQ_START.match(text)
    spec = text.split(";", 1)[0]
    words = text.split()
    bad = (
        not m
        or spec[m.end() :].startswith("@")
        or "/" in spec
        or "\\" in spec
        or re.search(r"\.(whl|zip|tar\.gz|tgz|tar\.bz2)\b", spec)
        or any(w.startswith("-") and not w.startswith("--hash=") for w in words[1:])
    )
    if bad:
        raise SourceError(
            f"{where}: {_shown(text)} is not a requirement by name and version (a path, URL, direct "
            "reference or per-line option reaches outside the tree); refused"
        )
    return "requirement", text


def _shown(value: str, limit: int = 80) -> str:
    """Untrusted text in a message: redacted first (a credential is never cut in half), then cut."""
    from builder.log import shown

    return shown(value, limit)

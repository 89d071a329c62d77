"""CMake files of the upstream tree read as text: split into command invocations (name, arguments,
line), never evaluated here. The kernel plan (builder/source/kernelplan.py) and the fetch inventory
(builder/source/fetches.py) read these; only CMake itself evaluates the few commands the plan
replays.

The text is untrusted: sizes are bounded, a file CMake would not parse (an unclosed parenthesis or
quote) is refused with its file and line, and anything shown from it goes through ``printable``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from builder.errors import SourceError

MAX_FILE_BYTES = 4 * 1024 * 1024  # vLLM's CMakeLists.txt is ~80 KB
MAX_COMMANDS = 100_000
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACKET_OPEN = re.compile(r"\[(=*)\[")


def printable(text: str, limit: int = 160) -> str:
    """``text`` safe for a terminal, a log line or a Markdown table cell: control characters escaped,
    pipes and backticks neutralised, cut at ``limit``."""
    out = []
    for ch in text[:limit]:
        if ch in "|`":
            out.append("\\" + ch)
        elif ch.isprintable() or ch == " ":
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    return "".join(out) + ("..." if len(text) > limit else "")


@dataclass(frozen=True)
class Arg:
    text: str  # unquoted: as written; quoted or bracket: the content
    quoted: bool


@dataclass(frozen=True)
class Command:
    name: str  # lower-cased: CMake command names are case-insensitive
    args: tuple[Arg, ...]
    line: int  # 1-based line of the command's name
    source: str  # the invocation as written, name through closing parenthesis

    def words(self) -> list[str]:
        return [a.text for a in self.args]

    @property
    def legacy_quotes(self) -> bool:
        """A quote inside an unquoted argument (``a"b c"``): CMake's legacy form, where a quoted run
        inside a word may hold spaces and parentheses. This reader splits such words differently, so a
        command that has one is never handed to CMake from an untrusted tree."""
        return any(not a.quoted and '"' in a.text for a in self.args)


def _skip_bracket(data: str, i: int, eq: str, path: str, line: int) -> int:
    close = "]" + eq + "]"
    end = data.find(close, i)
    if end < 0:
        raise SourceError(f"source: {path}:{line}: unclosed bracket argument or comment")
    return end + len(close)


def _quoted(data: str, i: int, path: str, line: int) -> int:
    """Index just past the closing quote of the quoted argument whose opening quote is at ``i``."""
    j = i + 1
    while j < len(data):
        if data[j] == "\\":
            j += 2
            continue
        if data[j] == '"':
            return j + 1
        j += 1
    raise SourceError(f"source: {path}:{line}: unclosed quoted argument")


def _args(data: str, i: int, path: str, line: int) -> tuple[list[Arg], int]:
    """The arguments from just after the opening parenthesis at ``i - 1`` to its closing one."""
    args: list[Arg] = []
    depth = 0
    word: list[str] = []

    def flush() -> None:
        if word:
            args.append(Arg("".join(word), False))
            word.clear()

    while i < len(data):
        ch = data[i]
        if ch == "#":  # a comment even mid-word, as CMake reads it (``b#c)`` is ``b`` and a comment)
            flush()
            m = _BRACKET_OPEN.match(data, i + 1)
            i = _skip_bracket(data, m.end(), m.group(1), path, line) if m else data.find("\n", i) % (len(data) + 1)
            continue
        if ch == '"' and not word:
            end = _quoted(data, i, path, line)
            args.append(Arg(data[i + 1 : end - 1], True))
            i = end
            continue
        if ch == "[" and not word and (m := _BRACKET_OPEN.match(data, i)):
            end = _skip_bracket(data, m.end(), m.group(1), path, line)
            args.append(Arg(data[m.end() : end - len(m.group(1)) - 2], True))
            i = end
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                flush()
                return args, i + 1
            depth -= 1
        if ch.isspace():
            flush()
        elif ch == "\\" and i + 1 < len(data):
            word.append(data[i : i + 2])
            i += 2
            continue
        else:
            word.append(ch)
        i += 1
    raise SourceError(f"source: {path}:{line}: unclosed parenthesis")


def commands(data: bytes, path: str) -> list[Command]:
    """Every command invocation in a CMake file, in order, with its line."""
    if len(data) > MAX_FILE_BYTES:
        raise SourceError(f"source: {path}: {len(data)} bytes, over the {MAX_FILE_BYTES} a CMake file may have")
    text = data.decode("utf-8", "replace")
    out: list[Command] = []
    i = 0
    seen, line = 0, 1  # line of index ``seen``, counted forward only

    def line_of(pos: int) -> int:
        nonlocal seen, line
        line += text.count("\n", seen, pos)
        seen = pos
        return line

    while i < len(text):
        ch = text[i]
        if ch == "#":
            m = _BRACKET_OPEN.match(text, i + 1)
            at = line_of(i)
            i = _skip_bracket(text, m.end(), m.group(1), path, at) if m else text.find("\n", i) % (len(text) + 1)
            continue
        m = _IDENT.match(text, i) if (ch.isalpha() or ch == "_") else None
        if not m:
            i += 1
            continue
        j = m.end()
        while j < len(text) and text[j] in " \t":
            j += 1
        if j >= len(text) or text[j] != "(":
            i = m.end()
            continue
        at = line_of(i)
        args, end = _args(text, j + 1, path, at)
        out.append(Command(m.group(0).lower(), tuple(args), at, text[i:end]))
        if len(out) > MAX_COMMANDS:
            raise SourceError(f"source: {path}: more than {MAX_COMMANDS} commands")
        i = end
    return out

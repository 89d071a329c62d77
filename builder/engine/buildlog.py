"""Reading BuildKit's plain progress log: which steps ran and which came from cache.

Used by the benchmark and the tests to count RUN steps that executed (a cache hit prints
``#N CACHED``; a step that ran prints ``#N DONE`` without it).

BuildKit shares in-flight work between concurrent builds on one engine, and a build's plain log
can open with other builds' steps (seen here: another build's ``[os-packages 2/2] RUN ... DONE``
ahead of this build's own cached one). A build runs nothing of its own before it has read its
Dockerfile, so what the log shows before ``[internal] load build definition`` is not this build's
and is left out. A step this build joined in another build that ignores the cache (``--no-cache``)
runs for it and is counted as run, rightly: it was not taken from the cache (docs/fast-rebuilds.md,
"Concurrent builds and the cache")."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

_HEADER = re.compile(r"^#(\d+) \[(?P<stage>[^\]]+)\] (?P<instruction>[A-Z]+)\b(?P<rest>.*)$")


@dataclass(frozen=True)
class Step:
    stage: str  # e.g. "build 3/4"
    instruction: str  # RUN, COPY, FROM, ...
    text: str
    cached: bool
    done: bool
    seconds: float | None = None  # from `#N DONE X.Ys`

    @property
    def command(self) -> str:
        return self.text

    @property
    def ran(self) -> bool:
        return self.done and not self.cached


_OWN_START = re.compile(r"^#\d+ \[internal\] load build definition\b", re.M)


def steps(log: str) -> list[Step]:
    start = _OWN_START.search(log)
    if start:
        log = log[start.start() :]
    heads: dict[str, tuple[str, str, str]] = {}
    cached: set[str] = set()
    done: dict[str, float | None] = {}
    for line in log.splitlines():
        m = _HEADER.match(line)
        if m:
            heads.setdefault(m.group(1), (m.group("stage"), m.group("instruction"), m.group("rest").strip()))
            continue
        m = re.match(r"^#(\d+) (CACHED|DONE\b)(?: ([\d.]+)s)?", line)
        if m:
            if m.group(2) == "CACHED":
                cached.add(m.group(1))
            else:
                done[m.group(1)] = float(m.group(3)) if m.group(3) else None
    return [
        Step(stage, instr, text, n in cached, n in done or n in cached, done.get(n))
        for n, (stage, instr, text) in sorted(heads.items(), key=lambda kv: int(kv[0]))
    ]


def ran(log: str, instruction: str = "RUN") -> list[Step]:
    return [s for s in steps(log) if s.instruction == instruction and s.ran]


# --- the log as a reader sees it (DockerEngine.build relays each line through a Relay) ------------

# Docker's words when a container or build runs an image of another platform than the engine's
# (moby, daemon/create.go; the CLI prints each daemon warning as "WARNING: <it>"), e.g.
# "WARNING: The requested image's platform (linux/arm64) does not match the detected host platform
# (linux/amd64/v4) and no specific platform was requested". The one place that reads it: the tool
# says what it means once, in its own words. The match is anchored and narrow (BuildKit's step
# prefix "#N 1.234 " allowed): any other warning is relayed as the engine wrote it.
_FOREIGN_PLATFORM = re.compile(
    r"^(?:#\d+ (?:\d+\.\d+ )?)?WARNING: The requested image's platform \((?P<image>[a-z0-9/]+)\) does not "
    r"match the detected host platform \((?P<host>[a-z0-9/]+)\) and no specific platform was requested$"
)
_STEP_LINE = re.compile(r"^#(\d+) (.*)$")
_STEP_END = re.compile(r"^(DONE\b|CACHED$|CANCELED\b|ERROR\b)")
_FLAGS = re.compile(r"(?<=RUN )(?:--(?:mount|network|security)=\S+\s+)+")
HEADER_CHARS = 120  # a step's header in its one line, cut (the whole log is in build.log)


def foreign_platform(line: str) -> tuple[str, str] | None:
    """(image platform, host platform) when ``line`` is Docker's foreign-platform warning."""
    m = _FOREIGN_PLATFORM.match(line.strip())
    return (m.group("image"), m.group("host")) if m else None


class Relay:
    """BuildKit's plain progress log, line by line, as the operator reads it (build.log keeps it
    whole). ``plain`` (stderr is not a terminal: a CI log, a pipe, ``| tee``): one line per step
    when it ends (``#12 [build 2/9] RUN ... DONE 4.2s``, ``CACHED``, ``ERROR: ...``), no step
    output and none of the blank lines BuildKit puts between steps; lines outside a step (the
    error summary BuildKit prints on a failure, its warnings) as they come. On a terminal, every
    line as it comes. Either way Docker's foreign-platform warning is said once, in the tool's words."""

    def __init__(self, echo: Callable[[str], None], plain: bool) -> None:
        self._echo, self._plain = echo, plain
        self._headers: dict[str, str] = {}
        self._said_foreign = False

    def __call__(self, line: str) -> None:
        foreign = foreign_platform(line)
        if foreign:
            if not self._said_foreign:
                self._said_foreign = True
                image, host = foreign
                self._echo(f"note: {image} runs under QEMU here (the engine's host is {host}): slower than native")
            return
        if not self._plain:
            self._echo(line)
            return
        if not line.strip():
            return
        m = _STEP_LINE.match(line)
        if m is None:
            self._echo(line)
            return
        number, rest = m.groups()
        if number not in self._headers:
            self._headers[number] = rest  # a step's first line is its name; the rest is its output
        elif _STEP_END.match(rest):
            header = _FLAGS.sub("", self._headers[number])  # RUN's mounts say little in one line
            cut = header if len(header) <= HEADER_CHARS else header[: HEADER_CHARS - 3] + "..."
            self._echo(f"#{number} {cut} {rest}")

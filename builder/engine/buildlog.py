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

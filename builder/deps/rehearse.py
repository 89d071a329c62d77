"""`build lock --target T --rehearse`: resolve T's lock inputs against PyPI alone.

The CI machines reach PyPI but not the PyTorch or FlashInfer indexes, so the real cu129 lock can
only be made elsewhere. The rehearsal runs the same resolver on the same inputs (the matrix's
pins and overrides, the source's requirement files at the pinned commit: from git, or from the
PyPI sdist whose _version.py names that commit), with each pin that lives only on another index
substituted (a local build such as torch 2.13.0+cu129 by PyPI's 2.13.0) or left out, every
substitution listed. Then it reports every distribution of another CUDA major: allowed with the
reason the matrix gives (cuda.other_major), brought in only by a substitute (PyPI's torch is a
CUDA 13 build; the real +cu129 one does not bring these), or a failure. It writes nothing under
locks/: its report goes to artifacts/<target>/rehearsal/.
"""

from __future__ import annotations

import json
import re
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path

from builder.config import contract
from builder.config.cudamajor import cuda_major_of
from builder.config.matrix import Target
from builder.deps import lock
from builder.deps.lock import LockInputs, normalize
from builder.errors import SourceError, Unreachable
from builder.fsutil import atomic_write
from builder.source import pinned as source
from builder.source.sdist import sdist_source

PYPI = "https://pypi.org/simple"
_PIN = re.compile(
    r"^(?P<lead>\s*)(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?P<extras>\[[^\]]*\])?\s*==\s*(?P<version>[^\s;#]+)"
)


@dataclass(frozen=True)
class Substitution:
    kind: str
    name: str
    wanted: str
    used: str | None  # None: left out
    why: str

    def line(self) -> str:
        return (
            f"{self.kind}: {self.name}=={self.wanted} -> "
            + (f"{self.name}=={self.used}" if self.used else "left out")
            + f" ({self.why})"
        )


@dataclass(frozen=True)
class Finding:
    kind: str
    name: str
    version: str
    major: int
    verdict: str  # "allowed", "substitute", "FAIL"
    why: str

    def line(self) -> str:
        return f"{self.verdict:<10} {self.kind}: {self.name} {self.version} (CUDA {self.major}): {self.why}"


@dataclass
class Rehearsal:
    target: str
    source: str
    substitutions: list[Substitution] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    entries: dict[str, int] = field(default_factory=dict)
    report: Path | None = None

    @property
    def ok(self) -> bool:
        return not any(f.verdict == "FAIL" for f in self.findings)

    def to_json(self) -> dict:
        return {
            "target": self.target,
            "rehearsal": True,
            "ok": self.ok,
            "source": self.source,
            "entries": self.entries,
            "substitutions": [s.__dict__ for s in self.substitutions],
            "other_cuda_major": [f.__dict__ for f in self.findings],
            "report": str(self.report) if self.report else None,
        }


class _PyPI:
    """Which versions PyPI has, one JSON request per project."""

    def __init__(self) -> None:
        self._releases: dict[str, set[str]] = {}

    def versions(self, name: str) -> set[str]:
        key = normalize(name)
        if key not in self._releases:
            try:
                with urllib.request.urlopen(f"https://pypi.org/pypi/{key}/json", timeout=60) as resp:  # noqa: S310
                    self._releases[key] = set(json.load(resp).get("releases", {}))
            except OSError:
                self._releases[key] = set()
        return self._releases[key]


def _substitute(text: str, kind: str, pypi: _PyPI, other: tuple[str, ...], out: list[Substitution]) -> str:
    lines = []
    for line in text.splitlines():
        m = _PIN.match(line)
        if not m or m.group("version") in pypi.versions(m.group("name")):
            lines.append(line)
            continue
        name, version = m.group("name"), m.group("version")
        public = version.split("+", 1)[0]
        where = ", ".join(other) or "another index"
        if "+" in version and public in pypi.versions(name):
            out.append(
                Substitution(
                    kind,
                    name,
                    version,
                    public,
                    f"the +{version.split('+', 1)[1]} build lives on {where}; PyPI's {public} stands in",
                )
            )
            lines.append(line[: m.start("version")] + public + line[m.end("version") :])
        else:
            out.append(Substitution(kind, name, version, None, f"not on PyPI; it lives on {where}"))
            lines.append(f"# left out by the rehearsal: {line.strip()}")
    return "\n".join(lines) + "\n"


def _via(body: str) -> dict[str, tuple[str, set[str]]]:
    """name -> (version, what requires it) from a uv lock body's annotations."""
    entries: dict[str, tuple[str, set[str]]] = {}
    current = None
    for line in body.splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
        if m:
            current = normalize(m.group(1))
            entries[current] = (m.group(2).rstrip(" \\;"), set())
        elif current and line.strip().startswith("# via"):
            for part in line.strip().removeprefix("# via").split(","):
                entries[current][1].add(part.strip())
    return entries


def _only_via(name: str, entries: dict, substituted: set[str], seen: set[str] | None = None) -> bool:
    """True when every path that brings ``name`` in runs through a substituted package."""
    seen = (seen or set()) | {name}
    via = entries.get(name, ("", set()))[1]
    if not via:
        return False
    for parent in via:
        p = normalize(parent)
        if p in substituted:
            continue
        if parent.startswith("-") or p in seen or p not in entries or not _only_via(p, entries, substituted, seen):
            return False
    return True


def _readable(target: Target):
    """The pinned source from git, else its PyPI sdist (tied to the pin by _version.py)."""
    try:
        return source.fetch(target.source), f"git {target.source.url} @ {target.source.commit}"
    except (SourceError, Unreachable) as exc:
        sdist = sdist_source(target.source)
        return (
            sdist,
            f"PyPI sdist {target.source.package}=={target.source.version} (git unreachable: {exc.message[:80]})",
        )


def rehearse(target: Target, root: Path) -> Rehearsal:
    readable, origin = _readable(target)
    pypi = _PyPI()
    other = tuple(i for i in target.lock_indexes() if i != PYPI)
    result = Rehearsal(target.name, origin)
    substituted: set[str] = set()
    out_dir = contract.ARTIFACTS_DIR / target.name / "rehearsal"
    out_dir = root / out_dir
    for kind in ("runtime", "build"):
        real: LockInputs = lock.inputs(target, readable, kind)
        subs: list[Substitution] = []
        files = {
            rel: _substitute(data.decode("utf-8"), kind, pypi, other, subs).encode() for rel, data in real.files.items()
        }
        result.substitutions += subs
        substituted |= {normalize(s.name) for s in subs if s.used}
        body = lock.resolve(replace(real, files=files, indexes=(PYPI,)), f"{target.name} (rehearsal)")
        atomic_write(out_dir / f"{kind}.lock.txt", "# REHEARSAL against PyPI only; not a lock.\n" + body)
        entries = _via(body)
        result.entries[kind] = len(entries)
        for name, (version, _) in sorted(entries.items()):
            major = cuda_major_of(name, version)
            if major is None or major == target.cuda.major:
                continue
            reason = target.cuda.other_major.get(name) or {
                normalize(k): v for k, v in target.cuda.other_major.items()
            }.get(name)
            if reason:
                verdict, why = "allowed", reason
            elif _only_via(name, entries, substituted):
                verdict, why = (
                    "substitute",
                    (
                        "brought in only by a substituted package ("
                        + ", ".join(sorted(substituted))
                        + "); the real build's does not"
                    ),
                )
            else:
                verdict, why = (
                    "FAIL",
                    ("no reason in cuda.other_major; brought in by " + ", ".join(sorted(entries[name][1]))),
                )
            result.findings.append(Finding(kind, name, version, major, verdict, why))
    report = out_dir / "report.json"
    result.report = report
    atomic_write(report, json.dumps(result.to_json(), indent=2) + "\n")
    return result

"""What one build tells its caller (``BuildOutcome``): the image it recorded, whether it changed or
was up to date, what the compile cache did, and, for a target built into an image index, each
platform's own outcome. Its own module so that the index assembly (publishindex.py) and the build
(build.py) share one type without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from builder.dockerfile import compilecache


@dataclass
class BuildOutcome:
    target: str
    image: str
    digest: str
    size: int | None
    seconds: float
    record: Path
    log: Path | None
    changed: bool = True
    up_to_date: bool = False
    cache: compilecache.Stats | None = None
    gpu: dict | None = None  # the record's gpu (derived driver floor, coverage): the summary shows it
    platform: str | None = None  # one platform of an image index
    platforms: list[BuildOutcome] = field(default_factory=list)  # an image index's: each platform's build

"""BuildKit's synced copies of the builds' local inputs, made during this run, dropped as it goes.

The tool hands each distinct set of build inputs to BuildKit under a name of its own
(builder/engine/localsync.py), and BuildKit keeps a copy of them per name (a ``source.local``
record: the smoke's default context is about 190 MB) with nothing to collect it while its GC is
off. The suite builds a hundred or so distinct sets; kept, their copies took about 20 GB in one
run on this machine. After each test file the copies created since this process's session began
that no build is using are pruned by id (an in-use copy is left: BuildKit does not prune it); a
copy made before the run, or by a build that is running, is never touched. A build on this engine
from outside the suite during the run could lose its copy too; its next build syncs it again.
"""

from __future__ import annotations

import datetime as dt
import re
import subprocess

WORTH_DROPPING = 8  # fewer copies than this made since the last drop: left for the next file's teardown


def _created(block: str) -> dt.datetime | None:
    found = re.search(r"^Created at:\s+(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})", block, re.M)
    return dt.datetime.fromisoformat(found.group(1)).replace(tzinfo=dt.timezone.utc) if found else None


def made_since(since: dt.datetime) -> list[str]:
    """The ids of the ``source.local`` records created at or after ``since`` (second precision)."""
    listing = subprocess.run(
        ["docker", "buildx", "du", "--verbose", "--filter", "type=source.local"], capture_output=True, text=True
    ).stdout
    ids = []
    for block in listing.split("\n\n"):
        record, created = re.search(r"^ID:\s+(\S+)", block, re.M), _created(block)
        if record and created and created >= since.replace(microsecond=0):
            ids.append(record.group(1))
    return ids


def drop_made_since(since: dt.datetime) -> None:
    ids = made_since(since)
    if len(ids) < WORTH_DROPPING:
        return
    for record in ids:  # one prune each: buildx refuses a second value for one filter key
        subprocess.run(["docker", "buildx", "prune", "-af", "--filter", f"id={record}"], capture_output=True)

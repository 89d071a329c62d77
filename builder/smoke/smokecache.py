"""The smoke's bases, made once per machine: one maker at a time.

`build smoke-init` makes its base images once per machine and records their pinned references in
a state file under `cache_dir()` (`smoke-bases.yaml`, `smoke-bases-arm64.yaml`), beside the
download caches it makes them from. Two smoke-init processes starting at once on a fresh machine
(two pytest workers) would both fill the same download caches and both write the state: so each
state file has a lock file beside it, flock(2)ed around "read the state, make what is missing,
write the state". The second process waits, then finds the first one's state and reuses it.

The kernel drops a flock when its holder dies, however it dies, so a crashed run never wedges the
next one; the state is written atomically, and only after everything it names was pushed, so the
next run reads either the old state or the new one and makes again what a crash left unfinished.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Callable, Iterator

import yaml

from builder import log
from builder.fsutil import atomic_write, cache_dir


@contextlib.contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """flock(2) on <cache>/<name>.lock, waiting (and saying so) while another process holds it."""
    path = cache_dir() / f"{name}.lock"
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info(f"    another smoke-init on this machine is making the bases; waiting for it ({path})")
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def made_once(
    state_name: str,
    registry: str,
    recipe: str,
    usable: Callable[[dict[str, str]], bool],
    make: Callable[[], dict[str, str]],
) -> dict[str, str]:
    """The references <cache>/<state_name> records for ``registry`` when they come from ``recipe``
    and are still ``usable``; else what ``make()`` returns, recorded. All under the state's lock."""
    state = cache_dir() / state_name
    with machine_lock(state_name):
        known = yaml.safe_load(state.read_text()) if state.exists() else {}
        known = known if isinstance(known, dict) else {}
        mine = known.get(registry)
        if isinstance(mine, dict) and mine.get("recipe") == recipe and isinstance(mine.get("refs"), dict):
            if usable(mine["refs"]):
                return dict(mine["refs"])
        refs = make()
        known[registry] = {"recipe": recipe, "refs": refs}
        atomic_write(state, yaml.safe_dump(known))
        return refs

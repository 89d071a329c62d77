"""Signals held back for a moment: a SIGINT or SIGTERM that lands while a container is being
created would leave it behind (its id never came back), so such short critical sections defer
them and re-raise as soon as the section is over, when cleanup knows what to clean."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Run the block with SIGINT/SIGTERM recorded instead of raised; raise KeyboardInterrupt after.

    Only the main thread can swap handlers; elsewhere (builds of several targets at once) the block
    runs as it is, and the stale-container sweep at the next start is the safety net."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: pending.append(signum)) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if pending:
        raise KeyboardInterrupt

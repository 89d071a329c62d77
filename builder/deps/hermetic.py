"""The environment pip and uv run in for this tool: the machine's own configuration ignored.

Locks are resolved (uv) and wheelhouses downloaded (pip) from the matrix's indexes alone, whatever
the machine's pip.conf, uv.toml or PIP_*/UV_* variables say; only trust settings (certificates,
timeouts) are kept, because they say how to reach an index, not which one.
"""

from __future__ import annotations

import os

from builder.errors import LockError


def hermetic_env() -> dict[str, str]:
    """The environment pip and uv run in: the machine's pip/uv config and index settings ignored."""
    keep = {"PIP_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_DISABLE_PIP_VERSION_CHECK"}
    env = {k: v for k, v in os.environ.items() if not (k.startswith("PIP_") or k.startswith("UV_")) or k in keep}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_NO_INPUT"] = "1"
    env["UV_NO_CONFIG"] = "1"
    return env


def uv_binary() -> str:
    try:
        from uv import find_uv_bin
    except ImportError:  # pragma: no cover - uv is a dependency of this tool
        raise LockError("the uv package is missing from this tool's environment; reinstall the tool") from None
    return find_uv_bin()

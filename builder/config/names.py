"""Distribution names compared the one way PEP 503 says: every comparison in the tool uses this."""

from __future__ import annotations

import re


def normalize(name: str) -> str:
    """PEP 503 name normalization: runs of -, _ and . become -, lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()

"""The "Launch verification" section `build accept --record DIR` adds to the decision record
`build doctor --record` wrote: the recipe's launch command next to what the server reports, the
smoke results, the prefix-caching test, the agent results, the load step reached and the guide's
decision signs where measured. Written through the record's one writer (builder/host/doctor.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from builder.accept.model import Step
from builder.accept.report import server_line
from builder.errors import ConfigError


def _step(doc: dict, step: Step) -> dict[str, Any] | None:
    found = next((s for s in doc["steps"] if s["step"] == step.value), None)
    if found is None:
        return None
    return {"outcome": found["outcome"], "reason": found["reason"], "cause": found["cause"]}


def _comparison(doc: dict, expected) -> list[dict[str, Any]]:
    """The recipe's launch against what the server reports, one row per fact both can say."""
    server = doc["launch"].get("server") or {}
    rows = []
    if expected is not None:
        rows.append({"what": "model", "recipe": expected.name, "server": server.get("models")})
        rows.append(
            {"what": "enable_prefix_caching", "recipe": expected.prefix_caching, "server": server.get("prefix_caching")}
        )
        rows.append({"what": "max_model_len", "recipe": expected.max_model_len, "server": server.get("max_model_len")})
    rows.append({"what": "vLLM version", "recipe": doc.get("expected_version"), "server": server.get("version")})
    return rows


def section(doc: dict, report_dir: Path, expected) -> dict[str, Any]:
    """The record's `launch` entry for one run (JSON-ready)."""
    return {
        "created": doc["created"],
        "endpoint": doc["endpoint"],
        "report": str(report_dir),
        "outcome": doc["outcome"],
        "launch_command": doc["launch"].get("recipe"),
        "server_reports": server_line(doc["launch"].get("server") or {}),
        "comparison": _comparison(doc, expected),
        "smoke": {s.name.lower(): _step(doc, s) for s in (Step.LOADED, Step.SHORT, Step.CONTEXT)},
        "prefix_caching": _step(doc, Step.PREFIX),
        "concurrency": _step(doc, Step.CONCURRENCY),
        "agent": _step(doc, Step.AGENT),
        "cross_node": _step(doc, Step.CROSS_NODE),
        "load_step_reached": doc["reached"],
        "signs": doc["signs"],
    }


def record_file(path: Path) -> Path:
    """The decision record --record names: a record's .json, or the newest one in a directory."""
    if path.is_file():
        return path
    if not path.is_dir():
        raise ConfigError(f"--record {path}: no such directory (give the one `build doctor --record` wrote into)")
    found = sorted(path.glob("k3-decision-*.json"), key=lambda p: (p.stat().st_mtime, p.name))
    if not found:
        raise ConfigError(f"--record {path}: no decision record in it (run `build doctor --record {path}` first)")
    return found[-1]

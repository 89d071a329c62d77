"""The "Launch verification" section `build accept --record DIR` adds to the decision record
`build doctor --record` wrote: the recipe's launch command next to what the server reports, the
smoke results, the prefix-caching test, the agent results, the load step reached and the guide's
decision signs where measured. Written through the record's one writer (builder/host/doctor.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from builder.accept.model import RunOutcome, Step
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
    version = doc.get("expected_version")
    source = f" ({doc['expected_version_from']})" if doc.get("expected_version_from") else ""
    expected_version = f"{version}{source}" if version else NO_VERSION
    rows.append({"what": "vLLM version", "recipe": expected_version, "server": server.get("version")})
    return rows


NO_VERSION = "not known: no --target, --image or record label names it"


def _prefix_numbers(doc: dict) -> dict[str, Any]:
    """Step 4's numbers the decision weighs: the TTFT ratio and the /metrics hits per request."""
    found = next((s for s in doc["steps"] if s["step"] == Step.PREFIX.value), None)
    m = (found or {}).get("measured") or {}
    return {
        "ttft_second_over_first": m.get("ttft_second_over_first"),
        "reuse_ratio": m.get("reuse_ratio"),
        "changed_at_token": m.get("changed_at_token"),
        "block_size": m.get("block_size"),
        "hits_delta": {k: (m.get(k) or {}).get("hits_delta") for k in ("first", "second", "changed")},
    }


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
        "prefix_numbers": _prefix_numbers(doc),
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


def load_record(path: Path) -> tuple[Path, dict]:
    """--record's file and its document, checked to be a decision record that renders: bad input
    is refused before step 1, never after a whole run."""
    from builder.host.doctor import load_decision

    found = record_file(path)
    return found, load_decision(found, "--record")


def record_version(doc: dict) -> str | None:
    """The vLLM version the record's image labels carry, or None."""
    from builder.config import contract

    labels = (doc.get("verification") or {}).get("labels") if isinstance(doc.get("verification"), dict) else None
    return labels.get(contract.OCI_VERSION) if isinstance(labels, dict) else None


def exit_code(doc: dict) -> int:
    """1 when a step failed, else 0 (n/a allowed)."""
    return 1 if RunOutcome(doc["outcome"]) is RunOutcome.FAIL else 0

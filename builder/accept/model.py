"""The values `build accept` decides on: step outcomes, the causes it names, the log findings, and
the typed, frozen records of a step and of a run."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Outcome(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    NA = "n/a"


class RunOutcome(str, enum.Enum):
    """A run's outcome: every step passed (n/a allowed), one failed, or it stopped before the end."""

    PASS = "pass"
    FAIL = "fail"
    INCOMPLETE = "incomplete"


class Step(int, enum.Enum):
    """The guide's steps, in its order (the number is the row)."""

    LOADED = 1
    SHORT = 2
    CONTEXT = 3
    PREFIX = 4
    CONCURRENCY = 5
    AGENT = 6
    CROSS_NODE = 7

    @property
    def title(self) -> str:
        return _TITLES[self]


_TITLES = {
    Step.LOADED: "loaded, no traffic",
    Step.SHORT: "short request",
    Step.CONTEXT: "target context",
    Step.PREFIX: "prefix caching",
    Step.CONCURRENCY: "concurrency",
    Step.AGENT: "agent",
    Step.CROSS_NODE: "cross-node",
}


class ReuseCause(str, enum.Enum):
    """Why prefix caching brought no reuse: the guide's three causes, and what else can be said."""

    FLAG_MISSING = "flag-missing"  # cache_config_info says enable_prefix_caching is off in the process
    PREFIXES_DIFFER = "prefixes-differ"  # /tokenize shows the two prompts part before the shared end
    EVICTED = "evicted"  # flag on, prefixes identical, nothing reused: the state was dropped
    UNKNOWN = "unknown"  # no cache_config_info to tell the flag (not a vLLM /metrics)
    REUSE_AFTER_CHANGE = "reuse-after-change"  # a one-token change at the start was still reused


class LogKind(str, enum.Enum):
    OOM = "oom"
    NCCL = "nccl"
    DRIVER = "driver"  # the original error of an r575 host: CUDA/driver mismatch, no kernel image


class OomPhase(str, enum.Enum):
    WEIGHTS_LOADING = "weights-loading"
    PREFILL = "prefill"
    DECODE = "decode"
    GROWING_CONCURRENCY = "growing-concurrency"


class NcclKind(str, enum.Enum):
    """NCCL's result codes as its log names them; each points to topology, RDMA and environment."""

    SYSTEM = "system-error"
    INTERNAL = "internal-error"
    REMOTE = "remote-error"
    CUDA = "unhandled-cuda-error"
    INVALID_USAGE = "invalid-usage"
    TIMEOUT = "timeout"
    WARNING = "warning"


@dataclass(frozen=True)
class LogFinding:
    kind: LogKind
    line: str
    phase: OomPhase | None = None
    nccl: NcclKind | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "phase": self.phase.value if self.phase else None,
            "nccl": self.nccl.value if self.nccl else None,
            "line": self.line,
        }


@dataclass(frozen=True)
class StepResult:
    """One row: the step, its outcome, the reason in one line, and what was measured."""

    step: Step
    outcome: Outcome
    reason: str
    measured: dict[str, Any] = field(default_factory=dict)
    cause: ReuseCause | None = None
    findings: tuple[LogFinding, ...] = ()
    seconds: float = 0.0
    ran: bool = True  # False: not run, the load stopped rising at an earlier failing step
    server_gone: bool = False  # the server stopped answering during the step
    log_missing: str | None = None  # why the server log after this step was not read (None: read, or none given)
    gpu: str | None = None  # the GPU state after this step, one line (or why there is none)

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step.value,
            "name": self.step.title,
            "outcome": self.outcome.value,
            "reason": self.reason,
            "cause": self.cause.value if self.cause else None,
            "measured": self.measured,
            "log_findings": [f.to_json() for f in self.findings],
            "seconds": round(self.seconds, 3),
            "ran": self.ran,
            "server_gone": self.server_gone,
            "server_log": f"n/a: {self.log_missing}" if self.log_missing else None,
            "gpu": self.gpu,
        }


def not_reached(step: Step, failed: Step) -> StepResult:
    reason = f"not run: load stops rising at the first failing step ({failed.value})"
    return StepResult(step, Outcome.NA, reason, ran=False)

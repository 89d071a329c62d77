"""The server's log read for the faults the guide names: an OOM classified by the phase it hit
(loading the weights, prefill, decode, growing concurrency), NCCL errors by NCCL's own result
codes (each points to topology, RDMA and environment), and the r575 host's original error (a
CUDA/driver mismatch) recurring."""

from __future__ import annotations

import re

from builder.accept.model import LogFinding, LogKind, NcclKind, OomPhase, Step

_OOM = re.compile(
    r"CUDA out of memory|OutOfMemoryError|out of memory|Cannot allocate memory|CUBLAS_STATUS_ALLOC_FAILED"
    r"|No available memory for the cache blocks|larger than the available KV cache memory"
    r"|Insufficient memory|oom-kill|Killed process",
    re.IGNORECASE,
)
# Words of the line or the lines just before an OOM that place it, most specific first.
_PHASE_HINTS = (
    (
        OomPhase.WEIGHTS_LOADING,
        re.compile(
            r"load(ing)?[_ ](model|weights)|weight loading|model_loader|safetensors"
            r"|KV cache memory|cache blocks|profile_run|determine_available_memory",
            re.I,
        ),
    ),
    (OomPhase.PREFILL, re.compile(r"prefill|chunked", re.I)),
    (OomPhase.DECODE, re.compile(r"decode|sampler|sampling", re.I)),
)
_NCCL = (
    (NcclKind.SYSTEM, re.compile(r"ncclSystemError|unhandled system error", re.I)),
    (NcclKind.INTERNAL, re.compile(r"ncclInternalError|internal error - please report", re.I)),
    (NcclKind.REMOTE, re.compile(r"ncclRemoteError|remote process exited|remote error", re.I)),
    (NcclKind.CUDA, re.compile(r"ncclUnhandledCudaError|unhandled cuda error", re.I)),
    (NcclKind.INVALID_USAGE, re.compile(r"ncclInvalidUsage|ncclInvalidArgument|invalid usage", re.I)),
    (NcclKind.TIMEOUT, re.compile(r"Watchdog caught collective operation timeout|NCCL.*timed? ?out", re.I)),
    (NcclKind.WARNING, re.compile(r"NCCL WARN|NCCL error", re.I)),
)
_DRIVER = re.compile(
    r"CUDA driver version is insufficient|forward compatibility was attempted on non supported HW"
    r"|no kernel image is available|Driver/library version mismatch|unsupported toolchain"
    r"|cudaErrorUnsupportedPtxVersion|CUDA_ERROR_UNSUPPORTED_PTX_VERSION|system has unsupported display driver",
    re.IGNORECASE,
)
# An OOM pattern counts only on a line that reports a failure: advice ("lower max_num_seqs to avoid
# running out of memory") is not an OOM.
_FAILURE = re.compile(r"error|exception|killed|fatal|traceback", re.IGNORECASE)
HINT_LINES = 20  # how far back a phase hint counts


def _oom_phase(lines: list[str], at: int, step: Step | None, first_token: bool | None) -> OomPhase:
    """The phase of the OOM at ``lines[at]``: a hint in the nearby lines, else the step it hit."""
    for phase, pattern in _PHASE_HINTS:
        if any(pattern.search(line) for line in lines[max(0, at - HINT_LINES) : at + 1]):
            return phase
    if step is None or step == Step.LOADED:
        return OomPhase.WEIGHTS_LOADING
    if step == Step.CONCURRENCY:
        return OomPhase.GROWING_CONCURRENCY
    return OomPhase.DECODE if first_token else OomPhase.PREFILL


def _nccl_kind(line: str) -> NcclKind | None:
    return next((kind for kind, pattern in _NCCL if pattern.search(line)), None)


def classify(text: str, step: Step | None = None, first_token: bool | None = None) -> tuple[LogFinding, ...]:
    """Every OOM, NCCL and driver line of ``text`` as a finding, in order. ``step`` is the step the
    log was captured after (None: before any request, i.e. the server's start), ``first_token``
    whether that step's failing request had produced a token (decode) or not (prefill)."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        short = line.strip()[:300]
        if _DRIVER.search(line):
            found.append(LogFinding(LogKind.DRIVER, short))
        elif (kind := _nccl_kind(line)) is not None:
            found.append(LogFinding(LogKind.NCCL, short, nccl=kind))
        elif _OOM.search(line) and _FAILURE.search(line):
            found.append(LogFinding(LogKind.OOM, short, phase=_oom_phase(lines, i, step, first_token)))
    return tuple(found)


NCCL_ADVICE = (
    "a NCCL error points to the topology (`nvidia-smi topo -m`), RDMA (`ibv_devinfo`, the InfiniBand "
    "ports in `build evidence`) and the environment (NCCL_* variables); rerun with NCCL_DEBUG=INFO"
)

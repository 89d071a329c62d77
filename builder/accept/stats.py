"""Percentiles and the per-level summary of a concurrency run (no numpy on an operator's host)."""

from __future__ import annotations

import math


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between the closest ranks (numpy's default); None of none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def levels(maximum: int) -> list[int]:
    """1, 2, 4, ... up to ``maximum``, which is always the last level."""
    out, n = [], 1
    while n < maximum:
        out.append(n)
        n *= 2
    return out + [maximum]


def summary(ttfts: list[float], latencies: list[float], tokens: int, wall: float, errors: int) -> dict:
    """One concurrency level's row: p50/p95 of TTFT and latency (seconds), tokens/s, errors."""

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 4)

    return {
        "requests": len(latencies) + errors,
        "errors": errors,
        "ttft_p50": r(percentile(ttfts, 50)),
        "ttft_p95": r(percentile(ttfts, 95)),
        "latency_p50": r(percentile(latencies, 50)),
        "latency_p95": r(percentile(latencies, 95)),
        "tokens_per_s": round(tokens / wall, 2) if wall > 0 else None,
        "completion_tokens": tokens,
    }

"""vLLM's /metrics (Prometheus text format) read as values: the cache configuration the process
really runs with (`vllm:cache_config_info`, its labels) and the prefix-cache counters."""

from __future__ import annotations

import re
from dataclasses import dataclass

# vLLM V1 names (vllm/v1/metrics/loggers.py); older releases exported gpu_prefix_cache_* instead.
HITS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits_total")
QUERIES = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries_total")
CACHE_INFO = "vllm:cache_config_info"

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


def _unescape(value: str) -> str:
    return value.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")


def _labels(text: str) -> tuple[tuple[str, str], ...] | None:
    found, pos = [], 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if not m:
            return None
        found.append((m.group(1), _unescape(m.group(2))))
        pos = m.end()
    return tuple(found)


def parse(text: str) -> list[Sample]:
    """Every sample line; comments and lines that are not samples are skipped, never guessed."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = _labels(m.group(3) or "")
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        if labels is not None:
            samples.append(Sample(m.group(1), labels, value))
    return samples


def total(samples: list[Sample], names: tuple[str, ...]) -> float | None:
    """The sum over every label set of the first of ``names`` present (several engines, one each)."""
    for name in names:
        values = [s.value for s in samples if s.name == name]
        if values:
            return sum(values)
    return None


def cache_config(samples: list[Sample]) -> dict[str, str] | None:
    """The labels of `vllm:cache_config_info`, or None when the server exports none."""
    for s in samples:
        if s.name == CACHE_INFO:
            return dict(s.labels)
    return None


def prefix_caching_on(config: dict[str, str] | None) -> bool | None:
    """What the process says about enable_prefix_caching: True, False, or None (not said)."""
    if not config or "enable_prefix_caching" not in config:
        return None
    return config["enable_prefix_caching"].strip().lower() in ("true", "1", "yes")


def block_size(config: dict[str, str] | None) -> int | None:
    try:
        return int(config["block_size"]) if config and config.get("block_size") else None
    except ValueError:
        return None

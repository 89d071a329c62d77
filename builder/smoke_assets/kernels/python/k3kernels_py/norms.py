"""Normalisations in pure Python."""

import math


def mean_square(values):
    values = [float(v) for v in values]
    return sum(v * v for v in values) / len(values) if values else 0.0


def rms_norm(values, eps=1e-6):
    """Each value divided by the root mean square of all of them (RMSNorm without a weight)."""
    scale = 1.0 / math.sqrt(mean_square(values) + eps)
    return [float(v) * scale for v in values]

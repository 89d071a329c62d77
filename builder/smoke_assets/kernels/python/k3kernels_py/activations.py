"""Activations in pure Python; one of them fuses a norm from the sibling module."""

import math

from k3kernels_py.norms import rms_norm


def silu(values):
    return [float(v) / (1.0 + math.exp(-float(v))) for v in values]


def silu_and_norm(values, eps=1e-6):
    return rms_norm(silu(values), eps)

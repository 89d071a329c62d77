"""The smoke's model. Like K3's vision tower on FlashAttention-4's Python kernels, it runs on the
Python tree that k3kernels ships and the CMake install step puts in the wheel as
k3smoke.kernels_py (not imported by k3smoke/__init__.py, as vLLM imports FA4 only when used)."""

from k3smoke import _C
from k3smoke.kernels_py import rms_norm, silu_and_norm


class K3SmokeForConditionalGeneration:
    def __init__(self, eps: float = 1e-6):
        self.eps = eps

    def forward(self, values) -> list:
        """SiLU then RMSNorm of ``values``, scaled back by their compiled RMS."""
        scale = _C.rms([float(v) for v in values])
        return [v * scale for v in silu_and_norm(rms_norm(values, self.eps), self.eps)]

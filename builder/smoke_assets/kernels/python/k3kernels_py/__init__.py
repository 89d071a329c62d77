"""k3kernels' pure-Python kernels (the stand-in for flash-attention's flash_attn/cute tree).

Its modules import each other absolutely, as flash_attn.cute's do: the source that installs this
tree under another name (k3smoke.kernels_py) rewrites those imports on the way.
"""

from k3kernels_py.activations import silu_and_norm
from k3kernels_py.norms import rms_norm

__all__ = ["rms_norm", "silu_and_norm"]

import k3smoke
from k3smoke import _C

print(f"k3smoke {k3smoke.__version__}: rms([3, 4]) = {k3smoke.rms([3, 4]):.4f}, driver {_C.driver_version()}")

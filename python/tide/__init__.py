"""tide: fast optimizer-state offloading for PyTorch training.

The C++ core lives in libtide.so and is reached through its C ABI (include/tide/tide.h) with
ctypes; see tide._lib.
"""

from tide._lib import TideError, driver_info, lib, version

__all__ = ["TideError", "driver_info", "lib", "version"]

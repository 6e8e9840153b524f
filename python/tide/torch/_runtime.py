"""Where tide's optimizer runs: on the GPU with CUDA tensors, or, without a GPU ("CPU mode"),
with CPU tensors over tide's host stand-in driver.

In CPU mode the stand-in plays the GPU: its "device memory" and kernels are host memory and host
code, and its HMM mode lets the model's CPU tensors stand for device memory, so the optimizer
runs the same code path (gradient offload, planner, GPU and CPU subgroups, weight upload) as on a
GPU. Nothing is faster for it; it is there so that the same script runs, and is tested, anywhere.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import sys
import threading

from tide import _lib

_lock = threading.Lock()
_announced = False


def cpu_mode() -> bool:
    """True when tide's optimizer works on CPU tensors over the host stand-in driver."""
    import torch

    return not torch.cuda.is_available()


def ensure_cpu_mode_driver() -> pathlib.Path:
    """Points tide at the stand-in (unless TIDE_CUDA_DRIVER already names a driver), turns on its
    HMM mode, and says so once. Raises RuntimeError when the driver in use is not the stand-in."""
    global _announced
    with _lock:
        driver = os.environ.get("TIDE_CUDA_DRIVER")
        if not driver:
            found = _lib.standin_path()
            if found is None:
                raise RuntimeError(
                    "tide: no GPU, and tide's host stand-in driver (libtide_standin_cuda.so) was "
                    "not found next to libtide.so; build tide (`make`) or set TIDE_CUDA_DRIVER")
            driver = str(found)
            os.environ["TIDE_CUDA_DRIVER"] = driver
        handle = ctypes.CDLL(driver)  # the same handle libtide's dlopen of this path returns
        set_hmm = getattr(handle, "tide_standin_set_hmm", None)
        if set_hmm is None:
            raise RuntimeError(
                f"tide: no GPU, so the model's tensors are CPU tensors, but TIDE_CUDA_DRIVER "
                f"({driver}) is not tide's host stand-in driver, which CPU mode needs")
        set_hmm.argtypes = [ctypes.c_int]
        if set_hmm(1) != 0:
            raise RuntimeError("tide: the stand-in driver refused HMM mode")
        if not _announced:
            _announced = True
            sys.stderr.write(
                "tide: no GPU: running the optimizer on CPU tensors over the host stand-in "
                f"driver ({driver}); GPU subgroups are simulated on the host\n")
            sys.stderr.flush()
        return pathlib.Path(driver)

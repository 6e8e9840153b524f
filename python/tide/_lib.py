"""Loading libtide.so and calling its C ABI.

Where the library is looked for, in order: the file named by TIDE_LIBRARY; the package's own
copy (``tide/lib/libtide.so``, what ``pip install .`` installs); the build tree of a source
checkout (``build/lib/libtide.so``, what ``make`` builds). The host stand-in driver
(``libtide_standin_cuda.so``) ships next to it in both layouts: see standin_path().
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import threading

_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None

TIDE_OK = 0
TIDE_ERROR_INVALID_ARGUMENT = 1


class TideError(RuntimeError):
    """A tide C ABI call failed; the message is tide's own (tide_last_error)."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


def _shipped_libraries() -> list[pathlib.Path]:
    """Where libtide.so ships: the package's own copy, then a source checkout's build tree."""
    return [
        _PACKAGE_DIR / "lib" / "libtide.so",
        _PACKAGE_DIR.parent.parent / "build" / "lib" / "libtide.so",
    ]


def library_candidates() -> list[pathlib.Path]:
    env = os.environ.get("TIDE_LIBRARY")
    if env:
        return [pathlib.Path(env)]
    return _shipped_libraries()


STANDIN_LIBRARY = "libtide_standin_cuda.so"


def standin_path() -> pathlib.Path | None:
    """The host stand-in driver that comes with this tide, or None where there is none.

    It lies next to libtide.so: in the package (``tide/lib/``, what ``pip install .`` installs)
    or in the build tree (``build/lib/``); with TIDE_LIBRARY set, next to that file first. tide
    never loads it by itself: point TIDE_CUDA_DRIVER at it on a machine without libcuda.so.1.
    """
    env = os.environ.get("TIDE_LIBRARY")
    for library in ([pathlib.Path(env)] if env else []) + _shipped_libraries():
        path = library.parent / STANDIN_LIBRARY
        if path.is_file():
            return path
    return None


def lib() -> ctypes.CDLL:
    """The loaded libtide.so (loaded once, RTLD_LOCAL, as PyTorch loads extensions)."""
    global _lib
    with _lock:
        if _lib is None:
            candidates = library_candidates()
            for path in candidates:
                if path.is_file():
                    _lib = _load(path)
                    break
            else:
                tried = ", ".join(str(p) for p in candidates)
                raise TideError(
                    f"libtide.so not found (tried: {tried}). Build it with `make` in the "
                    "source tree, install tide with `pip install .`, or set TIDE_LIBRARY to "
                    "its path."
                )
        return _lib


def _load(path: pathlib.Path) -> ctypes.CDLL:
    where = "TIDE_LIBRARY" if os.environ.get("TIDE_LIBRARY") else "the library"
    try:
        cdll = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)
    except OSError as error:
        raise TideError(f"tide: {where} {path} cannot be loaded: {error}") from None
    try:
        return _declare(cdll)
    except AttributeError:
        raise TideError(f"tide: {where} {path} is not libtide.so (it has no tide_version); "
                        "point TIDE_LIBRARY at tide's build/lib/libtide.so, or unset it") from None


def _declare(cdll: ctypes.CDLL) -> ctypes.CDLL:
    cdll.tide_version.restype = ctypes.c_char_p
    cdll.tide_version.argtypes = []
    cdll.tide_last_error.restype = ctypes.c_char_p
    cdll.tide_last_error.argtypes = []
    cdll.tide_driver_info.restype = ctypes.c_int
    cdll.tide_driver_info.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    cdll.tide_abi_calls.restype = ctypes.c_uint64
    cdll.tide_abi_calls.argtypes = []
    cdll.tide_knob.restype = ctypes.c_int
    cdll.tide_knob.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(KnobValue)]
    cdll.tide_device_memory.restype = ctypes.c_int
    cdll.tide_device_memory.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_size_t),
    ]
    return cdll


class Versioned(ctypes.Structure):
    """A versioned struct of tide.h (its first field: size_t struct_size, see the header's top):
    made with struct_size set to this mirror's size, as its C _default() initializer does."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(ctypes.sizeof(type(self)), *args, **kwargs)


class KnobValue(Versioned):
    _fields_ = [("struct_size", ctypes.c_size_t), ("set", ctypes.c_int32),
                ("choice", ctypes.c_int32), ("integer", ctypes.c_int64),
                ("accepts", ctypes.c_char_p)]


def knob(name: str, value: str | None = None) -> KnobValue:
    """`value` (None: the environment's) parsed as tide reads knob `name` (tide_knob: config/ is
    the one parser of every TIDE_* variable). A bad value is a ValueError with tide's message."""
    out = KnobValue()
    status = lib().tide_knob(name.encode(), None if value is None else value.encode(),
                             ctypes.byref(out))
    if status == TIDE_ERROR_INVALID_ARGUMENT:
        raise ValueError(lib().tide_last_error().decode())
    check(status)
    return out


def abi_calls() -> int:
    """How many times this thread has entered libtide's C ABI (tide_abi_calls)."""
    return lib().tide_abi_calls()


def check(status: int) -> None:
    """Raises TideError with tide's message unless `status` is TIDE_OK."""
    if status != TIDE_OK:
        raise TideError(lib().tide_last_error().decode(), status)


def version() -> str:
    return lib().tide_version().decode()


def driver_info() -> dict:
    """The CUDA driver tide loaded: number of devices and the driver's CUDA version."""
    count = ctypes.c_int()
    driver_version = ctypes.c_int()
    check(lib().tide_driver_info(ctypes.byref(count), ctypes.byref(driver_version)))
    return {"device_count": count.value, "driver_version": driver_version.value}

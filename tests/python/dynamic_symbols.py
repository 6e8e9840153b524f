"""Which loaded file defines a symbol as the process resolves it (tests/python/test_pinned.py).
Apart from the tests so that a process can measure it without importing tide."""

import ctypes
import os

RTLD_DEFAULT = ctypes.c_void_p(0)
ALLOCATORS = ("malloc", "free", "calloc", "realloc")


class DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def defining_library(symbol: str) -> str:
    """The file that defines `symbol` as the process resolves it (dlsym(RTLD_DEFAULT))."""
    libdl = ctypes.CDLL(None)
    libdl.dlsym.restype = ctypes.c_void_p
    libdl.dlsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    libdl.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
    address = libdl.dlsym(RTLD_DEFAULT, symbol.encode())
    assert address, f"{symbol} does not resolve"
    info = DlInfo()
    assert libdl.dladdr(ctypes.c_void_p(address), ctypes.byref(info))
    # dladdr names the executable by the process's argv[0], which differs between two processes
    # of one interpreter started differently ("python3", a full path): name it by its file.
    if info.dli_fbase == executable_base():
        return os.path.realpath("/proc/self/exe")
    return info.dli_fname.decode()


def executable_base() -> int | None:
    """Where the process's executable is mapped (its first page), from /proc/self/maps."""
    exe = os.path.realpath("/proc/self/exe")
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == exe and int(fields[2], 16) == 0:
                return int(fields[0].split("-")[0], 16)
    return None

"""Pinned host arenas from Python: libtide.so loaded with ctypes (RTLD_LOCAL, as PyTorch loads
extensions), its private jemalloc invisible to the process, arena memory as CPU tensors."""

import ctypes
import gc
import os
import subprocess
import sys

import pytest
import torch

from tide import _lib, pinned

RTLD_DEFAULT = ctypes.c_void_p(0)


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
    return info.dli_fname.decode()


def libtide(build_dir):
    return build_dir / "lib" / "libtide.so"


def standin_stat(name: str) -> int:
    """A counter of the stand-in driver libtide loaded (the same library, the same handle)."""
    lib = ctypes.CDLL(os.environ["TIDE_CUDA_DRIVER"], mode=os.RTLD_LOCAL)
    value = ctypes.c_uint64()
    assert lib.tide_standin_stat(name.encode(), ctypes.byref(value)) == 0
    return value.value


def test_libtide_needs_no_static_tls_and_hides_jemalloc(build_dir):
    dynamic = subprocess.run(["readelf", "-d", str(libtide(build_dir))], check=True,
                             capture_output=True, text=True).stdout
    flags = [line for line in dynamic.splitlines() if "(FLAGS)" in line]
    assert not any("STATIC_TLS" in line for line in flags), flags
    symbols = subprocess.run(["nm", "-D", str(libtide(build_dir))], check=True,
                             capture_output=True, text=True).stdout.split()
    leaked = [s for s in symbols if "je_" in s or "jemalloc" in s]
    assert leaked == [], f"jemalloc symbols exported by libtide.so: {leaked[:10]}"
    defined = subprocess.run(["nm", "-D", "--defined-only", str(libtide(build_dir))],
                             check=True, capture_output=True, text=True).stdout.split()
    for name in ("malloc", "free", "calloc", "realloc", "posix_memalign", "aligned_alloc"):
        assert name not in defined, f"libtide.so defines {name}"


def test_fresh_process_after_torch_allocates_and_keeps_glibc_malloc(repo, build_dir):
    # torch first: it uses much of the static TLS a dlopen()ed library could get.
    code = (
        "import torch, ctypes, os, sys\n"
        f"sys.path.insert(0, {str(repo / 'tests' / 'python')!r})\n"
        "from test_pinned import defining_library\n"
        f"lib = ctypes.CDLL({str(libtide(build_dir))!r}, mode=os.RTLD_LOCAL)\n"
        "arena = ctypes.c_void_p()\n"
        "assert lib.tide_pinned_arena_create(None, ctypes.byref(arena)) == 0, lib.tide_last_error\n"
        "ptr = ctypes.c_void_p()\n"
        "for n in (100, 100_000, 10_000_000):\n"
        "    assert lib.tide_pinned_alloc(arena, ctypes.c_size_t(n), ctypes.c_size_t(0),\n"
        "                                 ctypes.byref(ptr)) == 0\n"
        "    ctypes.memset(ptr, 1, n)\n"
        "    assert lib.tide_pinned_free(arena, ptr, ctypes.c_size_t(n)) == 0\n"
        "assert lib.tide_pinned_arena_destroy(arena) == 0\n"
        "for name in ('malloc', 'free', 'calloc', 'realloc'):\n"
        "    print(name, defining_library(name))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=str(repo / "python")))
    assert "static TLS" not in result.stderr
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")
    for name in ("malloc", "free", "calloc", "realloc"):
        line = next(l for l in lines if l.startswith(name + " "))
        assert line.split()[1].endswith("libc.so.6"), line


def test_malloc_is_glibcs_in_this_process_too():
    with pinned.PinnedArena() as arena:
        t = arena.empty(1000)
        del t
        gc.collect()
    assert defining_library("malloc").endswith("libc.so.6")


def test_tensor_uses_arena_memory_without_copy():
    arena = pinned.PinnedArena()
    buffer = arena.alloc(4 * 1000)
    t = buffer.as_tensor(torch.float32, (10, 100))
    assert t.data_ptr() == buffer.ptr
    t.fill_(2.5)
    raw = (ctypes.c_float * 1000).from_address(buffer.ptr)
    assert raw[0] == 2.5 and raw[999] == 2.5
    raw[17] = -1.0
    assert t.view(-1)[17].item() == -1.0


def test_memory_returns_to_the_arena_when_the_last_view_is_gone():
    arena = pinned.PinnedArena()
    t = arena.zeros((256, 1024))  # 1 MiB: a direct buffer
    small = arena.empty(100, dtype=torch.bfloat16)  # jemalloc
    view = t[10:20]
    del t
    gc.collect()
    assert arena.stats()["requested_bytes"] == 256 * 1024 * 4 + 200
    assert view.sum().item() == 0.0  # still readable
    del view, small
    gc.collect()
    stats = arena.stats()
    assert stats["requested_bytes"] == 0
    assert stats["allocations"] == stats["frees"] == 2
    assert arena.live_buffers == 0
    arena.close()


def test_arena_memory_is_pinned_through_the_stand_in():
    gc.collect()
    registers, unregisters = standin_stat("host_registers"), standin_stat("host_unregisters")
    registered = standin_stat("registered_host_bytes")
    arena = pinned.PinnedArena(retain_bytes=0)
    tensors = [arena.empty(n, dtype=torch.float32) for n in (10, 50_000, 10_000_000)]
    stats = arena.stats()
    assert stats["pinned"] is True and arena.pinned
    assert standin_stat("host_registers") - registers == stats["chunks_mapped"] >= 2
    assert standin_stat("registered_host_bytes") - registered == stats["pinned_bytes"]
    assert stats["pinned_bytes"] >= sum(t.numel() * 4 for t in tensors)
    assert stats["register_ns"] > 0
    del tensors
    gc.collect()
    arena.close()
    # Every chunk registered was unregistered once, and nothing else.
    assert standin_stat("host_unregisters") - unregisters == stats["chunks_mapped"]
    assert standin_stat("registered_host_bytes") == registered


def test_alignment_and_dtypes():
    arena = pinned.PinnedArena()
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.uint8):
        t = arena.empty((3, 7), dtype=dtype)
        assert t.dtype == dtype and t.shape == (3, 7)
        assert t.data_ptr() % 64 == 0
    page = arena.alloc(100, alignment=4096)
    assert page.ptr % 4096 == 0
    assert arena.empty(0).numel() == 0


def test_closing_an_arena_in_use_is_refused():
    arena = pinned.PinnedArena()
    t = arena.empty(10)
    with pytest.raises(_lib.TideError, match="live buffers"):
        arena.close()
    del t
    gc.collect()
    arena.close()
    with pytest.raises(_lib.TideError, match="closed"):
        arena.alloc(10)


def test_bad_free_is_an_invalid_argument():
    arena = pinned.PinnedArena()
    buffer = arena.alloc(2_000_000)
    lib = pinned._api()
    status = lib.tide_pinned_free(arena._handle, buffer.ptr, 1_999_999)
    assert status == 1  # TIDE_ERROR_INVALID_ARGUMENT
    assert b"allocated with 2000000 bytes" in lib.tide_last_error()


def test_bad_option_is_an_invalid_argument():
    with pytest.raises(_lib.TideError, match="NUMA node 1000") as e:
        pinned.PinnedArena(numa_node=1000)
    assert e.value.status == 1


def test_without_a_driver_the_arena_works_and_says_it_is_not_pinned(repo, build_dir):
    # Through the C ABI only: no torch to import, so the subprocess starts fast.
    code = (
        "import ctypes, os\n"
        f"lib = ctypes.CDLL({str(libtide(build_dir))!r}, mode=os.RTLD_LOCAL)\n"
        "class Stats(ctypes.Structure):  # tide_pinned_stats: struct_size, then 19 counters\n"
        "    _fields_ = [('struct_size', ctypes.c_size_t)] + [\n"
        "        (f'f{i}', ctypes.c_uint64) for i in range(19)]\n"
        "for _ in range(2):\n"
        "    arena, ptr, stats = ctypes.c_void_p(), ctypes.c_void_p(), Stats()\n"
        "    stats.struct_size = ctypes.sizeof(Stats)\n"
        "    assert lib.tide_pinned_arena_create(None, ctypes.byref(arena)) == 0\n"
        "    for n in (64, 5_000_000):\n"
        "        assert lib.tide_pinned_alloc(arena, ctypes.c_size_t(n), ctypes.c_size_t(0),\n"
        "                                     ctypes.byref(ptr)) == 0\n"
        "        ctypes.memset(ptr, 7, n)\n"
        "        assert lib.tide_pinned_free(arena, ptr, ctypes.c_size_t(n)) == 0\n"
        "    assert lib.tide_pinned_arena_stats(arena, ctypes.byref(stats)) == 0\n"
        "    print('pinned', stats.f18, 'bytes', stats.f6 > 0)\n"
        "    assert lib.tide_pinned_arena_destroy(arena) == 0\n"
    )
    env = dict(os.environ, TIDE_CUDA_DRIVER="/nonexistent/libcuda.so.1")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("pinned 0 bytes True") == 2, result.stdout
    assert result.stderr.count("NOT pinned") == 1, result.stderr
    assert "/nonexistent/libcuda.so.1" in result.stderr

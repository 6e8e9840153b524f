"""Pinned host arenas from Python: libtide.so loaded with ctypes (RTLD_LOCAL, as PyTorch loads
extensions), its private jemalloc invisible to the process, arena memory as CPU tensors."""

import ctypes
import functools
import gc
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from dynamic_symbols import ALLOCATORS, defining_library
from tide import _lib, pinned

TESTS = pathlib.Path(__file__).resolve().parent


def libtide(build_dir):
    return build_dir / "lib" / "libtide.so"


def allocators_after(code: str) -> dict[str, str]:
    """The file defining each of malloc, free, calloc and realloc in a fresh Python process,
    after it has run `code`."""
    code += (f"\nimport sys\nsys.path.insert(0, {str(TESTS)!r})\n"
             "from dynamic_symbols import ALLOCATORS, defining_library\n"
             "for name in ALLOCATORS:\n"
             "    print(name, defining_library(name))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "static TLS" not in result.stderr
    assert result.returncode == 0, result.stderr
    found = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert set(ALLOCATORS) <= found.keys(), result.stdout
    return {name: found[name] for name in ALLOCATORS}


@functools.cache
def allocators_without_tide() -> dict[str, str]:
    """What a process that never loads tide resolves them to: glibc's, or the Python executable's
    own where it links an allocator in (as python-build-standalone's interpreters do)."""
    return allocators_after("import torch")


def assert_the_process_keeps_its_allocators(found: dict[str, str]):
    """tide's jemalloc is private: it never becomes the process's malloc."""
    for name, library in found.items():
        assert "libtide" not in library and "jemalloc" not in library, (name, library)
    assert found == allocators_without_tide()


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


def test_fresh_process_after_torch_allocates_and_keeps_its_malloc(build_dir):
    # torch first: it uses much of the static TLS a dlopen()ed library could get.
    code = (
        "import torch, ctypes, os\n"
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
    )
    assert_the_process_keeps_its_allocators(allocators_after(code))


def test_this_process_keeps_its_malloc_too():
    with pinned.PinnedArena() as arena:
        t = arena.empty(1000)
        del t
        gc.collect()
    assert_the_process_keeps_its_allocators({name: defining_library(name) for name in ALLOCATORS})


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


@pytest.mark.skipif("libtide_standin_cuda" not in os.environ.get("TIDE_CUDA_DRIVER", ""),
                    reason="reads the stand-in driver's counters of host registrations")
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

"""torch.cuda's memory statistics under tide's allocator: after use_allocator() (and so under
`tide run --optimizer`) torch.cuda.memory_stats, memory_allocated, max_memory_allocated,
memory_summary, the resets, empty_cache and mem_get_info answer with tide's allocator, under
PyTorch's key names; without tide they raise "CUDAPluggableAllocator does not yet support
getDeviceStats".

Installing an allocator is process-wide and cannot be undone, so the checks run in subprocesses.
Without a GPU tide's allocator runs over the host stand-in driver, and CUDA cannot be initialised:
PyTorch's functions answer {} / 0 until it is, so the checks make PyTorch believe it is
(torch.cuda.is_initialized patched) and pass device indices (current_device() needs a GPU); memory
is allocated through tide's C ABI, from the same allocator PyTorch's pluggable allocator calls.
The `gpu` test does the same with CUDA tensors on a GPU.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import tide.torch as tt  # noqa: E402
from conftest import BUILD, real_driver_present  # noqa: E402

MiB = 1 << 20
REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"

# What torch.cuda.memory_summary() reads, and what trainers log.
TORCH_KEYS = [f"{metric}.{pool}.{field}"
              for metric in ("allocated_bytes", "active_bytes", "requested_bytes",
                             "reserved_bytes", "inactive_split_bytes", "allocation", "active",
                             "segment", "inactive_split")
              for pool in ("all", "large_pool", "small_pool")
              for field in ("current", "peak", "allocated", "freed")] + [
    f"{metric}.{field}" for metric in ("oversize_allocations", "oversize_segments")
    for field in ("current", "peak", "allocated", "freed")] + [
    "num_alloc_retries", "num_ooms", "num_oom_rejections", "num_sync_all_streams",
    "num_device_alloc", "num_device_free", "max_split_size"]

CHECKS = """
import ctypes, json, warnings
import torch
from torch.cuda import max_memory_allocated  # imported before tide installs: routed all the same
import tide.torch as tt
from tide import _lib
from tide.torch import allocator as talloc

MiB = 1 << 20
facts = {}


def fact(name):
    def record(fn):
        try:
            facts[name] = fn()
        except Exception as e:  # each fact on its own: one failing says which
            facts[name] = {"error": f"{type(e).__name__}: {e}"}
    return record


tt.use_allocator()
# Without a GPU CUDA cannot be initialised: as if it were (torch/cuda/memory.py has its own name).
torch.cuda.is_initialized = lambda: True
torch.cuda.memory.is_initialized = lambda: True
lib = talloc._lib_declared()


def too_much():
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    _lib.check(_lib.lib().tide_device_memory(0, ctypes.byref(free), ctypes.byref(total)))
    return 2 * total.value  # more than the device has: an out-of-memory, counted in num_ooms


@fact("allocate")
def _():
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(0)
    n = 3 * MiB + 100
    before = torch.cuda.memory_allocated(0)
    p = lib.tide_alloc(n, 0, None)
    during = [torch.cuda.memory_allocated(0), max_memory_allocated(0), tt.memory_allocated(0),
              torch.cuda.memory_reserved(0), torch.cuda.max_memory_reserved(0),
              tt.memory_reserved(0)]
    lib.tide_free(p, n, 0, None)
    after = [torch.cuda.memory_allocated(0), max_memory_allocated(0)]
    torch.cuda.reset_peak_memory_stats(0)
    reset = [torch.cuda.memory_allocated(0), max_memory_allocated(0),
             torch.cuda.memory_reserved(0), torch.cuda.max_memory_reserved(0)]
    return {"n": n, "before": before, "during": during, "after": after, "reset": reset}


@fact("deprecated_resets")
def _():
    out = {}
    for name in ("reset_max_memory_allocated", "reset_max_memory_cached"):
        reset = getattr(torch.cuda, name, None)
        if reset is None:
            continue  # not in this PyTorch
        p = lib.tide_alloc(2 * MiB, 0, None)
        lib.tide_free(p, 2 * MiB, 0, None)
        high = [max_memory_allocated(0), torch.cuda.max_memory_reserved(0)]
        torch.cuda.empty_cache()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            reset(0)
        out[name] = {"high": high, "peaks": [max_memory_allocated(0),
                                             torch.cuda.max_memory_reserved(0)],
                     "current": [torch.cuda.memory_allocated(0), torch.cuda.memory_reserved(0)]}
    return out


def accumulated(stats):
    return {k: v for k, v in stats.items()
            if k.endswith((".allocated", ".freed")) or k in ("num_ooms", "num_device_alloc")}


@fact("accumulated")
def _():
    p = lib.tide_alloc(MiB, 0, None)
    lib.tide_free(p, MiB, 0, None)
    assert lib.tide_alloc(too_much(), 0, None) is None
    before = accumulated(torch.cuda.memory_stats(0))
    torch.cuda.reset_accumulated_memory_stats(0)
    return {"before": before, "after": accumulated(torch.cuda.memory_stats(0)),
            "tide_after": accumulated(tt.memory_stats(0))}


@fact("stats")
def _():
    p = lib.tide_alloc(MiB + 1, 0, None)
    stats = dict(torch.cuda.memory_stats(torch.device("cuda:0")))
    nested = torch.cuda.memory_stats_as_nested_dict(0)
    raw = talloc._stats(0)  # tide_alloc_get_stats itself
    out = {"stats": stats, "tide": tt.memory_stats(0),
           "nested": nested["allocated_bytes"]["all"]["current"],
           "raw": {"reserved_bytes.large_pool.peak": raw.reserved_bytes[2].peak,
                   "active_bytes.all.allocated": raw.active_bytes[0].allocated,
                   "inactive_split_bytes.all.current": raw.inactive_split_bytes[0],
                   "num_device_alloc": raw.num_device_alloc},
           "by_name": [torch.cuda.memory_allocated(d)
                       for d in (0, torch.device("cuda:0"), "cuda:0")]}
    lib.tide_free(p, MiB + 1, 0, None)
    return out


@fact("summary")
def _():
    p = lib.tide_alloc(5 * MiB, 0, None)
    assert lib.tide_alloc(too_much(), 0, None) is None  # so that "CUDA OOMs" is tide's count
    out = {"summary": torch.cuda.memory_summary(0), "stats": tt.memory_stats(0)}
    lib.tide_free(p, 5 * MiB, 0, None)
    return out


@fact("empty_cache")
def _():
    p = lib.tide_alloc(3 * MiB, 0, None)
    lib.tide_free(p, 3 * MiB, 0, None)
    before = [torch.cuda.memory_reserved(0), torch.cuda.mem_get_info(0)[0]]
    torch.cuda.empty_cache()
    return {"before": before, "after": [torch.cuda.memory_reserved(0),
                                        torch.cuda.mem_get_info(0)[0], tt.memory_reserved(0)]}


@fact("mem_get_info")
def _():
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    _lib.check(_lib.lib().tide_device_memory(0, ctypes.byref(free), ctypes.byref(total)))
    return {"torch": [list(torch.cuda.mem_get_info(d)) for d in (0, torch.device("cuda:0"))],
            "tide": list(tt.mem_get_info(0)), "driver": [free.value, total.value]}


@fact("unserved_device")
def _():
    count = _lib.driver_info()["device_count"]
    try:
        torch.cuda.memory_stats(count)
    except RuntimeError as e:
        return str(e)
    return "no error"


@fact("originals")
def _():
    tt.use_allocator()  # again: routes nothing twice
    names = ["torch._C._cuda_memoryStats", "torch._C._cuda_resetPeakMemoryStats",
             "torch._C._cuda_resetAccumulatedMemoryStats", "torch._C._cuda_emptyCache",
             "torch._C._cudart.cudaMemGetInfo"]
    kinds = {n: type(talloc.original(n)).__name__ for n in names}
    try:
        talloc.original("torch._C._cuda_memoryStats")(0)
        said = "no error"
    except RuntimeError as e:
        said = str(e)
    return {"kinds": kinds, "said": said,
            "routed": torch._C._cuda_memoryStats is not talloc.original(names[0])}


print(json.dumps(facts))
"""


def subprocess_env():
    return dict(os.environ, PYTHONPATH=str(REPO / "python"))  # this tree's tide, not the venv's


@pytest.fixture(scope="module")
def facts():
    r = subprocess.run([sys.executable, "-c", CHECKS], capture_output=True, text=True,
                       timeout=300, env=subprocess_env())
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def fact(facts, name):
    value = facts[name]
    assert not (isinstance(value, dict) and "error" in value), value
    return value


def rounded(n):
    return (n + 511) // 512 * 512  # tide's blocks: 512-byte multiples


def test_allocating_raises_memory_allocated_by_the_rounded_size_and_peak_follows(facts):
    f = fact(facts, "allocate")
    allocated, peak, tide_allocated, reserved, max_reserved, tide_reserved = f["during"]
    assert allocated - f["before"] == rounded(f["n"])
    assert allocated == tide_allocated and reserved == tide_reserved
    assert peak == allocated, "max_memory_allocated, imported before use_allocator()"
    assert reserved >= allocated and max_reserved >= reserved
    assert f["after"] == [f["before"], allocated], "freed: current drops, the peak stays"


def test_reset_peak_memory_stats_brings_the_peaks_to_current(facts):
    allocated, peak, reserved, max_reserved = fact(facts, "allocate")["reset"]
    assert peak == allocated and max_reserved == reserved


def test_reset_max_memory_allocated_and_cached_reset_the_peaks(facts):
    resets = fact(facts, "deprecated_resets")
    for name in ("reset_max_memory_allocated", "reset_max_memory_cached"):
        if not hasattr(torch.cuda, name):
            continue
        r = resets[name]
        assert r["high"][0] >= 2 * MiB > r["current"][0]
        assert r["high"][1] > r["current"][1], "empty_cache gave the segment back"
        assert r["peaks"] == r["current"], name


def test_reset_accumulated_memory_stats_zeroes_the_totals_and_counters(facts):
    f = fact(facts, "accumulated")
    assert f["before"]["allocated_bytes.all.allocated"] >= MiB
    assert f["before"]["allocated_bytes.all.freed"] >= MiB
    assert f["before"]["num_ooms"] >= 1 and f["before"]["num_device_alloc"] >= 1
    assert set(f["after"]) == set(f["before"])
    assert not any(f["after"].values()), f["after"]
    assert f["tide_after"] == f["after"]


def test_memory_stats_are_tides_under_pytorchs_key_names(facts):
    f = fact(facts, "stats")
    stats = f["stats"]
    assert [k for k in TORCH_KEYS if k not in stats] == []
    assert stats == f["tide"], "torch.cuda.memory_stats is tide.torch.memory_stats"
    assert stats["tide.memory_limit"] > 0, "tide's own keys come along"
    assert stats["allocated_bytes.all.current"] == f["nested"] == rounded(MiB + 1)
    assert stats["allocation.large_pool.current"] == 1
    assert {k: stats[k] for k in f["raw"]} == f["raw"]
    assert f["by_name"] == [rounded(MiB + 1)] * 3, "int, torch.device, 'cuda:0'"


def test_keys_without_a_meaning_in_tide_read_as_documented(facts):
    stats = fact(facts, "stats")["stats"]
    assert stats["max_split_size"] == -1
    assert stats["num_oom_rejections"] == 0
    fields = ("current", "peak", "allocated", "freed")
    for metric in ("oversize_allocations", "oversize_segments"):
        assert [stats[f"{metric}.{f}"] for f in fields] == [0] * 4
    # tide keeps only the current value of these
    for metric in ("inactive_split", "inactive_split_bytes"):
        for pool in ("all", "large_pool", "small_pool"):
            assert [stats[f"{metric}.{pool}.{f}"] for f in fields[1:]] == [0] * 3


def test_memory_summary_renders_tides_numbers(facts):
    f = fact(facts, "summary")
    summary, stats = f["summary"], f["stats"]
    assert "PyTorch CUDA memory summary, device ID 0" in summary
    assert stats["num_ooms"] >= 1
    assert f"CUDA OOMs: {stats['num_ooms']:<12d}" in summary
    allocated = next(line for line in summary.splitlines() if "Allocated memory" in line)
    assert stats["allocated_bytes.all.current"] == 5 * MiB
    assert allocated.split("|")[2] == "   5120 KiB ", allocated
    assert "Oversize GPU segments" in summary


def test_empty_cache_gives_the_cached_memory_back(facts):
    f = fact(facts, "empty_cache")
    (reserved, free), (reserved_after, free_after, tide_reserved) = f["before"], f["after"]
    assert reserved >= 3 * MiB
    assert reserved_after == tide_reserved == 0
    if real_driver_present():
        assert free_after > free, "the device has it back (other processes share a real GPU)"
    else:
        assert free_after - free == reserved, "the device has it back (mem_get_info)"


def test_mem_get_info_is_the_devices_free_and_total(facts):
    f = fact(facts, "mem_get_info")
    assert f["torch"] == [f["driver"], f["driver"]] and f["tide"] == f["driver"]
    free, total = f["driver"]
    assert 0 < free <= total


def test_a_device_tides_allocator_does_not_serve_is_refused(facts):
    said = fact(facts, "unserved_device")
    assert said.startswith("tide allocator: no device"), said


def test_pytorchs_functions_stay_reachable_and_are_routed_once(facts):
    f = fact(facts, "originals")
    assert f["routed"]
    assert set(f["kinds"].values()) == {"builtin_function_or_method"}, f["kinds"]
    assert "CUDAPluggableAllocator does not yet support getDeviceStats" in f["said"]


# ---- tide run --optimizer ----


@pytest.fixture(scope="module")
def tide_run_env(tmp_path_factory):
    """tide run's hook installs tide's allocator only where libcuda.so.1 loads. Without a GPU the
    stand-in driver, which tide allocates from in CPU mode anyway, answers under that name."""
    env = subprocess_env()
    if not real_driver_present():
        libdir = tmp_path_factory.mktemp("libcuda")
        (libdir / "libcuda.so.1").symlink_to(BUILD / "lib" / "libtide_standin_cuda.so")
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(libdir), os.environ.get("LD_LIBRARY_PATH")) if p)
    return env


def run_under_tide_run(env, tmp_path, *args):
    exe = BUILD / "bin" / "tide"
    assert exe.is_file(), f"{exe} is missing: build tide first (make build)"
    return subprocess.run([str(exe), "run", "--optimizer", "--", sys.executable,
                           str(FIXTURES / "log_memory_unmodified.py"), *args],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)


def test_a_script_that_logs_memory_runs_unchanged_under_tide_run(tide_run_env, tmp_path):
    """CUDA is never initialised here, so PyTorch's statistics answer 0 / {} before asking any
    allocator (as without tide); what reaches the allocator are the resets with a device index,
    which PyTorch's pluggable allocator refuses: this shows they reach tide's."""
    r = run_under_tide_run(tide_run_env, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "with tide's device allocator" in r.stderr, r.stderr
    assert json.loads(r.stdout) == {"max_memory_allocated": 0, "memory_allocated": 0,
                                    "memory_stats": 0}


def test_under_tide_run_torchs_statistics_are_tides(tide_run_env, tmp_path):
    """As once CUDA is initialised (simulated without a GPU): tide's keys and the device's
    memory as tide's driver reports it."""
    r = run_under_tide_run(tide_run_env, tmp_path, "--as-if-cuda-initialised")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [k for k in TORCH_KEYS if k not in out["stats"]] == []
    assert "tide.memory_limit" in out["stats"]
    assert out["peak"] == out["stats"]["allocated_bytes.all.peak"]
    assert out["mem_get_info"][1] == tt.mem_get_info(0)[1]


# ---- on a GPU ----

ON_CUDA = """
import json, warnings
import torch
from torch.cuda import max_memory_allocated
import tide.torch as tt

tt.use_allocator()
keep = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats()
base = torch.cuda.memory_allocated()
n = (12 << 20) + 100  # a segment of its own without growable segments: empty_cache frees it
x = torch.empty(n, dtype=torch.uint8, device="cuda")
out = {"n": n, "base": base, "with_x": torch.cuda.memory_allocated(),
       "tide_with_x": tt.memory_allocated(), "peak": max_memory_allocated(),
       "stats_equal": dict(torch.cuda.memory_stats()) == tt.memory_stats(),
       "summary": torch.cuda.memory_summary(torch.device("cuda"))}
del x
torch.cuda.synchronize()
out["after"] = [torch.cuda.memory_allocated(), max_memory_allocated(0)]
torch.cuda.reset_peak_memory_stats(torch.device("cuda:0"))
out["reset"] = [torch.cuda.memory_allocated(), max_memory_allocated()]
torch.cuda.reset_accumulated_memory_stats()
out["totals"] = torch.cuda.memory_stats()["allocated_bytes.all.allocated"]
reserved = torch.cuda.memory_reserved()
torch.cuda.empty_cache()
out["empty_cache"] = [reserved, torch.cuda.memory_reserved(), tt.memory_reserved()]
free, total = torch.cuda.mem_get_info()
_, torch_total = tt.allocator.original("torch._C._cudart.cudaMemGetInfo")(0)
out["mem_get_info"] = [free, total, torch_total]
print(json.dumps(out))
"""


@pytest.mark.gpu
def test_on_cuda_torchs_statistics_are_tides():
    r = subprocess.run([sys.executable, "-c", ON_CUDA], capture_output=True, text=True,
                       timeout=300, env=subprocess_env())
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["with_x"] - out["base"] == rounded(out["n"])
    assert out["with_x"] == out["tide_with_x"] == out["peak"]
    assert out["stats_equal"]
    assert "PyTorch CUDA memory summary, device ID 0" in out["summary"]
    assert out["after"] == [out["base"], out["with_x"]]
    assert out["reset"] == [out["base"], out["base"]]
    assert out["totals"] == 0
    reserved, reserved_after, tide_reserved = out["empty_cache"]
    assert reserved > reserved_after == tide_reserved >= out["base"]
    free, total, torch_total = out["mem_get_info"]
    assert 0 < free <= total == torch_total

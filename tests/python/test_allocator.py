"""tide's device caching allocator from Python: installing it in PyTorch (CUDAPluggableAllocator),
the too-late error, PyTorch-named statistics, phases, headroom, timeline and trace export.

Installing an allocator is process-wide and cannot be undone, so those tests run in
subprocesses. This machine may have no GPU: PyTorch swaps a pluggable allocator in without
initialising CUDA, so use_allocator() runs for real; what cannot happen without a GPU is CUDA
being initialised, so that case is simulated (torch.cuda.is_initialized patched), next to the real
"another allocator is already in use" case. The allocator itself is exercised through libtide's
C ABI, on the stand-in driver.
"""

import ctypes
import json
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import tide.torch as tt  # noqa: E402
from tide import _lib  # noqa: E402
from tide.torch import allocator as talloc  # noqa: E402

MiB = 1 << 20
REPO = pathlib.Path(__file__).resolve().parents[2]


SWAP_IN = """
import os, torch, tide.torch, tide._lib as L
pluggable = tide.torch.use_allocator()
assert isinstance(pluggable, torch.cuda.memory.CUDAPluggableAllocator), type(pluggable)
current = torch.cuda.memory._get_current_allocator().allocator()
assert current is pluggable.allocator(), (current, pluggable.allocator())
assert tide.torch.use_allocator() is pluggable  # a second call is harmless
assert tide.torch.is_using_allocator()
maps = [l.split()[-1] for l in open('/proc/self/maps') if 'libtide.so' in l]
print('MAPPED', sorted(set(os.path.realpath(m) for m in maps)))
print('LIB', os.path.realpath(L.lib()._name))
print('CUDA', torch.cuda.is_initialized())
"""

ANOTHER_ALLOCATOR_FIRST = """
import torch, tide.torch
other = torch.cuda.memory.CUDAPluggableAllocator('libc.so.6', 'malloc', 'free')
torch.cuda.memory.change_current_allocator(other)  # someone else got there first
try:
    tide.torch.use_allocator()
except tide.torch.AllocatorError as e:
    print('ERROR', e)
print('USING', tide.torch.is_using_allocator())
current = torch.cuda.memory._get_current_allocator().allocator()
print('CURRENT_IS_OTHER', current is other.allocator())
"""

# Without a GPU CUDA cannot be initialised: simulated the way use_allocator() checks for it.
CUDA_ALREADY_INITIALISED = """
import torch, tide.torch
before = torch.cuda.memory._get_current_allocator().allocator()
torch.cuda.is_initialized = lambda: True
try:
    tide.torch.use_allocator()
except tide.torch.AllocatorError as e:
    print('ERROR', e)
print('UNCHANGED', torch.cuda.memory._get_current_allocator().allocator() is before)
"""


@pytest.fixture(scope="module")
def fresh_processes():
    """Each script in a fresh Python process, all at once (importing torch takes seconds)."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    scripts = {"swap_in": SWAP_IN, "another_first": ANOTHER_ALLOCATOR_FIRST,
               "cuda_initialised": CUDA_ALREADY_INITIALISED}
    procs = {name: subprocess.Popen([sys.executable, "-c", code], env=env, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for name, code in scripts.items()}
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return results


def test_use_allocator_loads_libtide_through_the_pluggable_allocator_and_swaps_it_in(
        fresh_processes):
    r = fresh_processes["swap_in"]
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    # PyTorch's ctypes.CDLL and tide's own loading share one libtide.so (one allocator).
    assert lines["MAPPED"] == str([lines["LIB"]])
    assert lines["CUDA"] == "False"


def test_too_late_when_another_allocator_is_already_in_use(fresh_processes):
    r = fresh_processes["another_first"]
    assert r.returncode == 0, r.stderr
    assert ("ERROR tide.torch.use_allocator(): PyTorch's CUDA allocator is already in use"
            in r.stdout)
    assert "Can't swap an already initialized allocator" in r.stdout  # PyTorch's own words
    assert "before anything touches CUDA" in r.stdout  # what to do
    assert "USING False" in r.stdout
    assert "CURRENT_IS_OTHER True" in r.stdout


def test_too_late_when_cuda_is_already_initialised(fresh_processes):
    r = fresh_processes["cuda_initialised"]
    assert r.returncode == 0, r.stderr
    assert "ERROR" in r.stdout and "CUDA is already initialised" in r.stdout
    assert "call tide.torch.use_allocator() before anything touches cuda" in r.stdout.lower()
    assert "UNCHANGED True" in r.stdout


@pytest.fixture
def lib():
    cdll = talloc._lib_declared()
    tt.empty_cache()
    tt.reset_peak_memory_stats(0)
    return cdll


def test_memory_stats_use_pytorchs_names_and_follow_allocations(lib):
    base = tt.memory_stats(0)
    p = lib.tide_alloc(1000, 0, None)
    q = lib.tide_alloc(5 * MiB, 0, None)
    assert p and q
    s = tt.memory_stats(0)
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                "reserved_bytes.all.peak", "requested_bytes.all.current",
                "active_bytes.large_pool.freed", "allocation.small_pool.current",
                "segment.all.current", "inactive_split_bytes.all.current", "num_alloc_retries",
                "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free"):
        assert key in s, key
    assert s["allocated_bytes.all.current"] - base["allocated_bytes.all.current"] == 1024 + 5 * MiB
    assert s["requested_bytes.all.current"] - base["requested_bytes.all.current"] == 1000 + 5 * MiB
    assert s["allocation.small_pool.current"] - base["allocation.small_pool.current"] == 1
    assert tt.memory_allocated(0) == s["allocated_bytes.all.current"]
    assert tt.memory_reserved(0) >= tt.memory_allocated(0)
    # tide's own: a small block freed and asked for again on this thread comes from its cache.
    lib.tide_free(p, 1000, 0, None)
    hits = s["tide.thread_cache_hits"]
    assert lib.tide_alloc(1000, 0, None) == p
    s = tt.memory_stats(0)
    assert s["tide.thread_cache_hits"] == hits + 1
    assert s["allocation.small_pool.allocated"] - base["allocation.small_pool.allocated"] == 2
    lib.tide_free(q, 5 * MiB, 0, None)
    lib.tide_free(p, 1000, 0, None)
    assert tt.max_memory_allocated(0) >= 1024 + 5 * MiB
    tt.reset_peak_memory_stats(0)
    assert tt.max_memory_allocated(0) == tt.memory_allocated(0)
    tt.empty_cache()
    assert tt.memory_reserved(0) == 0


def test_out_of_memory_is_null_with_a_message_and_a_record(lib):
    total = _lib.lib().tide_device_memory  # via the general C ABI
    free_b, total_b = ctypes.c_size_t(), ctypes.c_size_t()
    _lib.check(total(0, ctypes.byref(free_b), ctypes.byref(total_b)))
    assert lib.tide_alloc(2 * total_b.value, 0, None) is None
    assert b"out of memory on device 0" in _lib.lib().tide_last_error()
    oom = tt.last_oom(0)
    assert oom["requested_bytes"] == 2 * total_b.value
    assert tt.memory_stats(0)["num_ooms"] >= 1


def test_phases_iterations_headroom_and_timeline_export(lib, tmp_path):
    for _ in range(4):
        tt.mark_phase("forward")
        acts = [lib.tide_alloc(8 * MiB, 0, None) for _ in range(6)]
        tt.mark_phase("backward")
        for a in acts:
            lib.tide_free(a, 8 * MiB, 0, None)
        tt.mark_phase("update")
        u = lib.tide_alloc(16 * MiB, 0, None)
        lib.tide_free(u, 16 * MiB, 0, None)
        tt.mark_phase("end")
    its = tt.iteration_stats(0)
    assert len(its) >= 4
    last = its[-1]
    assert not last["detected"]
    assert set(last["phases"]) == {"forward", "backward", "update"}
    assert last["phases"]["forward"]["peak_live_bytes"] >= 48 * MiB
    phases = last["phases"]
    assert phases["update"]["peak_live_bytes"] < phases["forward"]["peak_live_bytes"]
    h = tt.headroom(0)
    assert h["iterations"] > 0
    assert h["headroom_bytes"] == h["limit_bytes"] - h["update_peak_bytes"] - h["margin_bytes"]
    assert h["iteration_peak_bytes"] >= 48 * MiB  # the forward pass's activations
    assert h["held_headroom_bytes"] == (h["limit_bytes"] - h["iteration_peak_bytes"]
                                        - h["margin_bytes"])
    assert len(tt.timeline(0)) > 0
    path = tmp_path / "timeline.json"
    tt.export_timeline(path, 0)
    events = json.loads(path.read_text())["traceEvents"]
    assert any(e["ph"] == "C" and e["name"] == "memory" for e in events)
    assert any(e["ph"] == "X" and e["name"] == "update" for e in events)
    with pytest.raises(ValueError):
        tt.mark_phase("lunch")


def test_a_recorded_trace_replays_with_tide_replay(lib, tmp_path, build_dir):
    path = tmp_path / "events.trace"
    tt.start_trace(0)
    ptrs = [(lib.tide_alloc(size, 0, None), size) for size in (4096, 3 * MiB, 100_000, 7 * MiB)]
    tt.mark_phase("end", 0)
    for p, size in ptrs:
        lib.tide_free(p, size, 0, None)
    tt.stop_trace(path, 0)
    text = path.read_text()
    assert text.startswith("tide-trace 1\n")
    r = subprocess.run([str(build_dir / "bin" / "tide"), "replay", str(path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["allocations"] >= 4
    assert result["failed_allocations"] == 0
    assert result["peak_requested_bytes"] >= 4096 + 3 * MiB + 100_000 + 7 * MiB

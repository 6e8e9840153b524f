"""tide's device caching allocator in PyTorch, and its memory telemetry.

Install it before anything touches CUDA::

    import torch
    import tide.torch

    tide.torch.use_allocator()      # first thing: before CUDA tensors, .cuda(), torch.cuda calls
    ...
    for batch in data:
        tide.torch.mark_phase("forward")
        loss = model(batch)
        tide.torch.mark_phase("backward")
        loss.backward()
        tide.torch.mark_phase("update")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tide.torch.mark_phase("end")
    print(tide.torch.memory_stats()["allocated_bytes.all.peak"], tide.torch.headroom())

PyTorch calls tide's ``tide_alloc_throwing``/``tide_free`` (libtide.so) through
``torch.cuda.memory.CUDAPluggableAllocator``. Out of memory is a ``RuntimeError`` whose message
starts with PyTorch's own "CUDA out of memory." and says what was asked for and what tide's
allocator holds (live, reserved, its limit, the device's free memory); catch it, free memory and
carry on, as with PyTorch's allocator. (PyTorch raises its ``torch.OutOfMemoryError``, a subclass
of ``RuntimeError``, only from its own allocator: a pluggable allocator cannot throw its C++ type
without being built against PyTorch.)

PyTorch's own memory statistics answer with tide's allocator once it is installed:
``torch.cuda.memory_stats``, ``memory_stats_as_nested_dict``, ``memory_allocated``,
``max_memory_allocated``, ``memory_reserved``, ``max_memory_reserved``, ``memory_summary``,
``reset_peak_memory_stats`` (and ``reset_max_memory_allocated``/``_cached``),
``reset_accumulated_memory_stats``, ``empty_cache`` and ``mem_get_info``. Under a pluggable
allocator PyTorch's C++ side raises "CUDAPluggableAllocator does not yet support getDeviceStats"
for these (or does nothing), so use_allocator() routes the ``torch._C`` functions that
``torch/cuda/memory.py`` calls at each call (``original()`` keeps PyTorch's). This module's
functions of the same names give the same numbers. Still PyTorch's under a pluggable allocator:
memory snapshots (``torch.cuda.memory_snapshot`` raises; use ``export_timeline`` and
``start_trace``), ``set_per_process_memory_fraction`` and ``Tensor.record_stream`` (they do
nothing; use this module's ``set_per_process_memory_fraction`` and ``record_stream``).

Phase marks are optional: without them tide detects iterations and phases from the memory curve.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

from tide import _lib

_PHASES = {"forward": 0, "backward": 1, "update": 2, "end": 3, "iteration_end": 3}
_POOLS = ("all", "small_pool", "large_pool")
_STATS = ("allocated_bytes", "requested_bytes", "reserved_bytes", "active_bytes", "allocation",
          "active", "segment")
_FIELDS = ("current", "peak", "allocated", "freed")
_COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
             "num_device_free")

# The function PyTorch allocates with: on failure it throws (a RuntimeError in Python) instead of
# returning NULL (include/tide/tide.h).
ALLOCATE_FUNCTION = "tide_alloc_throwing"

_lock = threading.Lock()
_installed: Any = None  # the CUDAPluggableAllocator once use_allocator() has swapped it in
_originals: dict[str, Any] = {}  # PyTorch's functions that use_allocator() routed to tide's
_declared: set[int] = set()


class AllocatorError(RuntimeError):
    """tide's allocator could not be installed, with what to do about it."""


class Stat(ctypes.Structure):
    """tide_alloc_stat."""

    _fields_ = [(name, ctypes.c_uint64) for name in ("current", "peak", "allocated", "freed")]


class Stats(_lib.Versioned):
    """tide_alloc_stats."""

    _fields_ = [("struct_size", ctypes.c_size_t)] + [(name, Stat * 3) for name in _STATS] + [
        ("inactive_split_bytes", ctypes.c_uint64 * 3),
        ("inactive_split", ctypes.c_uint64 * 3),
    ] + [
        (name, ctypes.c_uint64)
        for name in ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                     "num_device_free", "memory_limit", "thread_cached_bytes",
                     "largest_free_block", "growable", "thread_cache_hits")
    ]


class Sample(ctypes.Structure):
    """tide_alloc_sample."""

    _fields_ = [(name, ctypes.c_uint64) for name in ("t_ns", "live_bytes", "reserved_bytes")]


class Iteration(ctypes.Structure):
    """tide_alloc_iteration."""

    _fields_ = [
        ("index", ctypes.c_uint64),
        ("start_ns", ctypes.c_uint64),
        ("end_ns", ctypes.c_uint64),
        ("phase_start_ns", ctypes.c_uint64 * 3),
        ("peak_live_bytes", ctypes.c_uint64 * 3),
        ("peak_reserved_bytes", ctypes.c_uint64 * 3),
        ("peak_live_all_bytes", ctypes.c_uint64),
        ("min_live_bytes", ctypes.c_uint64),
        ("phase_seen", ctypes.c_uint32),
        ("detected", ctypes.c_uint32),
    ]


class Forecast(_lib.Versioned):
    """tide_alloc_forecast."""

    _fields_ = [("struct_size", ctypes.c_size_t)] + [(name, ctypes.c_uint64)
                for name in ("headroom_bytes", "update_peak_bytes", "limit_bytes", "margin_bytes")
                ] + [("iterations", ctypes.c_int32), ("detected", ctypes.c_int32),
                     ("held_headroom_bytes", ctypes.c_uint64),
                     ("iteration_peak_bytes", ctypes.c_uint64)]


class Oom(_lib.Versioned):
    """tide_alloc_oom."""

    _fields_ = [("struct_size", ctypes.c_size_t)] + [(name, ctypes.c_uint64)
                for name in ("t_ns", "requested_bytes", "block_bytes", "live_bytes",
                             "reserved_bytes", "limit_bytes", "device_free_bytes",
                             "device_total_bytes", "largest_free_block")
                ] + [("limit_reached", ctypes.c_uint32)]


def _lib_declared() -> ctypes.CDLL:
    lib = _lib.lib()
    if id(lib) in _declared:
        return lib
    c = ctypes
    status = c.c_int
    for name, argtypes in {
        "tide_alloc_get_stats": [c.c_int, c.POINTER(Stats)],
        "tide_alloc_reset_peak_stats": [c.c_int],
        "tide_alloc_reset_accumulated_stats": [c.c_int],
        "tide_alloc_empty_cache": [c.c_int],
        "tide_alloc_set_memory_fraction": [c.c_int, c.c_double],
        "tide_alloc_record_stream": [c.c_void_p, c.c_void_p],
        "tide_alloc_mark_phase": [c.c_int, c.c_int],
        "tide_alloc_timeline": [c.c_int, c.POINTER(Sample), c.c_size_t, c.POINTER(c.c_size_t)],
        "tide_alloc_iterations": [c.c_int, c.POINTER(Iteration), c.c_size_t,
                                  c.POINTER(c.c_size_t)],
        "tide_alloc_headroom": [c.c_int, c.POINTER(Forecast)],
        "tide_alloc_last_oom": [c.c_int, c.POINTER(Oom), c.POINTER(c.c_int)],
        "tide_alloc_export_timeline": [c.c_int, c.c_char_p],
        "tide_alloc_trace_start": [c.c_int, c.c_size_t],
        "tide_alloc_trace_stop": [c.c_int, c.c_char_p],
    }.items():
        fn = getattr(lib, name)
        fn.restype = status
        fn.argtypes = argtypes
    lib.tide_alloc.restype = c.c_void_p
    lib.tide_alloc.argtypes = [c.c_size_t, c.c_int, c.c_void_p]
    lib.tide_free.restype = None
    lib.tide_free.argtypes = [c.c_void_p, c.c_size_t, c.c_int, c.c_void_p]
    _declared.add(id(lib))
    return lib


def _device(device: Any = None) -> int:
    """A device index: an int, a torch.device or "cuda:N"; None: the current CUDA device."""
    if device is None:
        import torch

        return torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    if isinstance(device, int):
        return device
    import torch

    d = torch.device(device)
    if d.type != "cuda":
        raise ValueError(f"tide's allocator manages CUDA devices, not {d}")
    return d.index if d.index is not None else _device(None)


_TOO_LATE = (
    "tide.torch.use_allocator(): PyTorch's CUDA allocator is already in use in this process "
    "({why}), and PyTorch cannot replace an allocator once it has been used. Call "
    "tide.torch.use_allocator() before anything touches CUDA: right after `import torch`, before "
    "creating CUDA tensors, moving a model with .cuda()/.to('cuda'), or calling torch.cuda "
    "functions that initialise CUDA; in a launcher script, in the process that trains, first."
)


def use_allocator():
    """Makes tide's caching allocator PyTorch's CUDA allocator, through
    torch.cuda.memory.CUDAPluggableAllocator and change_current_allocator.

    Must run before CUDA is initialised in this process; raises AllocatorError otherwise.
    Calling it again is harmless. Returns the CUDAPluggableAllocator.
    """
    global _installed
    import torch

    with _lock:
        if _installed is not None:
            return _installed
        if torch.cuda.is_initialized():
            raise AllocatorError(_TOO_LATE.format(why="CUDA is already initialised"))
        lib = _lib_declared()
        path = getattr(lib, "_name", None)
        if not path or not os.path.isfile(path):
            raise AllocatorError(f"tide.torch.use_allocator(): cannot locate libtide.so ({path!r})")
        # The same file libtide was loaded from: dlopen hands back the same library, so PyTorch
        # and tide's Python functions share one allocator.
        # tide_alloc_throwing, not tide_alloc: PyTorch keeps a NULL as the tensor's memory.
        pluggable = torch.cuda.memory.CUDAPluggableAllocator(path, ALLOCATE_FUNCTION, "tide_free")
        try:
            torch.cuda.memory.change_current_allocator(pluggable)
        except RuntimeError as e:
            raise AllocatorError(_TOO_LATE.format(why=f"PyTorch says: {e}")) from e
        _installed = pluggable
        _route_torch_memory_functions(torch)
        return pluggable


def is_using_allocator() -> bool:
    """Whether use_allocator() has installed tide's allocator in this process."""
    return _installed is not None


def _route_torch_memory_functions(torch: Any) -> None:
    """Makes PyTorch's memory statistics, empty_cache and mem_get_info answer with tide's
    allocator. Routed where torch/cuda/memory.py calls into C++, looked up at each call, so that
    functions a program imported before use_allocator() are routed too; once tide's allocator is
    PyTorch's it stays, and so do the routes."""
    routes = [
        # memory_stats, memory_stats_as_nested_dict, memory_allocated, max_memory_allocated,
        # memory_reserved, max_memory_reserved, memory_summary
        (torch._C, "torch._C", "_cuda_memoryStats", memory_stats_as_nested_dict),
        # reset_peak_memory_stats, reset_max_memory_allocated, reset_max_memory_cached
        (torch._C, "torch._C", "_cuda_resetPeakMemoryStats", reset_peak_memory_stats),
        (torch._C, "torch._C", "_cuda_resetAccumulatedMemoryStats",
         reset_accumulated_memory_stats),
        (torch._C, "torch._C", "_cuda_emptyCache", empty_cache),
        # mem_get_info: torch.cuda.cudart() is this module
        (getattr(torch._C, "_cudart", None), "torch._C._cudart", "cudaMemGetInfo", mem_get_info),
    ]
    for owner, owner_name, name, route in routes:
        key = f"{owner_name}.{name}"
        if key in _originals or not hasattr(owner, name):
            continue  # routed already, or a function this PyTorch does not have
        _originals[key] = getattr(owner, name)
        setattr(owner, name, route)


def original(name: str) -> Any:
    """PyTorch's own function that use_allocator() routed to tide's allocator, by its full name:
    "torch._C._cuda_memoryStats", "torch._C._cuda_resetPeakMemoryStats",
    "torch._C._cuda_resetAccumulatedMemoryStats", "torch._C._cuda_emptyCache",
    "torch._C._cudart.cudaMemGetInfo". Raises KeyError for a function that was not routed."""
    return _originals[name]


def _check(status: int) -> None:
    _lib.check(status)


def _stats(device: Any = None) -> Stats:
    s = Stats()
    _check(_lib_declared().tide_alloc_get_stats(_device(device), ctypes.byref(s)))
    return s


def _stat(current: int, peak: int = 0, allocated: int = 0, freed: int = 0) -> dict[str, int]:
    return {"current": current, "peak": peak, "allocated": allocated, "freed": freed}


def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    """tide's allocator statistics for `device` as torch.cuda.memory_stats_as_nested_dict() gives
    PyTorch's: the same keys, plus tide's own under "tide". Keys without a meaning in tide read as
    PyTorch's allocator reads them in its default configuration (docs/guide/allocator.md, "From PyTorch")."""
    s = _stats(device)
    out: dict[str, Any] = {
        name: {pool: _stat(*(getattr(getattr(s, name)[i], f) for f in _FIELDS))
               for i, pool in enumerate(_POOLS)}
        for name in _STATS
    }
    # tide keeps only the current value of these: peak and the totals read 0.
    for name in ("inactive_split_bytes", "inactive_split"):
        out[name] = {pool: _stat(getattr(s, name)[i]) for i, pool in enumerate(_POOLS)}
    out.update((name, getattr(s, name)) for name in _COUNTERS)
    # No meaning in tide: no max_split_size setting (blocks of any size are split, PyTorch's -1),
    # so no oversize blocks; a refusal by tide's cap counts in num_ooms; no private pools.
    out["max_split_size"] = -1
    out["oversize_allocations"] = _stat(0)
    out["oversize_segments"] = _stat(0)
    out["num_oom_rejections"] = 0
    out["reserved_bytes_by_private_pools"] = {}
    out["tide"] = {"memory_limit": s.memory_limit, "thread_cached_bytes": s.thread_cached_bytes,
                   "thread_cache_hits": s.thread_cache_hits,
                   "largest_free_block": s.largest_free_block, "growable_segments": s.growable}
    return out


def memory_stats(device: Any = None) -> dict[str, int]:
    """tide's allocator statistics for `device`, named as torch.cuda.memory_stats() names them
    ("allocated_bytes.all.current", "reserved_bytes.large_pool.peak", "num_alloc_retries",
    "num_ooms", ...), plus tide's own under "tide." keys: memory_stats_as_nested_dict() flattened
    as PyTorch flattens it."""
    out: dict[str, int] = {}

    def flatten(prefix: str, value: Any) -> None:
        if not isinstance(value, dict):
            out[prefix] = value
            return
        for key, inner in value.items():
            flatten(f"{prefix}.{key}" if prefix else key, inner)

    flatten("", memory_stats_as_nested_dict(device))
    return dict(sorted(out.items()))


def memory_allocated(device: Any = None) -> int:
    return _stats(device).allocated_bytes[0].current


def max_memory_allocated(device: Any = None) -> int:
    return _stats(device).allocated_bytes[0].peak


def memory_reserved(device: Any = None) -> int:
    return _stats(device).reserved_bytes[0].current


def max_memory_reserved(device: Any = None) -> int:
    return _stats(device).reserved_bytes[0].peak


def reset_peak_memory_stats(device: Any = None) -> None:
    _check(_lib_declared().tide_alloc_reset_peak_stats(_device(device)))


def reset_accumulated_memory_stats(device: Any = None) -> None:
    _check(_lib_declared().tide_alloc_reset_accumulated_stats(_device(device)))


def empty_cache() -> None:
    """Gives the cached free memory of every device back to the driver."""
    _check(_lib_declared().tide_alloc_empty_cache(-1))


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of `device`'s memory, as the driver tide allocates from reports them
    (the host stand-in's without a GPU)."""
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    _check(_lib.lib().tide_device_memory(_device(device), ctypes.byref(free), ctypes.byref(total)))
    return free.value, total.value


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Caps what tide's allocator holds on `device` at `fraction` of the device's memory."""
    _check(_lib_declared().tide_alloc_set_memory_fraction(_device(device), float(fraction)))


def record_stream(tensor, stream) -> None:
    """Tensor.record_stream(stream) for tensors allocated by tide: the memory is not reused before
    the work queued on `stream` until the tensor is freed has completed."""
    handle = getattr(stream, "cuda_stream", stream)
    _check(_lib_declared().tide_alloc_record_stream(ctypes.c_void_p(tensor.data_ptr()),
                                                    ctypes.c_void_p(handle)))


def mark_phase(phase: str, device: Any = None) -> None:
    """Marks the start of a phase: "forward", "backward", "update", or "end" (the iteration's
    end). device None: every device tide's allocator serves."""
    if phase not in _PHASES:
        raise ValueError(f"phase must be one of {sorted(_PHASES)}, not {phase!r}")
    d = -1 if device is None else _device(device)
    _check(_lib_declared().tide_alloc_mark_phase(d, _PHASES[phase]))


def timeline(device: Any = None, max_samples: int = 1 << 16) -> list[tuple[int, int, int]]:
    """The newest samples of the timeline: (t_ns, live_bytes, reserved_bytes), oldest first."""
    lib = _lib_declared()
    buf = (Sample * max_samples)()
    count = ctypes.c_size_t()
    _check(lib.tide_alloc_timeline(_device(device), buf, max_samples, ctypes.byref(count)))
    return [(s.t_ns, s.live_bytes, s.reserved_bytes) for s in buf[: count.value]]


def iteration_stats(device: Any = None, max_iterations: int = 1024) -> list[dict[str, Any]]:
    """Recent iterations, oldest first: bounds, phase starts and per-phase peaks (from marks, or
    detected from the memory curve: "detected" says which)."""
    lib = _lib_declared()
    buf = (Iteration * max_iterations)()
    count = ctypes.c_size_t()
    _check(lib.tide_alloc_iterations(_device(device), buf, max_iterations, ctypes.byref(count)))
    out = []
    for it in buf[: count.value]:
        phases = {}
        for p, name in enumerate(("forward", "backward", "update")):
            if it.phase_seen & (1 << p):
                phases[name] = {"start_ns": it.phase_start_ns[p],
                                "peak_live_bytes": it.peak_live_bytes[p],
                                "peak_reserved_bytes": it.peak_reserved_bytes[p]}
        out.append({"index": it.index, "start_ns": it.start_ns, "end_ns": it.end_ns,
                    "peak_live_bytes": it.peak_live_all_bytes,
                    "min_live_bytes": it.min_live_bytes, "phases": phases,
                    "detected": bool(it.detected)})
    return out


def headroom(device: Any = None) -> dict[str, int]:
    """The headroom forecast: bytes the coming update phase can use safely ("headroom_bytes"),
    from the recent iterations' update-phase peaks, the memory limit and the safety margin; and
    bytes that can be held through a whole iteration, forward and backward included
    ("held_headroom_bytes", from the iterations' highest peaks; 0 before any iteration)."""
    f = Forecast()
    _check(_lib_declared().tide_alloc_headroom(_device(device), ctypes.byref(f)))
    return {"headroom_bytes": f.headroom_bytes, "update_peak_bytes": f.update_peak_bytes,
            "limit_bytes": f.limit_bytes, "margin_bytes": f.margin_bytes,
            "iterations": f.iterations, "detected": bool(f.detected),
            "held_headroom_bytes": f.held_headroom_bytes,
            "iteration_peak_bytes": f.iteration_peak_bytes}


def last_oom(device: Any = None) -> dict[str, int] | None:
    """The state at the last allocation that failed for lack of memory, or None."""
    o = Oom()
    found = ctypes.c_int()
    _check(_lib_declared().tide_alloc_last_oom(_device(device), ctypes.byref(o),
                                               ctypes.byref(found)))
    if not found.value:
        return None
    return {name: getattr(o, name) for name, _ in Oom._fields_ if name != "struct_size"}


def export_timeline(path: str | os.PathLike, device: Any = None) -> None:
    """Writes the timeline, phases, marks and out-of-memory events as Chrome trace JSON (open it
    in ui.perfetto.dev or chrome://tracing)."""
    _check(_lib_declared().tide_alloc_export_timeline(_device(device), os.fsencode(path)))


def start_trace(device: Any = None, max_events: int = 10_000_000) -> None:
    """Starts recording allocation events (what is live now is recorded as allocated)."""
    _check(_lib_declared().tide_alloc_trace_start(_device(device), max_events))


def stop_trace(path: str | os.PathLike | None, device: Any = None) -> None:
    """Stops recording and writes the events to `path` (None: discards them); `tide replay PATH`
    runs them back through the allocator."""
    encoded = None if path is None else os.fsencode(path)
    _check(_lib_declared().tide_alloc_trace_stop(_device(device), encoded))

"""tide for PyTorch: the offloading optimizers (tide.torch.optim), the device caching allocator
and its memory telemetry (tide.torch.allocator).

Kept a plain export list: each part of tide.torch lives in its own module.
"""

from tide.torch.allocator import (
    AllocatorError,
    empty_cache,
    export_timeline,
    headroom,
    is_using_allocator,
    iteration_stats,
    last_oom,
    mark_phase,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_stats_as_nested_dict,
    record_stream,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
    start_trace,
    stop_trace,
    timeline,
    use_allocator,
)
from tide.torch.optim import Adam, AdamW
from tide.torch.ddp import register_ddp_offload
from tide.torch._runtime import cpu_mode
from tide.torch.plot import memory_timeline
from tide.torch.tide_run import install_for_tide_run

__all__ = [
    "Adam",
    "AdamW",
    "cpu_mode",
    "AllocatorError",
    "empty_cache",
    "export_timeline",
    "headroom",
    "install_for_tide_run",
    "is_using_allocator",
    "iteration_stats",
    "last_oom",
    "mark_phase",
    "memory_timeline",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "record_stream",
    "register_ddp_offload",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "set_per_process_memory_fraction",
    "start_trace",
    "stop_trace",
    "timeline",
    "use_allocator",
]

"""ctypes binding of the executor's C ABI (include/tide/tide.h, "executor"): one tide_optimizer,
the optimizer state of one bucket of parameters in pinned host memory and its update phases.

tide.torch.optim drives it; nothing here knows about param groups or torch.optim.
"""

from __future__ import annotations

import ctypes
import threading
import warnings
import weakref
from typing import Any

from tide import _lib
from tide.kernels import AdamHyper

c = ctypes

PLACEMENT_AUTO, PLACEMENT_CPU, PLACEMENT_GPU, PLACEMENT_INTERLEAVE = 0, 1, 2, 3
# How a step ended (tide_step_result.outcome), and each subgroup (its subgroup_outcome).
COMPLETED, COMPLETED_AFTER_FAULT, NOT_HAPPENED, INCOMPLETE = 0, 1, 2, 3
UPDATED, UNWRITTEN, NOT_UPDATED = 0, 1, 2
# tide_step_request.flags: what the one step call does around the update phase.
STEP_HEADROOM_FORECAST, STEP_MARK_PHASES, STEP_RELEASE_BUFFERS = 1, 2, 4


class Rates(c.Structure):
    _fields_ = [(name, c.c_double) for name in (
        "cpu_update", "cpu_update_contended", "h2d", "d2h", "h2d_duplex", "d2h_duplex",
        "gpu_update")]


class HostMemoryRates(_lib.Versioned):
    _fields_ = [("struct_size", c.c_size_t), ("host_memory", c.c_double),
                ("host_memory_contended", c.c_double)]


class ParamSlice(c.Structure):
    _fields_ = [("subgroup", c.c_uint64), ("offset", c.c_uint64), ("count", c.c_uint64),
                ("device_ptr", c.c_uint64)]


class Options(_lib.Versioned):
    _fields_ = [("struct_size", c.c_size_t), ("device", c.c_int32), ("grad_dtype", c.c_int32), ("param_dtype", c.c_int32),
                ("gradients_on_gpu", c.c_int32), ("max_buffers", c.c_uint64),
                ("use_rates", c.c_int32), ("refine", c.c_int32), ("rates", Rates),
                ("cpu_threads", c.c_int32), ("state_dtype", c.c_int32),
                ("master_dtype", c.c_int32), ("host_params", c.c_int32),
                ("host_memory_rate", c.c_double), ("host_memory_contended_rate", c.c_double)]


class SubgroupBuffers(c.Structure):
    _fields_ = [("param", c.c_void_p), ("exp_avg", c.c_void_p), ("exp_avg_sq", c.c_void_p),
                ("grad", c.c_void_p), ("count", c.c_uint64)]


class PlacementPolicy(c.Structure):
    _fields_ = [("kind", c.c_int32), ("k", c.c_int32)]


class StepRequest(_lib.Versioned):
    _fields_ = [("struct_size", c.c_size_t), ("hyper", AdamHyper),
                ("policy", c.POINTER(PlacementPolicy)), ("headroom_bytes", c.c_uint64),
                ("flags", c.c_uint32), ("frozen", c.POINTER(c.c_uint8)),
                ("frozen_count", c.c_size_t)]


class StepResult(_lib.Versioned):
    """tide_step_result: how one step ended, and what it did."""
    _fields_ = [("struct_size", c.c_size_t), ("outcome", c.c_int32), ("status", c.c_int32),
                ("reason", c.c_char_p), ("subgroup_outcome", c.POINTER(c.c_uint8)),
                ("plan_device", c.POINTER(c.c_uint8)),
                ("buffers", c.POINTER(SubgroupBuffers)), ("placement", PlacementPolicy),
                ("headroom_bytes", c.c_uint64)] + [
        (name, c.c_double) for name in (
            "seconds", "predicted_seconds", "all_cpu_seconds", "cpu_busy_seconds")] + [
        (name, c.c_uint64) for name in (
            "gpu_subgroups", "cpu_subgroups", "fallback_subgroups", "gpu_params",
            "buffers_in_flight", "gpu_bytes", "nonfinite", "headroom_cap", "rolled_forward",
            "unwritten", "not_updated", "resident_subgroups", "resident_bytes",
            "evicted_subgroups", "evicted_bytes")] + [
        ("evict_seconds", c.c_double), ("cache_releases", c.c_uint64)] + [
        (name, c.c_double) for name in (
            "gpu_busy_seconds", "h2d_busy_seconds", "d2h_busy_seconds")] + [
        (name, c.c_uint64) for name in ("withdrawn_gradients", "withdrawn_bytes",
                                        "kept_gradients")]


class PlanSummary(_lib.Versioned):
    _fields_ = [("struct_size", c.c_size_t)] + [(name, c.c_double) for name in (
        "phase_seconds", "cpu_side_seconds", "gpu_side_seconds", "all_cpu_seconds")] + [
        (name, c.c_uint64) for name in ("buffers", "buffer_bytes", "gpu_bytes")] + [
        ("optimal", c.c_int)]


_declared: set[int] = set()
_declare_lock = threading.Lock()


def _cdll() -> c.CDLL:
    lib = _lib.lib()
    with _declare_lock:
        if id(lib) not in _declared:
            p = c.POINTER
            opt = c.c_void_p
            for name, argtypes in {
                "tide_optimizer_options_init": [p(Options)],
                "tide_optimizer_options_check": [p(Options)],
                "tide_optimizer_create": [p(c.c_uint64), c.c_size_t, p(ParamSlice), c.c_size_t,
                                          p(Options), c.c_void_p, p(opt)],
                "tide_optimizer_destroy": [opt],
                "tide_optimizer_buffers": [opt, c.c_size_t, p(SubgroupBuffers)],
                "tide_optimizer_q8_scales": [opt, c.c_size_t, p(c.c_void_p), p(c.c_void_p),
                                             p(c.c_uint64)],
                "tide_optimizer_master_bf16": [opt, c.c_size_t, p(c.c_void_p), p(c.c_void_p)],
                "tide_q8_code_maps": [p(c.c_void_p)] * 4,
                "tide_optimizer_offload_gradient": [opt, c.c_size_t, c.c_uint64, c.c_uint64,
                                                    c.c_uint64, c.c_int32, c.c_void_p],
                "tide_optimizer_offload_stream": [opt, p(c.c_void_p)],
                "tide_optimizer_grad_stats": [opt, p(c.c_double), p(c.c_uint64)],
                "tide_optimizer_prepare": [opt, p(PlacementPolicy), c.c_uint64],
                "tide_optimizer_ready": [opt, p(AdamHyper)],
                "tide_optimizer_write_params": [opt],
                "tide_optimizer_set_frozen": [opt, p(c.c_uint8), c.c_size_t],
                "tide_optimizer_set_gradients": [opt, p(c.c_uint64), c.c_size_t],
                "tide_optimizer_step": [opt, p(StepRequest), p(StepResult)],
                "tide_optimizer_release_buffers": [opt],
                "tide_optimizer_sync_state": [opt, c.c_int32],
                "tide_optimizer_evict": [opt, c.c_uint64, p(c.c_uint64)],
                "tide_optimizer_last_plan": [opt, p(c.c_uint8), p(c.c_uint32), p(PlanSummary)],
                "tide_optimizer_rates": [opt, p(Rates)],
                "tide_optimizer_host_memory_rates": [opt, p(HostMemoryRates)],
                "tide_optimizer_pageable": [opt, p(c.c_size_t), p(c.c_uint64)],
                "tide_optimizer_set_state_rounding": [opt, c.c_int32, c.c_uint64],
            }.items():
                fn = getattr(lib, name)
                fn.restype = c.c_int
                fn.argtypes = argtypes
            _declared.add(id(lib))
    return lib


def _ref(value: c.Structure | None) -> Any:
    return None if value is None else c.byref(value)


def policy(kind: int, k: int = 0) -> PlacementPolicy:
    return PlacementPolicy(kind, k)


def options(*, device: int = 0, dtype: int = 1, cpu_threads: int = 0,
            gradients_on_gpu: bool | None = None, state_dtype: int = 0, master_dtype: int = 0,
            host_params: bool = False) -> Options:
    """tide_optimizer_options: tide's defaults, then these."""
    out = Options()
    _lib.check(_cdll().tide_optimizer_options_init(c.byref(out)))
    out.device = device
    out.grad_dtype = dtype
    out.param_dtype = dtype
    out.cpu_threads = cpu_threads
    if gradients_on_gpu is not None:  # None: TIDE_GRADIENTS_AUTO, the library's default
        out.gradients_on_gpu = int(gradients_on_gpu)
    out.state_dtype = state_dtype
    out.master_dtype = master_dtype
    out.host_params = int(host_params)
    return out


def check_options(given: Options) -> None:
    """The rules between the options' fields, checked by tide (tide_optimizer_options_check):
    ValueError with tide's message when they do not go together."""
    status = _cdll().tide_optimizer_options_check(c.byref(given))
    if status == _lib.TIDE_ERROR_INVALID_ARGUMENT:
        raise ValueError(_lib.lib().tide_last_error().decode())
    _lib.check(status)


class _Native:
    """A tide_optimizer handle and the pinned memory it owns. Memory handed out (memory()) holds
    it: the handle is destroyed when its executor is closed and nothing views that memory any
    more, never under a view."""

    def __init__(self, lib: c.CDLL, handle: c.c_void_p):
        self._lib = lib
        self._handle = handle
        self._lock = threading.Lock()
        self._views = 0  # ctypes arrays over the memory still alive
        self._closed = False

    @property
    def views(self) -> int:
        return self._views

    @property
    def destroyed(self) -> bool:
        """Destroyed, or given up on (a failed destroy leaves the memory allocated)."""
        return not self._handle

    def memory(self, address: int, nbytes: int) -> c.Array:
        array = (c.c_char * nbytes).from_address(address)
        with self._lock:
            self._views += 1
        # The finalizer holds this object: the memory stays until the array (and whatever it
        # exports its buffer to, a tensor's storage) is gone. Not at exit: the process ends.
        weakref.finalize(array, self._view_gone).atexit = False
        return array

    def _view_gone(self) -> None:
        with self._lock:
            self._views -= 1
            last = self._closed and self._views == 0
        if last:
            self._destroy()

    def close(self) -> None:
        """Destroys the handle now, or when the last view of its memory goes."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            now = self._views == 0
        if now:
            self._destroy()

    def _destroy(self) -> None:
        # Mostly from the garbage collector (the optimizer's end, the last view's): an error
        # here has no caller to go to.
        handle, self._handle = self._handle, c.c_void_p()
        if handle and self._lib.tide_optimizer_destroy(handle) != _lib.TIDE_OK:
            warnings.warn("tide: an optimizer could not be destroyed, its memory stays "
                          f"allocated: {self._lib.tide_last_error().decode()}", RuntimeWarning,
                          stacklevel=2)


class Executor:
    """One tide_optimizer: `subgroup_params[i]` elements per subgroup, placed in the model by
    `slices` (subgroup, offset, count, device pointer)."""

    def __init__(self, subgroup_params: list[int], slices: list[tuple[int, int, int, int]], *,
                 device: int, dtype: int, cpu_threads: int = 0,
                 gradients_on_gpu: bool | None = None,
                 state_dtype: int = 0, master_dtype: int = 0, host_params: bool = False):
        lib = _cdll()
        given = options(device=device, dtype=dtype, cpu_threads=cpu_threads,
                        gradients_on_gpu=gradients_on_gpu, state_dtype=state_dtype,
                        master_dtype=master_dtype, host_params=host_params)
        sizes = (c.c_uint64 * len(subgroup_params))(*subgroup_params)
        placed = (ParamSlice * len(slices))(*[ParamSlice(*s) for s in slices])
        handle = c.c_void_p()
        _lib.check(lib.tide_optimizer_create(sizes, len(subgroup_params), placed, len(slices),
                                             c.byref(given), None, c.byref(handle)))
        self._native = _Native(lib, handle)
        self._handle = handle
        self._lib = lib
        self.subgroups = len(subgroup_params)

    def close(self) -> None:
        """No more calls: the optimizer is destroyed, at once or, while CPU tensors view its
        pinned memory (memory()), when the last of them is gone."""
        if self._handle:
            self._handle = c.c_void_p()
            self._native.close()

    @property
    def native(self) -> _Native:
        return self._native

    def memory(self, address: int, nbytes: int) -> c.Array:
        """`nbytes` of this optimizer's pinned memory at `address` as a ctypes array (a buffer
        that torch.frombuffer can view) that keeps the memory allocated as long as it lives."""
        return self._native.memory(address, nbytes)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown: nothing left to report to)
            pass

    def buffers(self, subgroup: int) -> SubgroupBuffers:
        """Its pinned buffers: the state's move at a step (valid until the next one)."""
        out = SubgroupBuffers()
        _lib.check(self._lib.tide_optimizer_buffers(self._handle, subgroup, c.byref(out)))
        return out

    def set_state_rounding(self, stochastic: bool, seed: int) -> None:
        """bf16 moments rounded stochastically with `seed` from the next step on, or to
        nearest (tide_optimizer_set_state_rounding)."""
        _lib.check(self._lib.tide_optimizer_set_state_rounding(self._handle, int(stochastic),
                                                               seed & (2**64 - 1)))

    def q8_scales(self, subgroup: int) -> tuple[int, int, int]:
        """8-bit moments: the addresses of the subgroup's exp_avg and exp_avg_sq block scales
        (fp32) and how many blocks each has (valid as buffers()' pointers)."""
        m, v, blocks = c.c_void_p(), c.c_void_p(), c.c_uint64()
        _lib.check(self._lib.tide_optimizer_q8_scales(self._handle, subgroup, c.byref(m),
                                                      c.byref(v), c.byref(blocks)))
        return m.value or 0, v.value or 0, blocks.value

    def master_bf16(self, subgroup: int) -> tuple[int, int]:
        """bf16 master weights: the addresses of the subgroup's bf16 weights and of their bf16
        compensation (valid as buffers()' pointers); (0, 0) with an fp32 master."""
        w, comp = c.c_void_p(), c.c_void_p()
        _lib.check(self._lib.tide_optimizer_master_bf16(self._handle, subgroup, c.byref(w),
                                                        c.byref(comp)))
        return w.value or 0, comp.value or 0

    def offload_gradient(self, subgroup: int, offset: int, src: int, count: int, dtype: int,
                         stream: int | None) -> None:
        _lib.check(self._lib.tide_optimizer_offload_gradient(
            self._handle, subgroup, offset, src, count, dtype, stream))

    def offload_stream(self) -> int:
        out = c.c_void_p()
        _lib.check(self._lib.tide_optimizer_offload_stream(self._handle, c.byref(out)))
        return out.value or 0

    def grad_stats(self) -> tuple[float, int]:
        sum_squares = c.c_double()
        nonfinite = c.c_uint64()
        _lib.check(self._lib.tide_optimizer_grad_stats(self._handle, c.byref(sum_squares),
                                                       c.byref(nonfinite)))
        return sum_squares.value, nonfinite.value

    def prepare(self, placement: PlacementPolicy | None, headroom_bytes: int) -> None:
        """placement None: TIDE_PLACEMENT, else auto."""
        _lib.check(self._lib.tide_optimizer_prepare(self._handle, _ref(placement),
                                                    headroom_bytes))

    def ready(self, hyper: AdamHyper) -> None:
        """What the step needs before it can change anything (raises: nothing changed)."""
        _lib.check(self._lib.tide_optimizer_ready(self._handle, c.byref(hyper)))

    def step(self, hyper: AdamHyper, placement: PlacementPolicy | None, headroom_bytes: int, *,
             flags: int = 0, frozen: list[bool] | None = None) -> StepResult:
        """One step in one call (tide_optimizer_step): placement None: TIDE_PLACEMENT, else
        auto; `flags` STEP_*; `frozen` per slice, set first (None: as before). Raises only when
        the step did not happen; otherwise returns its result, whose subgroup_outcome,
        plan_device and buffers arrays (one element per subgroup) are filled."""
        request = StepRequest(hyper=hyper, headroom_bytes=headroom_bytes, flags=flags)
        if placement is not None:
            request.policy = c.pointer(placement)
        if frozen is not None:
            flags_array = (c.c_uint8 * len(frozen))(*[1 if f else 0 for f in frozen])
            request.frozen = c.cast(flags_array, c.POINTER(c.c_uint8))
            request.frozen_count = len(frozen)
        result = StepResult()
        outcome = (c.c_uint8 * self.subgroups)()
        device = (c.c_uint8 * self.subgroups)()
        buffers = (SubgroupBuffers * self.subgroups)()
        result.subgroup_outcome = c.cast(outcome, c.POINTER(c.c_uint8))
        result.plan_device = c.cast(device, c.POINTER(c.c_uint8))
        result.buffers = c.cast(buffers, c.POINTER(SubgroupBuffers))
        status = self._lib.tide_optimizer_step(self._handle, c.byref(request), c.byref(result))
        _lib.check(status)
        # The arrays outlive the call with the result.
        result.outcome_list = list(outcome)
        result.device_list = list(device)
        result.buffer_list = list(buffers)
        result.reason_text = (result.reason or b"").decode()
        return result

    def write_params(self) -> None:
        _lib.check(self._lib.tide_optimizer_write_params(self._handle))

    def set_frozen(self, frozen: list[bool]) -> None:
        """Per slice (in the order given at creation): leave its elements as they are."""
        flags = (c.c_uint8 * len(frozen))(*[1 if f else 0 for f in frozen])
        _lib.check(self._lib.tide_optimizer_set_frozen(self._handle, flags, len(frozen)))

    def set_gradients(self, addresses: list[int]) -> None:
        """host_params: per slice (in the order given at creation), the host address of its
        gradient for the coming step (0: none; the slice must be frozen), read in place."""
        grads = (c.c_uint64 * len(addresses))(*addresses)
        _lib.check(self._lib.tide_optimizer_set_gradients(self._handle, grads, len(addresses)))

    def release_buffers(self) -> None:
        _lib.check(self._lib.tide_optimizer_release_buffers(self._handle))

    def sync_state(self, written: bool = True) -> None:
        """Resident subgroups' pinned buffers made current (tide_optimizer_sync_state); with
        `written`, what is then written there is the state."""
        _lib.check(self._lib.tide_optimizer_sync_state(self._handle, 1 if written else 0))

    def evict(self, max_bytes: int = (1 << 64) - 1) -> int:
        """Ends residency (tide_optimizer_evict) until `max_bytes` were freed; the bytes freed."""
        freed = c.c_uint64(0)
        _lib.check(self._lib.tide_optimizer_evict(self._handle, max_bytes, c.byref(freed)))
        return freed.value

    def last_plan(self) -> tuple[list[int], PlanSummary]:
        device = (c.c_uint8 * self.subgroups)()
        order = (c.c_uint32 * self.subgroups)()
        summary = PlanSummary()
        _lib.check(self._lib.tide_optimizer_last_plan(self._handle, device, order,
                                                      c.byref(summary)))
        return list(device), summary

    def pageable(self) -> tuple[int, int]:
        """Subgroups held in pageable memory (updated on the CPU only) and their bytes."""
        subgroups, size = c.c_size_t(0), c.c_uint64(0)
        _lib.check(self._lib.tide_optimizer_pageable(self._handle, c.byref(subgroups),
                                                     c.byref(size)))
        return subgroups.value, size.value

    def rates(self) -> dict[str, Any]:
        out = Rates()
        _lib.check(self._lib.tide_optimizer_rates(self._handle, c.byref(out)))
        host = HostMemoryRates()
        _lib.check(self._lib.tide_optimizer_host_memory_rates(self._handle, c.byref(host)))
        return {**{name: getattr(out, name) for name, _ in Rates._fields_},
                "host_memory": host.host_memory,
                "host_memory_contended": host.host_memory_contended}

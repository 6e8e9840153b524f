"""Pinned host arenas: page-locked host memory for optimizer state, gradient and staging buffers,
handed out as CPU tensors without copies (include/tide/tide.h, "pinned host arenas").

An arena pins (registers with the CUDA driver) large chunks once and carves buffers out of them,
so that copies between these tensors and the GPU are fast and truly asynchronous::

    from tide import pinned
    arena = pinned.PinnedArena()
    exp_avg = arena.zeros((n,), dtype=torch.float32)   # a CPU tensor in pinned memory
    ...
    del exp_avg        # the memory goes back to the arena when no tensor uses it any more

A tensor from an arena owns its memory the way any tensor does: views and slices keep it alive,
and the buffer returns to the arena when the last of them is gone. An arena lives as long as any
of its tensors does. Without a CUDA driver an arena still works, on ordinary host memory
(``arena.pinned`` is False, and libtide says so once on stderr).
"""

from __future__ import annotations

import ctypes
import math
import threading
from typing import Sequence

import torch

from tide import _lib


class PinnedOptions(_lib.Versioned):
    """tide_pinned_options."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("chunk_bytes", ctypes.c_size_t),
        ("direct_bytes", ctypes.c_size_t),
        ("retain_bytes", ctypes.c_size_t),
        ("numa_node", ctypes.c_int),
        ("device", ctypes.c_int),
        ("huge_pages", ctypes.c_int),
        ("touch_threads", ctypes.c_int),
    ]


class PinnedStats(_lib.Versioned):
    """tide_pinned_stats."""

    _fields_ = [("struct_size", ctypes.c_size_t)] + [
        (name, ctypes.c_uint64)
        for name in (
            "requested_bytes",
            "peak_requested_bytes",
            "allocated_bytes",
            "jemalloc_allocated_bytes",
            "jemalloc_extent_bytes",
            "direct_bytes",
            "pinned_bytes",
            "peak_pinned_bytes",
            "free_chunk_bytes",
            "chunks",
            "chunks_mapped",
            "chunks_released",
            "unregister_failures",
            "allocations",
            "frees",
            "register_ns",
            "unregister_ns",
            "touch_ns",
            "pinned",
        )
    ]


class NodePinned(_lib.Versioned):
    """tide_node_pinned."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("node_limit_bytes", ctypes.c_uint64),
        ("rank_limit_bytes", ctypes.c_uint64),
        ("pinned_bytes", ctypes.c_uint64),
        ("peak_pinned_bytes", ctypes.c_uint64),
        ("local_rank", ctypes.c_int32),
        ("local_ranks", ctypes.c_int32),
    ]


_declared = False
_declare_lock = threading.Lock()


def _api() -> ctypes.CDLL:
    """libtide.so with the pinned-arena functions' signatures declared (once)."""
    global _declared
    lib = _lib.lib()
    if _declared:
        return lib
    with _declare_lock:
        if not _declared:
            arena_p = ctypes.c_void_p
            for name, argtypes in {
                "tide_pinned_options_init": [ctypes.POINTER(PinnedOptions)],
                "tide_pinned_arena_create": [
                    ctypes.POINTER(PinnedOptions),
                    ctypes.POINTER(ctypes.c_void_p),
                ],
                "tide_pinned_arena_destroy": [arena_p],
                "tide_pinned_alloc": [
                    arena_p,
                    ctypes.c_size_t,
                    ctypes.c_size_t,
                    ctypes.POINTER(ctypes.c_void_p),
                ],
                "tide_pinned_free": [arena_p, ctypes.c_void_p, ctypes.c_size_t],
                "tide_pinned_arena_trim": [arena_p],
                "tide_pinned_arena_stats": [arena_p, ctypes.POINTER(PinnedStats)],
                "tide_node_pinned_stats": [ctypes.POINTER(NodePinned)],
            }.items():
                fn = getattr(lib, name)
                fn.restype = ctypes.c_int
                fn.argtypes = argtypes
            _declared = True
    return lib


class PinnedBuffer:
    """One allocation from an arena. It is freed when this object is garbage: tensors made by
    :meth:`as_tensor` keep it alive, so the memory lives exactly as long as they do."""

    __slots__ = ("arena", "ptr", "nbytes", "__weakref__")

    def __init__(self, arena: PinnedArena, ptr: int, nbytes: int):
        self.arena = arena
        self.ptr = ptr
        self.nbytes = nbytes

    def as_tensor(self, dtype: torch.dtype = torch.uint8,
                  shape: Sequence[int] | int | None = None) -> torch.Tensor:
        """A CPU tensor on this buffer's memory (no copy), 1-D over the whole buffer unless
        `shape` says otherwise. The tensor and its views keep the buffer alive."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        if shape is None:
            shape = (self.nbytes // itemsize,)
        elif isinstance(shape, int):
            shape = (shape,)
        count = math.prod(shape)
        if count * itemsize > self.nbytes:
            raise ValueError(f"{tuple(shape)} of {dtype} needs {count * itemsize} bytes; "
                             f"the buffer has {self.nbytes}")
        if count == 0:
            return torch.empty(tuple(shape), dtype=dtype)
        # A ctypes array over the memory exports it through the buffer protocol;
        # torch.frombuffer keeps the array alive as long as the tensor's storage, and the array
        # keeps this buffer alive.
        array = (ctypes.c_uint8 * (count * itemsize)).from_address(self.ptr)
        array._tide_owner = self  # type: ignore[attr-defined]
        return torch.frombuffer(array, dtype=dtype, count=count).view(tuple(shape))

    def __del__(self):
        try:
            self.arena._free(self.ptr, self.nbytes)
        except Exception:  # interpreter shutdown: the module may be half torn down
            pass


class PinnedArena:
    """A pinned host arena (tide_pinned_arena). Options left as None take their defaults from the
    TIDE_PINNED_* variables (see ``tide env``)."""

    def __init__(self, *, chunk_bytes: int | None = None, direct_bytes: int | None = None,
                 retain_bytes: int | None = None, numa_node: int | None = None,
                 device: int | None = None, huge_pages: bool | None = None,
                 touch_threads: int | None = None):
        lib = _api()
        options = PinnedOptions()
        _lib.check(lib.tide_pinned_options_init(ctypes.byref(options)))
        for name, value in (("chunk_bytes", chunk_bytes), ("direct_bytes", direct_bytes),
                            ("retain_bytes", retain_bytes), ("numa_node", numa_node),
                            ("device", device), ("touch_threads", touch_threads)):
            if value is not None:
                setattr(options, name, value)
        if huge_pages is not None:
            options.huge_pages = 1 if huge_pages else 0
        handle = ctypes.c_void_p()
        _lib.check(lib.tide_pinned_arena_create(ctypes.byref(options), ctypes.byref(handle)))
        self._handle: int | None = handle.value
        # Reentrant: a buffer can be garbage-collected (and freed) while this thread holds it.
        self._lock = threading.RLock()
        self._live = 0
        self.options = options

    # -- allocation -------------------------------------------------------------------------

    def alloc(self, nbytes: int, alignment: int = 0) -> PinnedBuffer:
        """`nbytes` of pinned memory (alignment 0: 64 bytes)."""
        if nbytes <= 0:
            raise ValueError("nbytes must be positive")
        ptr = ctypes.c_void_p()
        _lib.check(_api().tide_pinned_alloc(self._require_open(), nbytes, alignment,
                                            ctypes.byref(ptr)))
        with self._lock:
            self._live += 1
        return PinnedBuffer(self, ptr.value, nbytes)

    def empty(self, shape: Sequence[int] | int, dtype: torch.dtype = torch.float32,
              alignment: int = 0) -> torch.Tensor:
        """An uninitialised CPU tensor in pinned memory."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        return self.alloc(nbytes, alignment).as_tensor(dtype, shape)

    def zeros(self, shape: Sequence[int] | int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.empty(shape, dtype).zero_()

    def empty_like(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.empty(tensor.shape, tensor.dtype)

    def copy_of(self, tensor: torch.Tensor) -> torch.Tensor:
        """A pinned copy of `tensor` (e.g. to move optimizer state into the arena)."""
        return self.empty_like(tensor).copy_(tensor)

    def _free(self, ptr: int, nbytes: int) -> None:
        with self._lock:
            if self._handle is None:
                return  # destroyed with the arena
            _lib.check(_api().tide_pinned_free(self._handle, ptr, nbytes))
            self._live -= 1

    # -- the arena ----------------------------------------------------------------------------

    @property
    def pinned(self) -> bool:
        """Whether the memory is registered with a CUDA driver (False without one)."""
        return bool(self.stats()["pinned"])

    @property
    def live_buffers(self) -> int:
        return self._live

    def stats(self) -> dict:
        """tide_pinned_stats as a dict (bytes, counts, nanoseconds; "pinned" is a bool)."""
        stats = PinnedStats()
        _lib.check(_api().tide_pinned_arena_stats(self._require_open(), ctypes.byref(stats)))
        out = {name: getattr(stats, name) for name, _ in PinnedStats._fields_}
        out["pinned"] = bool(out["pinned"])
        return out

    def trim(self) -> None:
        """Unregisters and unmaps the chunks nothing uses now."""
        _lib.check(_api().tide_pinned_arena_trim(self._require_open()))

    def close(self) -> None:
        """Destroys the arena. Refused (TideError) while tensors still use its memory."""
        with self._lock:
            if self._handle is None:
                return
            if self._live:
                raise _lib.TideError(f"tide: pinned arena still has {self._live} live buffers "
                                     "(tensors using its memory); drop them first")
            handle, self._handle = self._handle, None
        _lib.check(_api().tide_pinned_arena_destroy(handle))

    def _require_open(self) -> int:
        if self._handle is None:
            raise _lib.TideError("tide: the pinned arena is closed")
        return self._handle

    def __enter__(self) -> PinnedArena:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        # Only reached when no buffer refers to the arena any more.
        try:
            self.close()
        except Exception:
            pass


def node_stats() -> dict:
    """This process's pinned memory over all its arenas against its share of the node's cap
    (TIDE_NODE_PINNED_LIMIT split equally between the LOCAL_WORLD_SIZE ranks): node_limit_bytes,
    rank_limit_bytes (0: no limit), pinned_bytes, peak_pinned_bytes, local_rank, local_ranks."""
    stats = NodePinned()
    _lib.check(_api().tide_node_pinned_stats(ctypes.byref(stats)))
    return {name: getattr(stats, name) for name, _ in NodePinned._fields_}


_default: PinnedArena | None = None
_default_lock = threading.Lock()


def default_arena() -> PinnedArena:
    """The process's shared arena, made on first use with the TIDE_PINNED_* defaults."""
    global _default
    with _default_lock:
        if _default is None:
            _default = PinnedArena()
        return _default


def empty(shape: Sequence[int] | int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised CPU tensor in the default arena's pinned memory."""
    return default_arena().empty(shape, dtype)

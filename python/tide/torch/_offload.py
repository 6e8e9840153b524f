"""Gradient offload: each gradient is copied into its subgroups' pinned buffers as soon as
backward produced it (a post-accumulate-grad hook; tide_optimizer_offload_gradient returns at
once, the copy runs on tide's side stream), and what step() needs to know afterwards: which
gradients changed after their hook ran (torch.nn.utils.clip_grad_norm_, GradScaler.unscale_, a
manual `p.grad.mul_`: seen by their version counter and offloaded again), which parameters were
written from outside (model.load_state_dict: their master weights are re-read), and which have no
gradient at all.

A sharded (FSDP2 DTensor) parameter's gradient is read at step(), not in the hook: torch's
in-place ops on DTensor gradients (clip_grad_norm_'s _foreach_mul_) bump no version counter that
tide could see, so a copy taken in the hook could miss them.
"""

from __future__ import annotations

from typing import Any

import torch

from tide.torch import allocator
from tide.torch._bucket import Bucket, layout_of
from tide.torch._distributed import is_sharded, local


class GradientOffload:
    """The offload of the gradients of the parameters in `where` (id(param) -> (bucket, index)),
    CUDA tensors, or CPU tensors in CPU mode (`cpu`)."""

    def __init__(self, where: dict[int, tuple[Bucket, int]], cpu: bool):
        self.where = where
        self.cpu = cpu
        self.hooks: list[Any] = []  # the post-accumulate-grad hooks, removed with the optimizer
        self._offloaded: dict[int, tuple[torch.Tensor, int]] = {}  # id(param) -> (grad, version)
        self._keepalive: list[torch.Tensor] = []  # gradients whose offload may be in flight
        self._streams: dict[int, Any] = {}

    def _stream(self, bucket: Bucket) -> Any:
        key = id(bucket)
        if key not in self._streams:
            self._streams[key] = torch.cuda.ExternalStream(
                bucket.executor.offload_stream(), device=bucket.params[0].device)
        return self._streams[key]

    def on_grad(self, p: torch.Tensor) -> None:
        """The hook: p's gradient is ready."""
        if id(p) in self.where and p.grad is not None and not is_sharded(p):
            bucket, i = self.where[id(p)]
            if layout_of(p) == bucket.layouts[i]:
                self.offload(p)
            # else: step() raises, before reading or writing anything through tide's slices

    def offload(self, p: torch.Tensor) -> None:
        bucket, i = self.where[id(p)]
        bucket.check_layout(i)  # the copies below read and write as many elements as it had
        grad = p.grad
        source = local(grad)
        if source.numel() != bucket.params[i].numel():
            raise RuntimeError(f"tide: a gradient has {source.numel()} elements, its parameter "
                               f"{bucket.params[i].numel()}")
        if source.dtype != bucket.dtype or not source.is_contiguous() or source.is_sparse:
            if source.is_sparse:
                raise ValueError("tide: sparse gradients are not supported")
            source = source.to(bucket.dtype).contiguous()
        stream = None if self.cpu else torch.cuda.current_stream(p.device).cuda_stream
        base = source.data_ptr()
        for piece in bucket.pieces[i]:
            bucket.executor.offload_gradient(piece.subgroup, piece.sub_offset,
                                             base + piece.param_offset * bucket.element_size,
                                             piece.count, bucket.tide_dtype, stream)
        if not self.cpu:
            # The copy reads `source` on tide's offload stream: its memory must not be reused
            # before that copy ran.
            if allocator.is_using_allocator():
                allocator.record_stream(source, bucket.executor.offload_stream())
            else:
                source.record_stream(self._stream(bucket))
        self._keepalive.append(source)
        self._offloaded[id(p)] = (grad, grad._version)

    def sync(self, buckets: list[Bucket]) -> list[tuple[Bucket, int]]:
        """Before the gradients are used: offloads again every gradient changed since its hook
        ran (or never offloaded), re-reads master weights of parameters written from outside,
        and returns the parameters that have no gradient."""
        for bucket in buckets:
            for i in range(len(bucket.params)):
                bucket.check_layout(i)
        missing = []
        for bucket in buckets:
            for i, p in enumerate(bucket.owners):
                if bucket.version(i) != bucket.versions[i]:
                    bucket.read_master(i)
                grad = p.grad
                if grad is None:
                    missing.append((bucket, i))
                    continue
                seen = self._offloaded.get(id(p))
                if (seen is None or seen[0] is not grad or seen[1] != grad._version
                        or is_sharded(p)):
                    self.offload(p)
        return missing

    def release_gradients(self) -> None:
        """After a wait on every offload (grad_stats or step): the gradients may go."""
        self._keepalive.clear()
        self._offloaded.clear()

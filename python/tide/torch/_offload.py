"""Gradient offload: each gradient is copied into its subgroups' pinned buffers as soon as
backward produced it (a post-accumulate-grad hook; tide_optimizer_offload_gradient returns at
once, the copy runs on tide's side stream), and what step() needs to know afterwards: which
gradients changed after their hook ran (torch.nn.utils.clip_grad_norm_, GradScaler.unscale_, a
manual `p.grad.mul_`: seen by their version counter and offloaded again), which parameters were
written from outside (model.load_state_dict: their master weights are re-read), and which have no
gradient at all.

A sharded (FSDP2 DTensor) parameter's gradient is read at step() by default, not in its hook:
torch's foreach ops on DTensor gradients (torch.nn.utils.clip_grad_norm_'s _foreach_mul_, its
default on CUDA; GradScaler.unscale_'s _amp_foreach_non_finite_check_and_unscale_) bump no version
counter tide could see, neither the DTensor's nor its local tensor's (DTensor runs the local op
below autograd, where versions are bumped), so a copy taken in the hook could miss them. With
sharded_gradients="backward" the hook offloads them too, right after FSDP2's reduce-scatter
assigned them, and step() offloads one again only on a signal it sees: a new gradient object, a
moved DTensor version (the non-foreach in-place ops: `p.grad.mul_`, `div_`, `zero_`, `copy_`,
clip_grad_norm_(foreach=False)), GradScaler.unscale_ (scaler.step then hands step() no
grad_scale), or `opt.gradients_changed()`, which any other in-place write to DTensor gradients
after backward needs (torch.nn.utils.clip_grad_norm_ with foreach, any torch._foreach_* op).

Gradient accumulation: a step over K micro-batches runs each hook K times, and only the last
copy is the gradient step() uses. A hook whose parameter's hook ran the same number of times in
each of the last two steps, and has not reached that number yet, leaves the copy to a later
micro-batch (counted as deferred): a pattern that changes costs copies at step() for one step,
then every hook copies until the pattern is steady again. Likewise a gradient changed after its
last hook in each of the last two steps (DistributedDataParallel writes the averaged gradient
after the hooks ran; torch.nn.utils.clip_grad_norm_ scales every gradient) is not copied in its
hooks at all: step() would copy it again anyway. Never wrong either way: step() offloads
whatever its gradient's last copy missed. With tide's DDP hook (ddp.py), the gradients of DDP's
parameters are copied by it instead, once their bucket is reduced (on_reduced), and compared at
step() with .grad as DDP left it at the end of backward (after_reduction).

Host-resident buckets (FSDP2's CPUOffloadPolicy: the gradients are in host memory already) copy
nothing: at every step() their gradients' addresses are handed to the executor, which reads them
where they are (counted as read in place).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from tide.torch import allocator
from tide.torch._bucket import Bucket, layout_of
from tide.torch._distributed import is_sharded, local


# What GradientOffload counts per step (see counts).
_COUNTS = ("backward", "step", "in_place", "deferred")


class GradientOffload:
    """The offload of the gradients of the parameters in `where` (id(param) -> (bucket, index)),
    CUDA tensors, or CPU tensors in CPU mode (`cpu`)."""

    def __init__(self, where: dict[int, tuple[Bucket, int]], cpu: bool,
                 sharded_gradients: str = "step"):
        if sharded_gradients not in ("step", "backward"):
            raise ValueError(f"tide: sharded_gradients={sharded_gradients!r}; it accepts 'step' "
                             "(read DTensor gradients at step()) or 'backward' (offload them in "
                             "their hook)")
        self.where = where
        self.cpu = cpu
        self.sharded_in_backward = sharded_gradients == "backward"
        self._changed = False  # gradients_changed() was called since the offloads
        # Gradients offloaded in their hook and at step() (again, or first), hooks that left the
        # copy to a later micro-batch, this step and the last.
        self.counts = dict.fromkeys(_COUNTS, 0)
        self.last_counts = dict(self.counts)
        self.hooks: list[Any] = []  # the post-accumulate-grad hooks, removed with the optimizer
        self._offloaded: dict[int, tuple[torch.Tensor, int]] = {}  # id(param) -> (grad, version)
        self._keepalive: list[torch.Tensor] = []  # gradients whose offload may be in flight
        self._read_in_place: set[int] = set()  # host-resident parameters counted this step
        self._streams: dict[int, Any] = {}
        # Gradient accumulation: hook runs per parameter since the last step, and in the two
        # steps before it (id(param) -> (two steps ago, last step)).
        self._runs: dict[int, int] = {}
        self._runs_before: dict[int, tuple[int, int]] = {}
        # Gradients changed after their last hook: what that hook saw (id(param) -> (grad,
        # version)); those found changed at this step(), at the last one, and at both of the last
        # two (their hooks copy nothing).
        self._hooked: dict[int, tuple[torch.Tensor, int]] = {}
        self._changed_after: set[int] = set()
        self._changed_last: set[int] = set()
        self._changed_twice: set[int] = set()
        # Parameters whose gradients a DDP communication hook copies once reduced (ddp.py):
        # those copied or deferred in this backward (id(param) -> (param, copied)), and those
        # whose hook ran since the last reduction.
        self.reduced: set[int] = set()
        self._reduced_now: dict[int, tuple[torch.Tensor, bool]] = {}
        self._accumulated: set[int] = set()
        # A DDP hook's copies run where its all-reduce completes (gloo: its own thread), while
        # autograd's thread runs the other parameters' hooks.
        self._lock = threading.Lock()

    def _stream(self, bucket: Bucket) -> Any:
        key = id(bucket)
        if key not in self._streams:
            self._streams[key] = torch.cuda.ExternalStream(
                bucket.executor.offload_stream(), device=bucket.params[0].device)
        return self._streams[key]

    def on_grad(self, p: torch.Tensor) -> None:
        """The hook: p's gradient is ready."""
        with self._lock:
            self._on_grad(p)

    def _on_grad(self, p: torch.Tensor) -> None:
        if (id(p) in self.where and p.grad is not None
                and (self.sharded_in_backward or not is_sharded(p))):
            bucket, i = self.where[id(p)]
            if bucket.host:
                return  # read in place at step()
            key = id(p)
            if key in self.reduced:
                self._accumulated.add(key)  # copied by the DDP hook, after the all-reduce
                return
            self._hooked[key] = (p.grad, p.grad._version)
            if self._defer(key):
                return  # more micro-batches to come, or a write after backward: copied later
            if layout_of(local(p)) == bucket.layouts[i]:
                self.offload(p)
                self.counts["backward"] += 1
            # else: step() raises, before reading or writing anything through tide's slices

    def _defer(self, key: int) -> bool:
        """Whether this run of p's hook (or of its DDP bucket's) leaves the copy to a later one,
        or to step(): counts the run, and the deferral."""
        runs = self._runs[key] = self._runs.get(key, 0) + 1
        before = self._runs_before.get(key)
        if (before is not None and before[0] == before[1] and runs < before[1]
                or key in self._changed_twice):
            self.counts["deferred"] += 1
            return True
        return False

    def on_reduced(self, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        """A DDP bucket's gradients are reduced (`grads`: the values DDP writes into the
        parameters' .grad at the end of backward): copies those of tide's parameters."""
        with self._lock:
            for p, grad in zip(params, grads):
                self._on_reduced(p, grad)

    def _on_reduced(self, p: torch.Tensor, grad: torch.Tensor) -> None:
        key = id(p)
        if key in self.reduced and key in self.where and not self.where[key][0].host:
            bucket, i = self.where[key]
            copied = not self._defer(key) and layout_of(local(p)) == bucket.layouts[i]
            if copied:
                self.offload(p, grad)
                self.counts["backward"] += 1
            self._reduced_now[key] = (p, copied)

    def after_reduction(self) -> None:
        """At the end of a backward whose DDP buckets were reduced, after DDP wrote the reduced
        gradients into .grad: what step() compares them with. A parameter with no gradient of
        its own in the backward passes since the last reduction may be one DDP left as it was
        (unused by every rank), so its copy is not trusted."""
        with self._lock:
            self._after_reduction()

    def _after_reduction(self) -> None:
        for key, (p, copied) in self._reduced_now.items():
            if key in self._accumulated and p.grad is not None:
                seen = (p.grad, p.grad._version)
                self._hooked[key] = seen
                if copied:
                    self._offloaded[key] = seen
        self._reduced_now.clear()
        self._accumulated.clear()

    def offload(self, p: torch.Tensor, reduced: torch.Tensor | None = None) -> None:
        """Copies p's gradient (or `reduced`, its DDP bucket's slice: what .grad will hold)."""
        bucket, i = self.where[id(p)]
        bucket.check_layout(i)  # the copies below read and write as many elements as it had
        grad = p.grad if reduced is None else reduced
        source = local(grad)
        if source.numel() != bucket.params[i].numel():
            raise RuntimeError(f"tide: a gradient has {source.numel()} elements, its parameter "
                               f"{bucket.params[i].numel()}")
        if source.dtype != bucket.dtype or not source.is_contiguous() or source.is_sparse:
            if source.is_sparse:
                raise ValueError("tide: sparse gradients are not supported")
            source = source.to(bucket.dtype).contiguous()
        if bucket.host:
            if source.device.type != "cpu":
                source = source.cpu()
            bucket.set_gradient(i, source)  # read where it is by the step
            self._keepalive.append(source)
            return
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
        if reduced is None:
            self._offloaded[id(p)] = (grad, grad._version)

    def gradients_changed(self) -> None:
        """Gradients were written in place in a way no version counter shows: every one is
        offloaded again before it is used."""
        self._changed = True

    def sync(self, buckets: list[Bucket], unscaled: bool = False) -> list[tuple[Bucket, int]]:
        """Before the gradients are used: offloads again every gradient changed since its hook
        ran (or never offloaded; every sharded one when `unscaled`: GradScaler.unscale_ ran),
        re-reads master weights of parameters written from outside, and returns the parameters
        that have no gradient."""
        for bucket in buckets:
            for i in range(len(bucket.params)):
                bucket.check_layout(i)
        missing = []
        for bucket in buckets:
            for i, p in enumerate(bucket.owners):
                if bucket.version(i) != bucket.versions[i]:
                    bucket.read_master(i)
                grad = p.grad
                if bucket.host:
                    bucket.set_gradient(i, None)
                    if grad is not None:
                        self.offload(p)  # every time: its address, nothing copied
                        if id(p) not in self._read_in_place:
                            self._read_in_place.add(id(p))
                            self.counts["in_place"] += 1
                if grad is None:
                    missing.append((bucket, i))
                    continue
                if bucket.host:
                    continue
                hooked = self._hooked.get(id(p))
                if hooked is not None and (hooked[0] is not grad
                                           or hooked[1] != grad._version):
                    self._changed_after.add(id(p))
                seen = self._offloaded.get(id(p))
                unseen = is_sharded(p) and (unscaled or not self.sharded_in_backward)
                if (seen is None or seen[0] is not grad or seen[1] != grad._version
                        or unseen or self._changed):
                    self.offload(p)
                    self.counts["step"] += 1
        self._changed = False  # until the gradients change again, what was offloaded holds
        for bucket in buckets:
            if bucket.host:
                bucket.executor.set_gradients(bucket.host_grads)
        return missing

    def release_gradients(self) -> None:
        """After a wait on every offload (grad_stats or step): the gradients may go."""
        self._keepalive.clear()
        self._offloaded.clear()
        self._read_in_place.clear()
        self._reduced_now.clear()
        self._accumulated.clear()
        self._changed = False
        self.last_counts = self.counts
        self.counts = dict.fromkeys(_COUNTS, 0)
        runs_before = {}
        for key in self._runs.keys() | self._runs_before.keys():
            last, runs = self._runs_before.get(key, (0, 0))[1], self._runs.get(key, 0)
            if last or runs:
                runs_before[key] = (last, runs)
        self._runs_before = runs_before
        self._runs = {}
        self._hooked.clear()
        self._changed_twice = self._changed_after & self._changed_last
        self._changed_last, self._changed_after = self._changed_after, set()

"""DistributedDataParallel's gradients offloaded as each bucket is reduced: a DDP communication
hook that runs the all-reduce (DDP's average over the model's process group, or a hook of yours,
e.g. a compressing one) and then copies the bucket's reduced gradients into tide's
pinned buffers, while backward goes on.

Without it, DDP writes the averaged gradients into .grad after tide's own hooks ran, so tide
copies every gradient at step() (see _offload). With it, step() compares each gradient with
what the hook copied, by its version counter as DDP left it at the end of backward (an
autograd final callback queued behind DDP's), and copies again only what changed since
(clipping, GradScaler.unscale_) or what DDP may have left alone (a parameter with no gradient
of its own on this rank since the last reduction).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable

import torch

from tide.torch.optim import AdamW

if TYPE_CHECKING:  # imported where used: a torch without distributed support imports tide too
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

__all__ = ["register_ddp_offload"]


class _Target:
    """The hook's state: the optimizer it copies for (weakly: the model must not keep a dead
    optimizer's pinned memory), the reducing hook and its state (None: DDP's average over
    `reduce`'s group), and the model's parameters the hook copies (their ids)."""

    def __init__(self, optimizer: AdamW, reduce: Callable[[dist.GradBucket], Any],
                 hook: Callable[..., Any] | None, state: Any, ids: set[int]):
        self.optimizer = weakref.ref(optimizer)
        self.reduce = reduce
        self.hook, self.state = hook, state
        self.ids = ids


def register_ddp_offload(model: DistributedDataParallel, optimizer: AdamW,
                         hook: Callable[[Any, dist.GradBucket], torch.futures.Future] | None
                         = None, state: Any = None) -> None:
    """Registers on `model` a DDP communication hook that reduces each bucket with
    `hook(state, bucket)` (default: the average over `model.process_group`, as DDP computes it)
    and then copies its reduced gradients into `optimizer`'s pinned buffers. Call it before the
    first backward, as DDP's register_comm_hook requires. DDP takes one hook per model: a later
    call with another tide optimizer (the same `hook` and `state`, or none) moves the copies to
    it."""
    from torch.nn.parallel import DistributedDataParallel

    if hook is not None and not callable(hook):
        raise TypeError(f"tide: hook must be a DDP communication hook (callable), not "
                        f"{type(hook).__name__}")
    if hook is None and state is not None:
        raise ValueError("tide: `state` is the state of your `hook`; without one, tide's hook "
                         "averages over the model's process group as DDP does")
    if not isinstance(model, DistributedDataParallel):
        raise TypeError(f"tide: register_ddp_offload takes a DistributedDataParallel model, not "
                        f"{type(model).__name__}")
    if not isinstance(optimizer, AdamW):
        raise TypeError(f"tide: register_ddp_offload takes a tide.torch optimizer, not "
                        f"{type(optimizer).__name__}")
    target = getattr(model, "_tide_ddp_offload", None)
    if target is not None:
        if hook is not target.hook or state is not target.state:
            raise ValueError("tide: this model has tide's DDP hook already, with another "
                             "reducing hook or state (DDP takes one hook per model)")
        previous = target.optimizer()
        if previous is not None:  # its own hooks copy this model's gradients again
            previous._gradients.reduced -= target.ids
        target.optimizer = weakref.ref(optimizer)
    else:
        ignored = getattr(model, "parameters_to_ignore", set())
        ids = {id(p) for name, p in model.module.named_parameters()
               if p.requires_grad and name not in ignored}
        group = model.process_group
        target = _Target(optimizer, (lambda bucket: _average(group, bucket)) if hook is None
                         else (lambda bucket: hook(state, bucket)), hook, state, ids)
        try:
            model.register_comm_hook(target, _reduce_and_copy)
        except RuntimeError as error:
            raise RuntimeError("tide: the model has a communication hook already, and DDP takes "
                               "one: register tide's instead, with yours as its `hook` (and "
                               "`state`)") from error
        model._tide_ddp_offload = target
    optimizer._gradients.reduced |= target.ids


def _average(group: dist.ProcessGroup, bucket: dist.GradBucket) -> torch.futures.Future:
    """DDP's own reduction: each gradient scaled by 1 / world size (a multiplication, as DDP's
    reducer scales, so the same bits; torch's allreduce_hook divides), then summed."""
    import torch.distributed as dist
    buffer = bucket.buffer()
    buffer.mul_(1.0 / dist.get_world_size(group))
    work = dist.all_reduce(buffer, group=group, async_op=True)
    return work.get_future().then(lambda done: done.value()[0])


# Unannotated: DDP checks a hook's annotations against its classes, and with postponed
# evaluation here they are strings. (It also wants the second parameter named `bucket`.)
def _reduce_and_copy(target, bucket):  # noqa: ANN001, ANN201
    # The bucket as DDP laid it out, before a reducing hook could replace its buffer.
    params, views, buffer = bucket.parameters(), bucket.gradients(), bucket.buffer()
    future = target.reduce(bucket)
    optimizer = target.optimizer()
    if optimizer is None:
        return future
    gradients = optimizer._gradients
    try:
        # Queued before DDP's own final callback (queued once its last bucket is ready), which
        # writes the reduced gradients into .grad; it queues the one that reads them after it.
        torch.autograd.Variable._execution_engine.queue_callback(
            lambda: torch.autograd.Variable._execution_engine.queue_callback(
                gradients.after_reduction))
    except RuntimeError:
        pass  # not in a backward pass: step() copies what it cannot trust

    def copy(done: torch.futures.Future) -> Any:
        value = done.value()
        result = value[0] if isinstance(value, (list, tuple)) else value
        if result.data_ptr() == buffer.data_ptr():
            grads = views
        else:  # DDP copies the result's slices into the parameters' gradients
            shift = result.storage_offset() - buffer.storage_offset()
            grads = [result.as_strided(v.size(), v.stride(), v.storage_offset() + shift)
                     for v in views]
        gradients.on_reduced(params, grads)
        return value

    return future.then(copy)

"""tide.torch under FSDP2 (`torch.distributed.fsdp.fully_shard`): parameters that are DTensors
sharded on dim 0 of a 1-D device mesh, each rank holding an uneven (maybe empty) local shard.

tide steps the local shards: a bucket holds `local(p)` (the shard's own tensor, whose memory FSDP2
all-gathers from) and keeps `p` as its owner, whose gradient is read at step() and whose entries in
opt.state and state_dict() are DTensors with p's placements over tide's local state. What crosses
ranks goes through torch.distributed over the process group that shards the parameters: the sum of
squares for the gradient norm, GradScaler's found_inf, and on request the node and job summary.

Plain parameters (not DTensors) next to sharded ones are replicated, as torch.optim assumes: their
part of the gradient norm is not summed over ranks.
"""

from __future__ import annotations

import math
import os
import socket
from typing import Any

import torch

try:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Shard
except ImportError:  # a torch built without distributed support: nothing is a DTensor
    dist = None
    DTensor = None
    Shard = None


def is_sharded(t: Any) -> bool:
    return DTensor is not None and isinstance(t, DTensor)


def local(t: Any) -> Any:
    """A DTensor's local shard as the tensor object it holds (to_local() would make a new
    autograd view at every call); anything else as it is."""
    return t._local_tensor if is_sharded(t) else t


def check_supported(p: torch.Tensor) -> None:
    """Raises ValueError for a DTensor parameter tide cannot step (it steps dim-0 shards of a
    1-D mesh, FSDP2's layout)."""
    if not is_sharded(p):
        return
    mesh, placements = p.device_mesh, p.placements
    if mesh.ndim != 1 or len(placements) != 1 or placements[0] != Shard(0):
        raise ValueError(
            f"tide: a DTensor parameter of shape {tuple(p.shape)} has placements "
            f"{tuple(placements)} on a {mesh.ndim}-D device mesh; tide steps parameters sharded "
            "on dim 0 of a 1-D mesh (FSDP2's fully_shard), not HSDP or tensor parallelism")


def cpu_offloaded(params: list[torch.Tensor]) -> set[int]:
    """The ids of those of `params` that FSDP2 keeps in host memory (CPUOffloadPolicy): read from
    FSDP2's state of the modules that went through fully_shard (torch internals: the module ->
    state registry, each state's FSDPParams with `offload_to_cpu`); empty when they cannot be
    read (another torch), and then on a GPU a shard on the CPU still says it."""
    wanted = {id(p) for p in params if is_sharded(p)}
    found: set[int] = set()
    if not wanted:
        return found
    try:
        from torch.distributed._composable_state import _module_state_mapping
        states = [ref() for ref in list(_module_state_mapping.values())]
        for state in states:
            for group in getattr(state, "_fsdp_param_groups", None) or []:
                for fsdp_param in group.fsdp_params:
                    if fsdp_param.offload_to_cpu and id(fsdp_param.sharded_param) in wanted:
                        found.add(id(fsdp_param.sharded_param))
    except (ImportError, AttributeError, TypeError):
        return set()
    return found


def group_of(p: torch.Tensor) -> Any:
    """The process group that shards `p` (None for a plain parameter)."""
    return p.device_mesh.get_group() if is_sharded(p) else None


def shown(owner: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """`t` (a local state tensor of `owner`'s shard) as opt.state and state_dict() show it: for a
    sharded owner a DTensor with the owner's mesh, placements, shape and strides, whose local
    tensor *is* `t`'s storage; `t` itself otherwise."""
    if not is_sharded(owner):
        return t
    return DTensor.from_local(t, owner.device_mesh, owner.placements, run_check=False,
                              shape=owner.shape, stride=owner.stride())


class Group:
    """A process group that shards parameters, and the device its collectives take tensors on
    (NCCL's are CUDA tensors, gloo's CPU ones)."""

    def __init__(self, p: torch.Tensor):
        self.group = group_of(p)
        self.device_type = p.device_mesh.device_type

    def tensor(self, value: float, dtype: torch.dtype) -> torch.Tensor:
        device = (torch.device("cuda", torch.cuda.current_device())
                  if self.device_type == "cuda" else torch.device(self.device_type))
        return torch.tensor([value], dtype=dtype, device=device)


def groups_of(params: list[torch.Tensor], known: list[Group]) -> None:
    """Adds to `known` the process groups sharding `params` that it lacks, in the order they
    first appear (the same on every rank: the collectives over them must be called in one order
    everywhere)."""
    for p in params:
        group = group_of(p)
        if group is not None and all(group is not g.group for g in known):
            known.append(Group(p))


def _with_the_others(what: str, collective, *args, **kwargs) -> None:
    """A collective of the optimizer's (the gradient norm, the step's check for non-finite
    gradients), which runs before a step changes anything: when it fails (a rank died, the
    process group timed out), the error says so, and that nothing of the optimizer changed."""
    try:
        collective(*args, **kwargs)
    except RuntimeError as error:  # gloo's and NCCL's DistBackendError are RuntimeErrors
        raise RuntimeError(
            f"tide: the {what} with the other ranks failed, and nothing of the optimizer changed "
            f"(if a rank died, resume the job from its last checkpoint): {error}") from error


def sum_over_ranks(values: dict[Any, float], groups: list[Group]) -> float:
    """The sum of `values` (process group -> this rank's part; None: a replicated part, counted
    once), each sharded part summed over its group's ranks: one all-reduce per group."""
    total = values.get(None, 0.0)
    for g in groups:
        part = g.tensor(values.get(g.group, 0.0), torch.float64)
        _with_the_others("gradient norm's sum", dist.all_reduce, part, op=dist.ReduceOp.SUM,
                         group=g.group)
        total += float(part.item())
    return total


def any_rank(flag: bool, groups: list[Group]) -> bool:
    """Whether `flag` holds on any rank of `groups` (one all-reduce per group)."""
    for g in groups:
        value = g.tensor(1.0 if flag else 0.0, torch.float32)
        _with_the_others("step's check for non-finite gradients", dist.all_reduce, value,
                         op=dist.ReduceOp.MAX, group=g.group)
        flag = flag or value.item() != 0.0
    return flag


# What a rank reports of its last step in the node summary (opt.stats' keys).
SUMMARY_KEYS = ("step", "skipped", "gpu_subgroups", "cpu_subgroups", "fallback_subgroups",
                "seconds", "predicted_seconds", "all_cpu_seconds", "headroom_bytes",
                "buffer_bytes", "nonfinite", "rss_bytes")


def node_summary(plan: dict[str, Any] | None, pinned_bytes: int, elements: int) -> dict[str, Any]:
    """Every rank's last plan, per node and for the job, gathered with one all_gather_object over
    the default process group. Collective: every rank calls it, once per step. Without
    torch.distributed (one process) this process's alone."""
    distributed = dist is not None and dist.is_available() and dist.is_initialized()
    mine = {key: (plan or {}).get(key) for key in SUMMARY_KEYS}
    mine.update(rank=dist.get_rank() if distributed else 0, host=socket.gethostname(),
                local_rank=os.environ.get("LOCAL_RANK"),
                pinned_bytes=pinned_bytes, elements=elements)
    ranks: list[Any] = [mine]
    if distributed:
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
    nodes: dict[str, dict[str, Any]] = {}
    for r in ranks:
        nodes.setdefault(r["host"], {"host": r["host"], "ranks": []})["ranks"].append(r["rank"])
    for node in nodes.values():
        _totals(node, [r for r in ranks if r["host"] == node["host"]])
    job = _totals({"nodes": len(nodes)}, ranks)
    return {"ranks": ranks, "nodes": list(nodes.values()), "job": job}


def _totals(out: dict[str, Any], ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Sums over `ranks` (counts, bytes) and the slowest rank's update phase, which the step waits
    for."""
    for key in ("gpu_subgroups", "cpu_subgroups", "fallback_subgroups", "nonfinite",
                "pinned_bytes", "elements", "rss_bytes"):
        out[key] = sum(r[key] or 0 for r in ranks)
    out["seconds"] = max((r["seconds"] or 0.0 for r in ranks), default=0.0)
    slowest = out["seconds"]
    out["elements_per_second"] = out["elements"] / slowest if slowest > 0 else math.nan
    out["skipped"] = any(bool(r["skipped"]) for r in ranks)
    return out


class EmptyShards:
    """FSDP2 parameters whose shard on this rank is empty (a [1, k] weight on 2 ranks): nothing to
    step here, but opt.state and state_dict() keep an entry for each, as torch.optim.AdamW does
    (its step count and empty DTensor moments), so that every rank saves and loads the same keys."""

    def __init__(self, bf16_master: bool = False) -> None:
        self.params: list[torch.Tensor] = []
        self.bf16_master = bf16_master  # the optimizer's master_dtype is torch.bfloat16

    def __contains__(self, p: torch.Tensor) -> bool:
        return any(p is q for q in self.params)

    def entry(self, p: torch.Tensor, step: float) -> dict[str, Any]:
        """The state_dict() entry of an empty shard, with the keys the other ranks' have
        (_bucket.Bucket.entry_keys)."""
        empty = torch.zeros(local(p).shape, dtype=torch.float32)
        entry = {"step": torch.tensor(float(step), dtype=torch.float32),
                 "exp_avg": shown(p, empty), "exp_avg_sq": shown(p, empty.clone())}
        if self.bf16_master:
            entry["master_comp"] = shown(p, empty.to(torch.bfloat16))
        elif p.dtype != torch.float32:
            entry["master_param"] = shown(p, empty.clone())
        return entry

    def advance(self, state: dict) -> None:
        """After a step: the parameters that had a gradient count it."""
        for p in self.params:
            if p.grad is not None:
                if p not in state:
                    state[p] = self.entry(p, 0.0)
                state[p]["step"].add_(1)

    def set_step(self, state: dict, p: torch.Tensor, step: int) -> None:
        """A load: p's entry holds `step` steps (none at 0, as before a first step)."""
        if step == 0:
            state.pop(p, None)
        else:
            state[p] = self.entry(p, float(step))

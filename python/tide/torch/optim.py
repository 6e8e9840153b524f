"""tide's offloading Adam and AdamW: drop-in torch.optim optimizers whose fp32 master weights and
moments live in pinned host memory, whose gradients are offloaded during backward, and whose
update phase runs the scheduler's plan (some subgroups on the GPU, the rest on the CPU, overlapped).

    model = GPT(...).cuda().to(torch.bfloat16)
    tide.torch.use_allocator()          # before CUDA starts: the headroom forecast
    opt = tide.torch.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    ...
    loss.backward()                     # gradients leave for pinned memory as they are ready
    opt.step(); opt.zero_grad()
    print(opt.last_plan)                # where each subgroup was updated, phase times

This module is the torch.optim face of the optimizer: its arguments, param groups, step() and
zero_grad(), state dicts, stats. The machinery under it, each readable alone:
  _arguments   tide's arguments and the hyperparameters, checked as torch checks them;
  _layout      how a bucket's parameters are cut into subgroups;
  _bucket      a bucket (the parameters of a param group with one dtype on one device) and its
               executor (_executor, the C ABI): pinned state read and written through CPU tensors;
  _offload     gradient offload during backward, and what changed since (clipping, the scaler);
  _step        one step over all buckets, exactly or not at all;
  _checkpoint  state dicts in torch.optim.AdamW's layout: checked, then loaded;
  _state       opt.state[p] as torch keeps it ("step", "exp_avg", "exp_avg_sq", and
               "master_param", or "master_comp" with bf16 master weights): CPU tensors over the
               pinned state, kept true across steps.

The model's parameters stay where they are, in their dtype; tide writes the updated weights into
them at the end of step(). A parameter written outside the optimizer (model.load_state_dict) is
seen by its version counter and its master weights are re-read from it.
"""

from __future__ import annotations

import math
import os
import time
import warnings
import weakref
from typing import Any, Callable, Iterable

import torch

from tide import _lib, kernels
from tide.torch import (_arguments, _checkpoint, _distributed, _executor, _runtime, _step,
                        allocator)
from tide.torch._bucket import TIDE_DTYPES, Bucket, release
from tide.torch._offload import GradientOffload
from tide.torch._state import StateEntries
from tide.torch._step import StepIncompleteError

__all__ = ["Adam", "AdamW", "StepIncompleteError"]


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _quant8_or_dtype(state_dtype: torch.dtype) -> int:
    """tide_optimizer_options.state_dtype of the moments' torch dtype (uint8: 8-bit moments)."""
    if state_dtype == torch.uint8:
        return kernels.STATE_BLOCK_Q8
    return kernels.BFLOAT16 if state_dtype == torch.bfloat16 else kernels.FLOAT32


class AdamW(torch.optim.Optimizer):
    """torch.optim.AdamW with the optimizer state offloaded to pinned host memory and the update
    phase split between the GPU and the CPU by tide's scheduler.

    PyTorch's arguments keep their meaning (`lr` a float or a 1-element tensor, `betas`, `eps`,
    `weight_decay`, `maximize`); `foreach` and `fused` are accepted and ignored (tide has its own
    kernels); `amsgrad`, `capturable` and `differentiable` are not supported (ValueError).
    tide's own, keyword-only:
      subgroup_size:     elements per subgroup (default TIDE_SUBGROUP_SIZE, else 16M);
      placement:         'auto' (the planner, within the allocator's headroom), 'cpu', 'gpu', or
                         K >= 1 (one GPU subgroup every K); default TIDE_PLACEMENT, else 'auto';
      threads:           threads for CPU subgroups (default: TIDE_CPU_THREADS's pool, all of it);
      gradients_on_gpu:  plan at zero_grad() so that GPU subgroups keep their gradients on the GPU
                         (True), never (False), or where tide's allocator forecasts the memory
                         and the model predicts the update no slower that way (None, default);
      keep_buffers:      keep the update phase's GPU buffers until the next step instead of
                         freeing them when step() returns (saves their allocation, but the
                         headroom is what the update phase may use, not the forward pass);
      state_dtype:       the moments' dtype in pinned memory, torch.float32 or torch.bfloat16
                         (half their bytes, rounded to nearest even at every update; the master
                         weights stay fp32), or "q8" (or torch.uint8): 8-bit block-wise moments,
                         1 byte each plus an fp32 scale per 256 elements (Dettmers et al.
                         2022's dynamic-tree quantization); default TIDE_STATE_DTYPE, else
                         torch.float32. The argument wins over the variable. opt.state and
                         state_dict() still show fp32 moments (bf16 upcast exactly, 8-bit
                         dequantized: copies, whose writes are quantized at the next step);
                         with "q8", state_dict() adds the exact codes and scales (keys
                         "exp_avg_q8", ..., _checkpoint.Q8_KEYS);
      master_dtype:      the master weights, torch.float32 (an fp32 copy in pinned memory) or
                         torch.bfloat16: bf16 master weights with Kahan-style compensation, for
                         bfloat16 parameters only (others: ValueError) and fp32 or bf16 moments
                         (not "q8"). The model's bf16 parameters are then the master weights, as
                         in torch.optim: no fp32 master, and a bf16 compensation per element
                         keeps what rounding lost (the weight is w + c, about 16 significant
                         bits). opt.state and state_dict() show torch's keys and
                         "master_comp" (bf16) instead of "master_param"; a torch state dict
                         loads with zero compensation. Default TIDE_MASTER_DTYPE, else
                         torch.float32;
      state_rounding:    how bf16 moments are rounded at every update: "nearest" (even) or
                         "stochastic" (unbiased: up with the probability of the ulp's fraction
                         lost, so that moments moving by less than half a bf16 ulp a step keep
                         moving; bits hashed from the seed, the step and each element's index,
                         the same on CPU and GPU for any split); default TIDE_STATE_ROUNDING,
                         else "nearest". "stochastic" with fp32 or "q8" moments is a ValueError;
      state_rounding_seed: its seed (default torch.initial_seed()); saved in state_dict()
                         (key "tide_state_rounding") and restored by load_state_dict(), so a
                         resumed run rounds as the uninterrupted one would;
      sharded_gradients: when FSDP2 (DTensor) gradients are offloaded: "step" (default: read
                         at step()) or "backward" (in their hooks, after FSDP2's reduce-scatter,
                         overlapping backward; foreach in-place writes to them afterwards, e.g.
                         torch.nn.utils.clip_grad_norm_ on CUDA, need opt.gradients_changed());
      host_params:       whether fp32 parameters in host memory are stepped where they are, as
                         their own master weights, with their gradients read where they are (no
                         master copy, no gradient offload; GPU subgroups copy them in and their
                         results back): FSDP2's CPUOffloadPolicy regime. None (default): yes for
                         the FSDP2 parameters whose FSDP2 offload policy is CPUOffloadPolicy, and
                         on a GPU for any DTensor whose shard is on the CPU; True: every fp32 CPU
                         parameter (False: none; in CPU mode tide then keeps its own fp32 masters
                         as for parameters on a GPU). Only fp32 parameters (bf16 ones on the CPU
                         keep fp32 masters in CPU mode and raise on a GPU), not with 8-bit moments
                         nor with master_dtype=torch.bfloat16 (ValueError: that needs bf16
                         parameters).
    """

    _decoupled = True
    _default_weight_decay = 1e-2
    # GradScaler hands the loss scale and found_inf to step() instead of unscaling the gradients
    # (which would make every gradient be offloaded again).
    _step_supports_amp_scaling = True

    def __init__(self, params: Iterable[Any], lr: float | torch.Tensor = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float | None = None, amsgrad: bool = False, *,
                 maximize: bool = False, foreach: bool | None = None, capturable: bool = False,
                 differentiable: bool = False, fused: bool | None = None,
                 subgroup_size: int | None = None, placement: str | int | None = None,
                 threads: int | None = None, gradients_on_gpu: bool | None = None,
                 keep_buffers: bool = False, state_dtype: torch.dtype | str | None = None,
                 sharded_gradients: str = "step",
                 master_dtype: torch.dtype | str | None = None,
                 state_rounding: str | None = None, state_rounding_seed: int | None = None,
                 host_params: bool | None = None):
        if weight_decay is None:
            weight_decay = self._default_weight_decay
        for name, value in (("amsgrad", amsgrad), ("capturable", capturable),
                            ("differentiable", differentiable)):
            if value:
                raise ValueError(f"tide.torch.{type(self).__name__} does not support {name}=True")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                    "amsgrad": False, "maximize": maximize, "foreach": foreach,
                    "capturable": False, "differentiable": False, "fused": fused,
                    "decoupled_weight_decay": self._decoupled}
        self._ready = False
        self._subgroup_size = _arguments.subgroup_size(subgroup_size)
        self._policy = _arguments.placement(placement)
        self._placement_option = placement
        self._threads = _arguments.threads(threads)
        self._state_dtype = _arguments.state_dtype(state_dtype)
        self._master_dtype = _arguments.master_dtype(master_dtype)
        if self._master_dtype == torch.bfloat16 and self._state_dtype == torch.uint8:
            raise ValueError("tide: master_dtype=torch.bfloat16 with 8-bit moments "
                             "(state_dtype=\"q8\") is not supported: use torch.float32 or "
                             "torch.bfloat16 moments")
        self._state_rounding = _arguments.state_rounding(state_rounding, self._state_dtype)
        self._rounding_seed = _arguments.rounding_seed(state_rounding_seed)
        if self._master_dtype == torch.bfloat16 and self._state_rounding == "stochastic":
            raise ValueError("tide: stochastic rounding of the moments with bf16 master weights "
                             "(master_dtype=torch.bfloat16) is not supported: the bf16-master "
                             "kernels round to nearest")
        if gradients_on_gpu not in (None, True, False):
            raise ValueError(f"tide: gradients_on_gpu={gradients_on_gpu!r}; it accepts None "
                             "(where it pays), True or False")
        self._gradients_on_gpu = gradients_on_gpu
        self._keep_buffers = bool(keep_buffers)
        if host_params not in (None, True, False):
            raise ValueError(f"tide: host_params={host_params!r}; it accepts None (automatic), "
                             "True or False")
        # The rules between the state's formats are tide's (tide_optimizer_options_check):
        # asked here, before any parameter is placed, with what the arguments say.
        _executor.check_options(_executor.options(
            dtype=kernels.FLOAT32 if host_params else kernels.BFLOAT16,
            state_dtype=_quant8_or_dtype(self._state_dtype),
            master_dtype=kernels.BFLOAT16 if self._master_dtype == torch.bfloat16
            else kernels.FLOAT32, host_params=bool(host_params)))
        self._host_params = host_params
        self._cpu = _runtime.cpu_mode()
        if self._cpu:
            _runtime.ensure_cpu_mode_driver()
        self._buckets: list[Bucket] = []
        self._where: dict[int, tuple[Bucket, int]] = {}  # id(param) -> (bucket, index)
        self._gradients = GradientOffload(self._where, self._cpu, sharded_gradients)
        self._entries = StateEntries()  # what tide put in self.state
        # FSDP2 parameters empty on this rank
        self._empty_shards = _distributed.EmptyShards(self._master_dtype == torch.bfloat16)
        self._process_groups: list[_distributed.Group] = []  # those sharding the parameters
        # Released when this optimizer goes, never through another object: wrappers that take on
        # its class and forward attributes to it (Lightning's LightningOptimizer) would run a
        # __del__ of this class on going away, and close the executors still in use.
        self._release = weakref.finalize(self, release, self._gradients.hooks, self._buckets)
        self._clip_coef = 1.0
        self.stats: list[dict[str, Any]] = []
        # tide's param groups (the dicts) and the params each listed when tide last looked:
        # step() may see param_groups set to some of these dicts (DeepSpeed steps one group at a
        # time) or a group's params replaced (_rebind).
        self._groups: list[dict[str, Any]] = []
        self._listed: dict[int, list[torch.Tensor]] = {}
        self._listed_ids: dict[int, set[int]] = {}
        self._hooks: dict[int, Any] = {}  # id(param) -> its gradient hook
        super().__init__(params, defaults)
        self._groups = list(self.param_groups)
        self._ready = True
        try:
            for index in range(len(self.param_groups)):
                self._build(index)
        except BaseException:
            self._close()  # the hooks would keep this half-made optimizer alive and offloading
            raise

    # ---- construction ----

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _arguments.hyperparameters({**self.defaults, **param_group})
        super().add_param_group(param_group)
        if self._ready:
            self._groups.append(self.param_groups[-1])
            self._build(len(self._groups) - 1)

    def _placement(self, p: torch.Tensor, offloaded: set[int]) -> tuple[int, bool]:
        """The device of a parameter (of a DTensor's local shard), and whether it is
        host-resident (stepped where it is in host memory: `host_params`). `offloaded`: ids of
        the FSDP2 parameters under CPUOffloadPolicy."""
        shard = _distributed.local(p)
        on_cpu = shard.device.type == "cpu"
        if self._host_params is None:
            host = id(p) in offloaded or (not self._cpu and on_cpu and _distributed.is_sharded(p))
        else:
            host = self._host_params and on_cpu
        if host and (p.dtype != torch.float32 or self._state_dtype == torch.uint8):
            if self._cpu and self._host_params is None:
                host = False  # tide's own fp32 masters, as for parameters on the stand-in's GPU
            else:
                raise ValueError(
                    f"tide: a {p.dtype} parameter in host memory (an FSDP2 CPUOffloadPolicy "
                    "shard): tide steps host-resident parameters in place when they are float32 "
                    "(their own master weights) with float32 or bfloat16 moments; use float32 "
                    "sharded parameters (MixedPrecisionPolicy(param_dtype=torch.bfloat16) for "
                    "bf16 compute)")
        if host and self._master_dtype == torch.bfloat16:
            try:
                _executor.check_options(_executor.options(
                    dtype=kernels.FLOAT32, master_dtype=kernels.BFLOAT16, host_params=True))
            except ValueError as error:
                raise ValueError(
                    "tide: a float32 parameter in host memory (an FSDP2 CPUOffloadPolicy shard, "
                    "stepped where it is as its own fp32 master: host_params) with "
                    f"master_dtype=torch.bfloat16: {error}; use master_dtype=torch.float32 "
                    "here") from None
        if self._cpu:
            if not on_cpu:
                raise ValueError(f"tide: CPU mode (no GPU) needs CPU parameters, got {p.device}")
            return 0, host
        if host:
            return torch.cuda.current_device(), True
        if shard.device.type != "cuda":
            raise ValueError(f"tide: parameters must be CUDA tensors (or host-resident fp32 "
                             f"ones: host_params), got one on {shard.device}")
        return (shard.device.index if shard.device.index is not None
                else torch.cuda.current_device()), False

    def _build(self, group_index: int, groups: list[torch.Tensor] | None = None) -> None:
        """Buckets for the parameters of a group (all, or `groups`: those it gained)."""
        # FSDP2 parameters (DTensors): tide steps their local shards (_distributed), in buckets
        # of their own process group, whose gradient norm is summed over its ranks.
        by_key: dict[tuple[torch.dtype, int, int, bool], list[torch.Tensor]] = {}
        if groups is None:
            groups = self._groups[group_index]["params"]
            self._listed[group_index] = list(groups)
            self._listed_ids[group_index] = {id(p) for p in groups}
        offloaded = _distributed.cpu_offloaded(groups) if self._host_params is None else set()
        for p in groups:
            _distributed.check_supported(p)
            shard = _distributed.local(p)
            if p.dtype not in TIDE_DTYPES:
                raise ValueError(f"tide: parameters must be float32, bfloat16 or float16, got "
                                 f"{p.dtype}")
            if not shard.is_contiguous():
                raise ValueError("tide: parameters must be contiguous (tide writes the updated "
                                 "weights into their memory)")
            if shard.numel() == 0:
                if p.numel() != 0 and p.requires_grad:
                    self._empty_shards.params.append(p)
                continue
            key = (p.dtype, *self._placement(p, offloaded), id(_distributed.group_of(p)))
            by_key.setdefault(key, []).append(p)
        _distributed.groups_of(groups, self._process_groups)
        for (_, device, host, _), owners in by_key.items():
            params = [_distributed.local(p) for p in owners]
            bucket = Bucket(group_index, params, self._subgroup_size, device=device,
                            cpu_threads=self._threads,
                            gradients_on_gpu=False if host else self._gradients_on_gpu,
                            state_dtype=self._state_dtype, master_dtype=self._master_dtype,
                            owners=owners, host=host)
            self._buckets.append(bucket)
            self._round_moments(len(self._buckets) - 1)
            for i, p in enumerate(owners):
                self._where[id(p)] = (bucket, i)
                # A host-resident gradient is read at step(), so no hook: FSDP2 copies a
                # gradient to host memory synchronously when its parameter has one.
                if p.requires_grad and not host:
                    # The hook must not hold the optimizer: the finalizer's arguments (held
                    # until it runs) reach the parameters, so the optimizer could never go.
                    hook = p.register_post_accumulate_grad_hook(self._gradients.on_grad)
                    self._gradients.hooks.append(hook)
                    self._hooks[id(p)] = hook

    def _round_moments(self, k: int) -> None:
        """Bucket k's executor rounds as state_rounding says; each bucket its own seed (its
        elements' indices start at 0 in each)."""
        if self._state_rounding == "stochastic":
            seed = (self._rounding_seed + k * 0x9E3779B97F4A7C15) & (2**64 - 1)
            self._buckets[k].executor.set_state_rounding(True, seed)

    # ---- param groups changed after construction ----

    def _covered_groups(self) -> set[int]:
        """The param groups (indices into tide's groups) that the coming step covers: all, or
        those whose dicts param_groups holds now (DeepSpeed's ZeRO steps one group at a time,
        setting param_groups to that group's dict alone). A list of as many groups is taken
        as tide's groups, position by position (torch's load_state_dict makes new dicts)."""
        now = self.param_groups
        if len(now) == len(self._groups):
            self._groups[:] = now
            return set(range(len(now)))
        index = {id(group): k for k, group in enumerate(self._groups)}
        covered = {index.get(id(group), -1) for group in now}
        if -1 in covered:
            raise RuntimeError(
                "tide: param_groups holds a group this optimizer was not given; add groups with "
                "add_param_group()")
        return covered

    def _stepped_buckets(self) -> list[Bucket]:
        """The buckets of the groups the coming step covers, built for the groups' params as
        they are now."""
        covered = self._covered_groups()
        self._rebind()
        return [b for b in self._buckets
                if b.group_index in covered and len(self._unlisted(b)) < len(b.owners)]

    def _rebind(self) -> None:
        """Groups whose `params` were replaced since tide last looked (DeepSpeed's ZeRO 1 and 2
        put one flat fp32 partition there at deepspeed.initialize; ZeRO-3 one sub-group's at
        each step, and none between steps) are stepped as torch.optim steps them: a parameter
        new to tide gets buckets and fresh state, with its group's hyperparameters; one no
        longer listed is not stepped, and keeps its state if it has any (as torch's opt.state
        does). A bucket without state that the listing does not cover goes, memory and all,
        and what is still listed of it is new again. A new parameter gets a bucket of its own."""
        for k, group in enumerate(self._groups):
            listed = list(group["params"])
            before = self._listed.get(k, [])
            if len(listed) == len(before) and all(p is q for p, q in zip(listed, before)):
                continue
            ids = set()
            for p in listed:
                if not isinstance(p, torch.Tensor):
                    raise TypeError(f"tide: param group {k} holds a {type(p).__name__}, not a "
                                    "tensor")
                held = self._where.get(id(p))
                if held is not None and held[0].group_index != k:
                    raise ValueError(f"tide: a parameter of param group {held[0].group_index} "
                                     f"is now listed in param group {k} too")
                ids.add(id(p))
            for bucket in [b for b in self._buckets if b.group_index == k]:
                # Without state a bucket is made again for what is listed of it: its
                # parameters are then stepped together (one step count, the bias correction's).
                if not all(id(p) in ids for p in bucket.owners) and not self._has_state(bucket):
                    self._drop(bucket)
            self._empty_shards.params[:] = [
                p for p in self._empty_shards.params
                if not any(p is q for q in before) or id(p) in ids or p in self.state]
            new = [p for p in listed if id(p) not in self._where and p not in self._empty_shards]
            self._listed[k] = listed
            self._listed_ids[k] = ids
            # Each in a bucket of its own: one step count each (the bias correction's), as
            # ZeRO-3 steps its sub-groups' partitions one at a time.
            for p in new:
                self._build(k, [p])

    def _has_state(self, bucket: Bucket) -> bool:
        return bucket.step > 0 or any(p in self.state for p in bucket.owners)

    def _drop(self, bucket: Bucket) -> None:
        """A bucket without state, its parameters no longer listed: it goes, with its hooks."""
        for p in bucket.owners:
            del self._where[id(p)]
            hook = self._hooks.pop(id(p), None)
            if hook is not None:
                hook.remove()
                self._gradients.hooks.remove(hook)
        self._buckets.remove(bucket)
        bucket.drop_views()
        bucket.executor.close()

    def _unlisted(self, bucket: Bucket) -> list[int]:
        """The parameters of a bucket that its group does not list now: not stepped."""
        listed = self._listed_ids.get(bucket.group_index, set())
        return [i for i, p in enumerate(bucket.owners) if id(p) not in listed]

    # ---- gradient norm and clipping ----

    def grad_norm(self, scale: float = 1.0) -> float:
        """The total L2 norm of the gradients, read from their offloaded copies, divided by
        `scale` (the loss scale they carry, if any): the norm before any clipping, as
        torch.nn.utils.clip_grad_norm_ returns it. Under FSDP2 the norm of the whole model's
        gradients (an all-reduce over the ranks that shard them): call it on every rank."""
        buckets = self._stepped_buckets()
        self._gradients.sync(buckets)
        parts: dict[Any, float] = {}  # process group (None: not sharded) -> sum of squares
        for bucket in buckets:
            sum_squares, _ = bucket.executor.grad_stats()
            group = _distributed.group_of(bucket.owners[0])
            parts[group] = parts.get(group, 0.0) + sum_squares
        return math.sqrt(_distributed.sum_over_ranks(parts, self._process_groups)) / scale

    def clip_grad_norm_(self, max_norm: float, scaler: Any = None) -> float:
        """Clips the gradients of the coming step to a total norm of `max_norm`, as
        torch.nn.utils.clip_grad_norm_ would, without reading or changing them on the GPU: the
        factor is applied inside the update. Returns the total norm before clipping (unscaled
        by `scaler`'s current scale when a GradScaler is given, as after scaler.unscale_)."""
        scale = float(scaler.get_scale()) if scaler is not None else 1.0
        norm = self.grad_norm(scale)
        coef = max_norm / (norm + 1e-6)
        self._clip_coef = coef if math.isfinite(norm) and coef < 1.0 else 1.0
        return norm

    def gradients_changed(self) -> None:
        """Says that gradients were written in place after backward in a way tide cannot see
        (with sharded_gradients="backward": a foreach op on DTensor gradients, such as
        torch.nn.utils.clip_grad_norm_'s default on CUDA): they are offloaded again."""
        self._gradients.gradients_changed()

    # ---- the step ----

    def _headroom(self, device: int, *, held: bool = False) -> int:
        """GPU memory the update phase may use; with `held`, what may be allocated now and held
        through the coming forward and backward passes to the update phase (the gradients a
        prepared plan keeps on the GPU): it must fit at their peak, not only at the update's."""
        if self._forecast_headroom():
            forecast = allocator.headroom(device)
            return forecast["held_headroom_bytes" if held else "headroom_bytes"]
        free, _ = torch.cuda.mem_get_info(device)
        if not held:
            return int(free * 0.9)
        if self.last_plan is None:
            return 0  # no iteration seen: the forward pass's peak is not known yet
        # PyTorch's cache keeps what its passes reserved: what it may still grow by comes off.
        growth = torch.cuda.max_memory_reserved(device) - torch.cuda.memory_reserved(device)
        return max(0, int(free * 0.9) - max(0, growth))

    def _forecast_headroom(self) -> bool:
        """Whether the headroom is tide's allocator's forecast (else: the driver's free memory)."""
        return self._cpu or allocator.is_using_allocator()

    # Under torch.compile (a compiled training step, or "compiling the optimizer"), Dynamo runs
    # zero_grad and step as they are: their bookkeeping counts references and version counters
    # and crosses into tide's library, nothing a graph can hold.
    @torch.compiler.disable
    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        # None: the executor decides, with tide's allocator's forecast (without it, never).
        if self._gradients_on_gpu or (self._gradients_on_gpu is None
                                      and self._forecast_headroom()):
            for bucket in self._buckets:
                device = self._device_of(bucket)
                bucket.executor.prepare(self._policy, self._headroom(device, held=True))

    @torch.compiler.disable
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One Adam/AdamW step. It happens exactly or not at all: if it raises before the
        update began, nothing changed (weights, master weights, moments, step counts) and it
        may be called again; once the update began, a fault (a failed copy, a lost device) is
        rolled forward on the CPU and the step completes with the same bits, with a
        RuntimeWarning. Only what cannot be completed raises after that (the model's parameters
        cannot be written on a failed GPU; with gradients_on_gpu=True, gradients lost with the
        device): the message says what holds."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        t_start = time.monotonic_ns()
        buckets = self._stepped_buckets()
        devices = sorted({self._device_of(b) for b in buckets})
        # One bucket, stepped: its one step call marks the phases and releases the buffers
        # (tide_step_request.flags), so that a step crosses into tide once.
        fuse = len(buckets) == 1 and len(self._buckets) == 1
        if not fuse:
            for device in devices:
                allocator.mark_phase("update", device)
        self._take_state_writes()
        try:
            reports, problems, headroom, skipped = self._update(devices, buckets, fuse)
            if not skipped:
                self._empty_shards.advance(self.state)
        finally:
            # Where the state is now (a step may move it): opt.state's tensors follow.
            self._entries.refresh()
        self._clip_coef = 1.0
        self._gradients.release_gradients()
        # The step is over: what follows only tidies up and must not make it look undone.
        try:
            if not (fuse and reports):  # else the step call did it
                if not self._keep_buffers:
                    for bucket in self._buckets:
                        bucket.executor.release_buffers()
                for device in devices:
                    if fuse:
                        allocator.mark_phase("update", device)  # no step call marked it
                    allocator.mark_phase("end", device)
        except _lib.TideError as error:
            warnings.warn(f"tide: after the step: {error}", RuntimeWarning, stacklevel=2)
        self._record(reports, skipped, t_start, time.monotonic_ns(), headroom)
        if problems:
            raise problems[0]
        return loss

    def _update(self, devices: list[int], buckets: list[Bucket], fuse: bool
                ) -> tuple[list[dict[str, Any]], list[Exception], dict[int, int], bool]:
        """The update phase of step() for `buckets` on `devices`: (per bucket reports, errors to
        raise after the step, headroom per device, whether GradScaler skipped it). `fuse`: one
        bucket, whose step call does what is around the update phase too."""
        found_inf = getattr(self, "found_inf", None)
        grad_scale = getattr(self, "grad_scale", None)
        # scaler.step hands found_inf without grad_scale when scaler.unscale_ ran: it changed
        # the gradients in place.
        missing = self._gradients.sync(buckets,
                                       unscaled=found_inf is not None and grad_scale is None)
        skipped = found_inf is not None and float(found_inf) != 0.0
        if found_inf is not None and self._process_groups:
            # GradScaler's check covers what torch sees of the gradients on this rank: a step is
            # skipped on every rank or none.
            skipped = _distributed.any_rank(skipped, self._process_groups)
        scale = (float(grad_scale) if grad_scale is not None else 1.0) / self._clip_coef
        reports: list[dict[str, Any]] = []
        headroom: dict[int, int] = {}
        problems: list[Exception] = []
        if not skipped:
            flags = 0
            if fuse:
                flags = _executor.STEP_MARK_PHASES
                if not self._keep_buffers:
                    flags |= _executor.STEP_RELEASE_BUFFERS
            if fuse and self._forecast_headroom():
                flags |= _executor.STEP_HEADROOM_FORECAST  # the step call reads it
                headroom = {device: 0 for device in devices}
            else:
                headroom = {device: self._headroom(device) for device in devices}
            no_grad: dict[int, list[int]] = {}
            for bucket, i in missing:
                no_grad.setdefault(id(bucket), []).append(i)
            # Before anything changes, on every bucket: the hyperparameters, and what the
            # executors need to complete the step from host memory alone (a failure here
            # raises, and nothing changed); then the step, which completes (_step).
            steps = []
            for bucket in buckets:
                frozen = sorted(set(no_grad.get(id(bucket), [])) | set(self._unlisted(bucket)))
                if len(frozen) == len(bucket.params):
                    continue  # as torch: parameters without a gradient are not updated at all
                steps.append(_step.BucketStep(bucket, frozen, self._hyper(bucket, scale),
                                              headroom[self._device_of(bucket)]))
            reports, problems = _step.run(steps, self._policy, self._committed,
                                          flags if len(steps) == 1 else 0)
            for r, s in zip(reports, steps):
                headroom[self._device_of(s.bucket)] = r["headroom"]
        else:
            # Nothing is updated, but the offloads must be over before the gradients may go.
            for bucket in buckets:
                bucket.executor.grad_stats()
        return reports, problems, headroom, skipped

    def _device_of(self, bucket: Bucket) -> int:
        return bucket.device

    def _hyper(self, bucket: Bucket, scale: float) -> kernels.AdamHyper:
        group = self._groups[bucket.group_index]
        lr, beta1, beta2, eps, weight_decay = _arguments.hyperparameters(group)
        return kernels.AdamHyper(
            lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
            grad_scale=scale, step=bucket.step + 1, decoupled=int(self._decoupled),
            maximize=int(bool(group["maximize"])))

    def _committed(self, s: _step.BucketStep) -> None:
        """A bucket's state holds the step: the step counts of its parameters that had a
        gradient advance."""
        frozen = set(s.frozen)
        self._entries.advance(self.state, s.bucket,
                              (i for i in range(len(s.bucket.params)) if i not in frozen))

    def _record(self, reports: list, skipped: bool, t_start: int, t_end: int,
                headroom: dict[int, int]) -> None:
        ran = reports
        stat = {
            "step": len(self.stats) + 1,
            "skipped": skipped,
            "placement": _arguments.placement_name(ran[0]["report"].placement) if ran
            else _arguments.placement_in_force(self._placement_option),
            "gpu_subgroups": sum(r["report"].gpu_subgroups for r in ran),
            "cpu_subgroups": sum(r["report"].cpu_subgroups for r in ran),
            "fallback_subgroups": sum(r["report"].fallback_subgroups for r in ran),
            "headroom_bytes": min(headroom.values()) if headroom else 0,
            "seconds": sum(r["report"].seconds for r in ran),
            "predicted_seconds": sum(r["report"].predicted_seconds for r in ran),
            "all_cpu_seconds": sum(r["report"].all_cpu_seconds for r in ran),
            "cpu_busy_seconds": sum(r["report"].cpu_busy_seconds for r in ran),
            # The GPU subgroups' kernels and copies, as their events timed them: each stream's
            # busy time (the rest of `seconds` went to waits and the host).
            "gpu_busy_seconds": sum(r["report"].gpu_busy_seconds for r in ran),
            "h2d_busy_seconds": sum(r["report"].h2d_busy_seconds for r in ran),
            "d2h_busy_seconds": sum(r["report"].d2h_busy_seconds for r in ran),
            "buffers": max((r["report"].buffers_in_flight for r in ran), default=0),
            # GPU memory the update phase's plans used (buffers, kept gradients): carved from
            # tide's allocator when it is in use (its timeline's live bytes include it, its
            # update-phase peaks leave it out), from the driver otherwise.
            "buffer_bytes": max((r["gpu_bytes"] for r in ran), default=0),
            "nonfinite": sum(r["report"].nonfinite for r in ran),
            # Faults the step handled: GPU subgroups redone on the CPU, weights written by torch.
            "rolled_forward_subgroups": sum(r["report"].rolled_forward for r in ran),
            "unwritten_subgroups": sum(r["report"].unwritten for r in ran),
            # Subgroups whose state stays in device memory after the step (TIDE_RESIDENCY).
            "resident_subgroups": sum(r["report"].resident_subgroups for r in ran),
            "resident_bytes": sum(r["report"].resident_bytes for r in ran),
            # Since the previous step: resident subgroups tide's allocator took back home in the
            # forward and backward passes (an allocation would have failed), and the time that
            # took there; allocations it served only by giving its cache back to the driver
            # (each executor of a device sees its allocator's: counted once per device).
            "evicted_subgroups": sum(r["report"].evicted_subgroups for r in ran),
            "evicted_bytes": sum(r["report"].evicted_bytes for r in ran),
            "evict_seconds": sum(r["report"].evict_seconds for r in ran),
            "cache_releases": sum({r["device"]: r["report"].cache_releases
                                   for r in ran}.values()),
            # With gradients_on_gpu: kept gradient buffers tide's allocator took back before
            # any gradient reached them (a forward pass past the forecast); those subgroups'
            # gradients went to pinned memory.
            "withdrawn_gradients": sum(r["report"].withdrawn_gradients for r in ran),
            "withdrawn_bytes": sum(r["report"].withdrawn_bytes for r in ran),
            # GPU subgroups whose gradient was already on the GPU (gradients_on_gpu kept it, or
            # it is resident): their update copied none in.
            "kept_gradients": sum(r["report"].kept_gradients for r in ran),
            "devices": ["gpu" if d else "cpu" for r in ran for d in r["devices"]],
            "t_start_ns": t_start,
            "t_end_ns": t_end,
            "rss_bytes": _rss_bytes(),
            # Gradients offloaded during backward (in their hooks) and at step() (first or again).
            "gradients_offloaded_in_backward": self._gradients.last_counts["backward"],
            "gradients_offloaded_at_step": self._gradients.last_counts["step"],
            # Hooks that left the copy to a later micro-batch (gradient accumulation).
            "gradient_offloads_deferred": self._gradients.last_counts["deferred"],
            # Host-resident parameters (FSDP2's CPUOffloadPolicy): elements stepped where they
            # are, and gradients read in place (not offloaded).
            "host_resident_elements": sum(sum(b.sizes) for b in self._buckets if b.host),
            "gradients_read_in_place": self._gradients.last_counts["in_place"],
            "pinned_state_bytes": self.pinned_state_bytes(),
        }
        self.stats.append(stat)

    @property
    def state_format(self) -> dict[str, str]:
        """How this optimizer keeps its state, as resolved from the arguments and the TIDE_*
        variables: "moments" ("float32", "bfloat16" or "q8"), "master" ("float32" or
        "bfloat16") and "rounding" of bf16 moments ("nearest" or "stochastic")."""
        moments = "q8" if self._state_dtype == torch.uint8 else str(self._state_dtype)[6:]
        return {"moments": moments, "master": str(self._master_dtype)[6:],
                "rounding": self._state_rounding}

    @property
    def last_plan(self) -> dict[str, Any] | None:
        """The last step's placement and times (see `stats`), or None before the first step."""
        return self.stats[-1] if self.stats else None

    @property
    def rates(self) -> list[dict[str, float]]:
        """The performance model's rates each bucket's next plan uses, refined by the phases so
        far: params/s for the updates, bytes/s for the copies and through host memory
        (`host_memory`, `host_memory_contended`: the budget CPU updates and copies share) (`tide
        plan` takes them as --cpu-update ..., --h2d-gbps ... and --host-memory-gbps ... in GB/s).
        One dict per bucket, in order."""
        return [b.executor.rates() for b in self._buckets]

    def node_summary(self) -> dict[str, Any]:
        """Under torch.distributed: every rank's last plan (this rank's is `last_plan`), with
        totals per node (ranks on one host) and for the job, gathered with one
        all_gather_object over the default process group. Collective: call it on every rank,
        after step(), once per step at most. Returns {"ranks": [...], "nodes": [...], "job": {...}}:
        subgroups placed on the GPU and the CPU, pinned bytes and elements of the optimizer state,
        and the slowest rank's update phase (seconds) with the elements per second it gives."""
        elements = sum(sum(b.sizes) for b in self._buckets)
        return _distributed.node_summary(self.last_plan, self.pinned_state_bytes(), elements)

    def pinned_state_bytes(self) -> int:
        """Bytes of host memory tide holds per step for the optimizer state (pinned, or pageable
        past the pinned share: docs/guide/pinned.md; before the
        arenas' rounding): fp32 master weights, moments, gradient buffers and the low-precision
        weights' upload copies (none with bf16 master weights: their bf16 weights and
        compensation take the fp32 master's 4 bytes); host-resident parameters only their
        moments; 8-bit moments their block scales too."""
        total = 0
        for b in self._buckets:
            n = sum(b.sizes)
            moments = 2 * (1 if b.quantized else b.state_dtype.itemsize)
            upload = b.element_size if b.element_size < 4 and not b.bf16_master else 0
            per = moments if b.host else 4 + moments + b.element_size + upload
            total += n * per
            if b.quantized:
                total += 8 * -(-n // 256)  # two fp32 scales per 256-element block
        return total

    # ---- checkpoints ----

    def state_dict(self) -> dict[str, Any]:
        """torch.optim.AdamW's layout: per parameter "step", "exp_avg", "exp_avg_sq" (fp32 CPU
        tensors shaped like the parameter), plus "master_param" for low-precision parameters
        (their fp32 master weights; torch.optim ignores it)."""
        self._stepped_buckets()  # parameters replaced before any step: the state is theirs
        self._take_state_writes()
        live = self.state
        full: dict[Any, Any] = {}
        # In param-group order, the same on every rank (under FSDP2, gathering a full state
        # dict runs one collective per entry, in this order).
        for p in (p for group in self.param_groups for p in group["params"]):
            if id(p) in self._where:
                entry = self._saved_entry(p, *self._where[id(p)])
                if entry is not None:
                    full[p] = entry
            elif p in self._empty_shards and p in live:
                full[p] = self._empty_shards.entry(p, float(live[p]["step"]))
        self.state = full  # super().state_dict packs self.state, with its hooks
        try:
            saved = super().state_dict()
        finally:
            self.state = live
        if self._state_rounding == "stochastic":
            saved["tide_state_rounding"] = {"mode": "stochastic", "seed": self._rounding_seed}
        return saved

    def _saved_entry(self, p: torch.Tensor, bucket: Bucket, i: int) -> dict[str, Any] | None:
        """Parameter p's entry in state_dict() (copies), or None before its first step."""
        ours = self._entries.get(p)
        if ours is None:
            return None  # no step yet: no state, as in torch
        entry = {"step": ours["step"].clone()}
        if int(entry["step"]) > 0:
            # DTensors with p's placements for an FSDP2 parameter, as torch keeps them
            for key in bucket.entry_keys:
                pinned = {"master_param": "param", "master_comp": "comp"}.get(key, key)
                entry[key] = _distributed.shown(p, bucket.gather(i, pinned))
            if bucket.quantized and not _distributed.is_sharded(p):
                # The exact 8-bit state is this rank's flat codes and scales, which DCP cannot
                # reshard: an FSDP2 parameter saves fp32 moments only (quantized once at load).
                entry.update(bucket.q8_state(i))
        return entry

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads tide's or torch.optim.Adam(W)'s state dict. Master weights: the saved ones when
        they round to the parameter's current value, else the parameter's. Everything is
        checked before anything is replaced: a state dict that does not fit (another model's
        shapes, another optimizer's, non-finite values, a negative step or second moment)
        raises ValueError naming the parameter, and the optimizer is left as it was."""
        self._stepped_buckets()  # parameters replaced before any step: the state is theirs
        rounding = state_dict.get("tide_state_rounding")  # stochastic rounding's seed
        seed = None
        if rounding is not None:
            if not isinstance(rounding, dict) or not isinstance(rounding.get("seed"), int):
                raise ValueError("tide: state dict key 'tide_state_rounding' must be a dict "
                                 "with an integer 'seed'")
            seed = _arguments.rounding_seed(rounding["seed"])
        entries = _checkpoint.checked_entries(
            state_dict, self.param_groups,
            lambda p: id(p) in self._where or p in self._empty_shards,
            lambda p: self._where[id(p)][0].state_dtype if id(p) in self._where else torch.float32)
        groups_only = {"state": {}, "param_groups": state_dict["param_groups"]}
        live = self.state
        super().load_state_dict(groups_only)  # takes the groups' hyperparameters
        self._groups[:] = self.param_groups  # new dicts, over the same parameters
        self.state = live
        by_bucket: dict[int, list[int]] = {}
        exact: dict[int, list[tuple[int, dict]]] = {}  # 8-bit moments saved with this layout
        for p, step, entry in entries:
            if id(p) not in self._where:
                self._empty_shards.set_step(self.state, p, step)
                continue
            bucket, i = self._where[id(p)]
            self._load_entry(bucket, i, step, entry)
            by_bucket.setdefault(id(bucket), []).append(step)
            if step > 0:
                exact.setdefault(id(bucket), []).append(
                    (i, entry) if bucket.q8_fits(i, entry) else (-1, entry))
        for bucket in self._buckets:
            bucket.flush()
            # Blocks are shared between neighbouring parameters: the saved codes and scales go
            # back only when every parameter of the bucket has them for this layout.
            loaded = exact.get(id(bucket), [])
            if loaded and all(i >= 0 for i, _ in loaded):
                for i, entry in loaded:
                    bucket.load_q8_state(i, entry)
                self._entries.refresh()  # copies the program holds show the exact state
        if seed is not None:
            self._rounding_seed = seed
            for k in range(len(self._buckets)):
                self._round_moments(k)
        for bucket in self._buckets:
            steps = by_bucket.get(id(bucket), [])
            if steps:
                if len(set(steps)) > 1:
                    warnings.warn("tide: parameters of one bucket have different step counts; "
                                  "tide's bias correction uses the largest", stacklevel=2)
                bucket.step = max(steps)
            if bucket.dtype == torch.float32 and not bucket.host:
                # An fp32 parameter holds its master weights' value: they are read from it again
                # at the next step, so that what is written into it before then unseen by its
                # version counter counts (DeepSpeed restores its fp32 partitions through .data
                # after loading the optimizer's state), as torch.optim, which has no master.
                bucket.versions = [(-1, -1)] * len(bucket.versions)

    def _load_entry(self, bucket: Bucket, i: int, step: int, entry: dict) -> None:
        _checkpoint.load_entry(bucket, i, step, entry)
        self._entries.set_step(self.state, bucket, i, step)

    def _take_state_writes(self) -> None:
        """What the program wrote into opt.state since the last step becomes tide's state
        (_state); a value tide cannot take raises ValueError, and nothing was taken."""
        self._entries.take_writes(self.state, self._buckets, self._load_entry)

    def _close(self) -> None:
        self._release()


class Adam(AdamW):
    """torch.optim.Adam (L2 weight decay added to the gradient), offloaded as tide.torch.AdamW."""

    _decoupled = False
    _default_weight_decay = 0.0

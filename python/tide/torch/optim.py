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

Layout: the parameters of each param group are put in buckets by dtype and device; each bucket is
one executor (tide_optimizer), its parameters laid end to end and cut into subgroups
(`subgroup_size` elements). The model's parameters stay where they are, in their dtype; tide
writes the updated weights into them at the end of step().

Gradients are offloaded by post-accumulate-grad hooks. Anything that changes a gradient after
its hook ran (torch.nn.utils.clip_grad_norm_, GradScaler.unscale_, a manual `p.grad.mul_`) is seen
by its version counter and that gradient is offloaded again at step(); opt.clip_grad_norm_ and
opt.grad_norm() clip and measure from the offloaded gradients instead, without touching them.
Likewise a parameter written outside the optimizer (model.load_state_dict) is seen by its version
counter and its master weights are re-read from it.
"""

from __future__ import annotations

import ctypes
import math
import os
import time
import warnings
import weakref
from typing import Any, Callable, Iterable

import torch

from tide import _lib, kernels
from tide.torch import _executor, _layout, _runtime, allocator

_TIDE_DTYPES = {torch.float32: kernels.FLOAT32, torch.bfloat16: kernels.BFLOAT16,
                torch.float16: kernels.FLOAT16}
DEFAULT_SUBGROUP_SIZE = 1 << 24  # elements: 192 MiB of fp32 state (p, m, v) per GPU buffer
_SIZE_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _parse_count(name: str, text: str, minimum: int) -> int:
    """A count such as 16777216 or 16M (binary multiples: K, M, G)."""
    value = text.strip()
    suffix = value[-1:].upper() if value[-1:].isalpha() else ""
    digits = value[:-1] if suffix else value
    if suffix not in _SIZE_SUFFIXES or not digits.isdigit():
        raise ValueError(f"{name}={text!r}: expected an integer >= {minimum}, optionally with a "
                         f"K, M or G suffix (x1024, x1024^2, x1024^3), e.g. 16M")
    count = int(digits) * _SIZE_SUFFIXES[suffix]
    if count < minimum:
        raise ValueError(f"{name}={text!r}: expected an integer >= {minimum} (elements)")
    return count


def _subgroup_size(option: int | None) -> int:
    if option is not None:
        if isinstance(option, bool) or not isinstance(option, int) or option < 1:
            raise ValueError(f"subgroup_size must be a positive integer, got {option!r}")
        return option
    text = os.environ.get("TIDE_SUBGROUP_SIZE")
    return _parse_count("TIDE_SUBGROUP_SIZE", text, 1) if text else DEFAULT_SUBGROUP_SIZE


def _placement(option: str | int | None) -> _executor.PlacementPolicy | None:
    """None: TIDE_PLACEMENT (read by tide, strictly), else auto."""
    if option is None:
        return None
    if isinstance(option, int) and not isinstance(option, bool):
        if option < 1:
            raise ValueError(f"placement K must be >= 1, got {option}")
        return _executor.policy(_executor.PLACEMENT_INTERLEAVE, option)
    kinds = {"auto": _executor.PLACEMENT_AUTO, "cpu": _executor.PLACEMENT_CPU,
             "gpu": _executor.PLACEMENT_GPU}
    if isinstance(option, str):
        if option in kinds:
            return _executor.policy(kinds[option])
        if option.isdigit() and int(option) >= 1:
            return _executor.policy(_executor.PLACEMENT_INTERLEAVE, int(option))
    raise ValueError(f"placement must be 'auto', 'cpu', 'gpu' or an integer K >= 1 (one GPU "
                     f"subgroup every K), got {option!r}")


def _placement_in_force(option: str | int | None) -> str | int:
    """The policy a step ran under: 'auto', 'cpu', 'gpu' or K, from the argument, else
    TIDE_PLACEMENT (which tide's executor read and accepted), else 'auto'."""
    text = str(option) if option is not None else os.environ.get("TIDE_PLACEMENT") or "auto"
    if text in ("auto", "cpu", "gpu"):
        return text
    return int(text.lstrip("kK"))


def _release(hooks: list[Any], buckets: list[_Bucket]) -> None:
    """An optimizer's end: its gradient hooks removed, its executors destroyed (once)."""
    for hook in hooks:
        hook.remove()
    hooks.clear()
    for bucket in buckets:
        bucket.executor.close()
    buckets.clear()


def _threads(option: int | None) -> int:
    if option is None:
        return 0
    if isinstance(option, bool) or not isinstance(option, int) or not 1 <= option <= 1024:
        raise ValueError(f"threads must be an integer from 1 to 1024, got {option!r}")
    return option


class StepIncompleteError(RuntimeError):
    """step() could update only part of the optimizer state: gradients kept on the GPU
    (gradients_on_gpu=True) were lost with the device. The only outcome of a step that is
    neither the whole step nor none of it; restore a checkpoint."""


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"Invalid {name} value: {value!r} (must be finite)")
    return float(value)


def _hyperparameters(group: dict[str, Any]) -> tuple[float, float, float, float, float]:
    """(lr, beta1, beta2, eps, weight_decay) of a param group, checked as torch.optim.AdamW
    checks them, with messages that name the value given."""
    lr = group["lr"]
    if isinstance(lr, torch.Tensor):
        if lr.numel() != 1:
            raise ValueError(f"Tensor lr must be 1-element, got {lr.numel()} elements")
        lr = lr.item()
    lr = _number("learning rate", lr)
    if lr < 0:
        raise ValueError(f"Invalid learning rate: {lr} (must be >= 0)")
    betas = group["betas"]
    if isinstance(betas, (str, bytes)) or not hasattr(betas, "__len__") or len(betas) != 2:
        raise ValueError(f"Invalid beta parameters: {betas!r} (two numbers in [0, 1), "
                         "e.g. (0.9, 0.999))")
    beta1, beta2 = (_number("beta", b.item() if isinstance(b, torch.Tensor) else b)
                    for b in betas)
    for index, beta in enumerate((beta1, beta2)):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {index}: {beta} (must be in "
                             "[0, 1))")
    eps = _number("epsilon", group["eps"])
    if eps < 0:
        raise ValueError(f"Invalid epsilon value: {eps} (must be >= 0)")
    weight_decay = _number("weight_decay", group["weight_decay"])
    if weight_decay < 0:
        raise ValueError(f"Invalid weight_decay value: {weight_decay} (must be >= 0)")
    return lr, beta1, beta2, eps, weight_decay


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class _Bucket:
    """The parameters of one param group with one dtype on one device, and their executor."""

    def __init__(self, group_index: int, params: list[torch.Tensor], subgroup_size: int, *,
                 device: int, cpu_threads: int, gradients_on_gpu: bool):
        self.group_index = group_index
        self.params = params
        self.dtype = params[0].dtype
        self.tide_dtype = _TIDE_DTYPES[self.dtype]
        self.element_size = params[0].element_size()
        self.sizes, self.pieces = _layout.split([p.numel() for p in params], subgroup_size)
        slices = [(piece.subgroup, piece.sub_offset, piece.count,
                   p.data_ptr() + piece.param_offset * self.element_size)
                  for p, mine in zip(params, self.pieces) for piece in mine]
        self.executor = _executor.Executor(self.sizes, slices, device=device, dtype=self.tide_dtype,
                                           cpu_threads=cpu_threads,
                                           gradients_on_gpu=gradients_on_gpu)
        # What tide's slices describe: the memory the parameters had when the optimizer was made.
        self.layouts = [_layout_of(p) for p in params]
        self.versions = [p._version for p in params]
        self.step = 0  # update phases run: the bias correction's step number
        self.frozen: tuple[int, ...] = ()  # the parameters the executor leaves untouched
        self._views: list[dict[str, torch.Tensor]] | None = None
        for i in range(len(params)):
            self.read_master(i)

    def check_layout(self, i: int) -> None:
        """Raises when parameter i is no longer the memory tide writes (before anything is
        read or written through its slices)."""
        now = _layout_of(self.params[i])
        if now != self.layouts[i]:
            raise RuntimeError(
                f"tide: a parameter changed since the optimizer was created (was {self.layouts[i]}, "
                f"now {now}): its memory moved or was resized (param.data replaced, the model "
                "moved with .to()); create the optimizer after the model is in place")

    @property
    def views(self) -> list[dict[str, torch.Tensor]]:
        """CPU tensors over each subgroup's pinned buffers (no copy). A step may move a
        subgroup's state to another buffer (executor.h): refreshed after each step."""
        if self._views is None:
            self._views = [self._subgroup_views(i) for i in range(len(self.sizes))]
        return self._views

    def state_moved(self) -> None:
        self._views = None

    def _subgroup_views(self, subgroup: int) -> dict[str, torch.Tensor]:
        b = self.executor.buffers(subgroup)

        def view(address: int, dtype: torch.dtype, element_size: int) -> torch.Tensor:
            raw = (ctypes.c_char * (b.count * element_size)).from_address(address)
            return torch.frombuffer(raw, dtype=dtype, count=b.count)

        return {"param": view(b.param, torch.float32, 4),
                "exp_avg": view(b.exp_avg, torch.float32, 4),
                "exp_avg_sq": view(b.exp_avg_sq, torch.float32, 4),
                "grad": view(b.grad, self.dtype, self.element_size)}

    def pinned(self, key: str, piece: _layout.Piece) -> torch.Tensor:
        return self.views[piece.subgroup][key][piece.sub_offset:piece.sub_offset + piece.count]

    def read_master(self, i: int) -> None:
        """Master weights of parameter i from the parameter itself."""
        flat = self.params[i].detach().reshape(-1)
        for piece in self.pieces[i]:
            self.pinned("param", piece).copy_(
                flat[piece.param_offset:piece.param_offset + piece.count])
        self.versions[i] = self.params[i]._version

    def gather(self, i: int, key: str) -> torch.Tensor:
        """Parameter i's `key` state (fp32, on the CPU, shaped like the parameter): a copy."""
        out = torch.empty(self.params[i].numel(), dtype=torch.float32)
        for piece in self.pieces[i]:
            out[piece.param_offset:piece.param_offset + piece.count] = self.pinned(key, piece)
        return out.view(self.params[i].shape)

    def scatter(self, i: int, key: str, value: torch.Tensor) -> None:
        flat = value.detach().reshape(-1)
        if flat.numel() != self.params[i].numel():
            raise ValueError(f"state {key!r} has {flat.numel()} elements, the parameter "
                             f"{self.params[i].numel()}")
        for piece in self.pieces[i]:
            self.pinned(key, piece).copy_(
                flat[piece.param_offset:piece.param_offset + piece.count])

    def set_frozen(self, frozen: list[int]) -> None:
        """The parameters (indices) the coming steps leave exactly as they are."""
        key = tuple(sorted(frozen))
        if key != self.frozen:
            flags = [i in key for i, mine in enumerate(self.pieces) for _ in mine]
            self.executor.set_frozen(flags)
            self.frozen = key

    def write_unwritten(self, outcome: list[int]) -> None:
        """The model's parameters of subgroups whose step completed without the device taking
        their weights: written from the committed master weights, as the step would have (fp32
        to the parameter's dtype, round to nearest even)."""
        for i, p in enumerate(self.params):
            if i in self.frozen:
                continue
            flat = p.detach().view(-1)
            for piece in self.pieces[i]:
                if outcome[piece.subgroup] == _executor.UNWRITTEN:
                    flat[piece.param_offset:piece.param_offset + piece.count].copy_(
                        self.pinned("param", piece))


def _layout_of(p: torch.Tensor) -> tuple:
    return (p.data_ptr(), tuple(p.shape), tuple(p.stride()), p.dtype, p.device)


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
      gradients_on_gpu:  plan at zero_grad() so that GPU subgroups keep their gradients on the GPU;
      keep_buffers:      keep the update phase's GPU buffers until the next step instead of
                         freeing them when step() returns (saves their allocation, but the
                         headroom is what the update phase may use, not the forward pass).
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
                 threads: int | None = None, gradients_on_gpu: bool = False,
                 keep_buffers: bool = False):
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
        self._subgroup_size = _subgroup_size(subgroup_size)
        self._policy = _placement(placement)
        self._placement_option = placement
        self._threads = _threads(threads)
        self._gradients_on_gpu = bool(gradients_on_gpu)
        self._keep_buffers = bool(keep_buffers)
        self._cpu = _runtime.cpu_mode()
        if self._cpu:
            _runtime.ensure_cpu_mode_driver()
        self._buckets: list[_Bucket] = []
        self._where: dict[int, tuple[_Bucket, int]] = {}  # id(param) -> (bucket, index)
        self._offloaded: dict[int, tuple[torch.Tensor, int]] = {}  # id(param) -> (grad, version)
        self._keepalive: list[torch.Tensor] = []  # gradients whose offload may be in flight
        self._hooks: list[Any] = []
        # Released when this optimizer goes, never through another object: wrappers that take on
        # its class and forward attributes to it (Lightning's LightningOptimizer) would run a
        # __del__ of this class on going away, and close the executors still in use.
        self._release = weakref.finalize(self, _release, self._hooks, self._buckets)
        self._clip_coef = 1.0
        self._streams: dict[int, Any] = {}
        self.stats: list[dict[str, Any]] = []
        super().__init__(params, defaults)
        self._ready = True
        try:
            for index in range(len(self.param_groups)):
                self._build(index)
        except BaseException:
            self._close()  # the hooks would keep this half-made optimizer alive and offloading
            raise

    # ---- construction ----

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _hyperparameters({**self.defaults, **param_group})
        super().add_param_group(param_group)
        if self._ready:
            self._build(len(self.param_groups) - 1)

    def _device_index(self, p: torch.Tensor) -> int:
        if self._cpu:
            if p.device.type != "cpu":
                raise ValueError(f"tide: CPU mode (no GPU) needs CPU parameters, got {p.device}")
            return 0
        if p.device.type != "cuda":
            raise ValueError(f"tide: parameters must be CUDA tensors, got one on {p.device}")
        return p.device.index if p.device.index is not None else torch.cuda.current_device()

    def _build(self, group_index: int) -> None:
        by_key: dict[tuple[torch.dtype, int], list[torch.Tensor]] = {}
        for p in self.param_groups[group_index]["params"]:
            if p.dtype not in _TIDE_DTYPES:
                raise ValueError(f"tide: parameters must be float32, bfloat16 or float16, got "
                                 f"{p.dtype}")
            if not p.is_contiguous():
                raise ValueError("tide: parameters must be contiguous (tide writes the updated "
                                 "weights into their memory)")
            if p.numel() == 0:
                continue
            by_key.setdefault((p.dtype, self._device_index(p)), []).append(p)
        for (_, device), params in by_key.items():
            bucket = _Bucket(group_index, params, self._subgroup_size, device=device,
                             cpu_threads=self._threads, gradients_on_gpu=self._gradients_on_gpu)
            self._buckets.append(bucket)
            for i, p in enumerate(params):
                self._where[id(p)] = (bucket, i)
                self.state[p]["step"] = torch.tensor(0.0, dtype=torch.float32)
                if p.requires_grad:
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad))

    # ---- gradient offload ----

    def _offload_stream(self, bucket: _Bucket) -> Any:
        key = id(bucket)
        if key not in self._streams:
            self._streams[key] = torch.cuda.ExternalStream(
                bucket.executor.offload_stream(), device=bucket.params[0].device)
        return self._streams[key]

    def _on_grad(self, p: torch.Tensor) -> None:
        if id(p) in self._where and p.grad is not None:
            bucket, i = self._where[id(p)]
            if _layout_of(p) == bucket.layouts[i]:
                self._offload(p)
            # else: step() raises, before reading or writing anything through tide's slices

    def _offload(self, p: torch.Tensor) -> None:
        bucket, i = self._where[id(p)]
        bucket.check_layout(i)  # the copies below read and write as many elements as it had
        grad = p.grad
        if grad.numel() != p.numel():
            raise RuntimeError(f"tide: a gradient has {grad.numel()} elements, its parameter "
                               f"{p.numel()}")
        source = grad
        if source.dtype != bucket.dtype or not source.is_contiguous() or source.is_sparse:
            if source.is_sparse:
                raise ValueError("tide: sparse gradients are not supported")
            source = source.to(bucket.dtype).contiguous()
        stream = None if self._cpu else torch.cuda.current_stream(p.device).cuda_stream
        base = source.data_ptr()
        for piece in bucket.pieces[i]:
            bucket.executor.offload_gradient(piece.subgroup, piece.sub_offset,
                                             base + piece.param_offset * bucket.element_size,
                                             piece.count, bucket.tide_dtype, stream)
        if not self._cpu:
            # The copy reads `source` on tide's offload stream: its memory must not be reused
            # before that copy ran.
            if allocator.is_using_allocator():
                allocator.record_stream(source, bucket.executor.offload_stream())
            else:
                source.record_stream(self._offload_stream(bucket))
        self._keepalive.append(source)
        self._offloaded[id(p)] = (grad, grad._version)

    def _sync(self) -> list[tuple[_Bucket, int]]:
        """Before the gradients are used: offloads again every gradient changed since its hook
        ran (or never offloaded), re-reads master weights of parameters written from outside,
        and returns the parameters that have no gradient."""
        for bucket in self._buckets:
            for i in range(len(bucket.params)):
                bucket.check_layout(i)
        missing = []
        for bucket in self._buckets:
            for i, p in enumerate(bucket.params):
                if p._version != bucket.versions[i]:
                    bucket.read_master(i)
                grad = p.grad
                if grad is None:
                    missing.append((bucket, i))
                    continue
                seen = self._offloaded.get(id(p))
                if seen is None or seen[0] is not grad or seen[1] != grad._version:
                    self._offload(p)
        return missing

    def _release_gradients(self) -> None:
        """After a wait on every offload (grad_stats or step): the gradients may go."""
        self._keepalive.clear()
        self._offloaded.clear()

    # ---- gradient norm and clipping ----

    def grad_norm(self, scale: float = 1.0) -> float:
        """The total L2 norm of the gradients, read from their offloaded copies, divided by
        `scale` (the loss scale they carry, if any): the norm before any clipping, as
        torch.nn.utils.clip_grad_norm_ returns it."""
        self._sync()
        total = 0.0
        for bucket in self._buckets:
            sum_squares, _ = bucket.executor.grad_stats()
            total += sum_squares
        return math.sqrt(total) / scale

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

    # ---- the step ----

    def _headroom(self, device: int) -> int:
        if self._cpu or allocator.is_using_allocator():
            return allocator.headroom(device)["headroom_bytes"]
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * 0.9)

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        if self._gradients_on_gpu:
            for bucket in self._buckets:
                device = 0 if self._cpu else bucket.params[0].device.index
                bucket.executor.prepare(self._policy, self._headroom(device))

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One Adam/AdamW step. It happens exactly or not at all: if it raises before the
        update began, nothing changed (weights, master weights, moments, step counts) and it
        may be called again; once the update began, a fault (a failed copy, a lost device) is
        rolled forward on the CPU and the step completes with the same bits, with a
        RuntimeWarning. Only what cannot be completed raises after that (the model's parameters
        cannot be written on a failed GPU; with gradients_on_gpu, gradients lost with the
        device): the message says what holds."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        t_start = time.monotonic_ns()
        devices = sorted({0 if self._cpu else b.params[0].device.index for b in self._buckets})
        for device in devices:
            allocator.mark_phase("update", device)
        missing = self._sync()
        found_inf = getattr(self, "found_inf", None)
        grad_scale = getattr(self, "grad_scale", None)
        skipped = found_inf is not None and float(found_inf) != 0.0
        scale = (float(grad_scale) if grad_scale is not None else 1.0) / self._clip_coef
        reports: list[dict[str, Any]] = []
        headroom: dict[int, int] = {}
        problems: list[BaseException] = []
        if not skipped:
            headroom = {device: self._headroom(device) for device in devices}
            no_grad: dict[int, list[int]] = {}
            for bucket, i in missing:
                no_grad.setdefault(id(bucket), []).append(i)
            # Before anything changes, on every bucket: the hyperparameters, and what the
            # executors need to complete the step from host memory alone (a failure here
            # raises, and nothing changed).
            steps = []
            for bucket in self._buckets:
                frozen = no_grad.get(id(bucket), [])
                if len(frozen) == len(bucket.params):
                    continue  # as torch: parameters without a gradient are not updated at all
                steps.append((bucket, frozen, self._hyper(bucket, scale)))
            for bucket, frozen, hyper in steps:
                bucket.set_frozen(frozen)
                bucket.executor.ready(hyper)
            # The step: from here it completes (executor.h says how each fault is handled).
            for bucket, frozen, hyper in steps:
                reports.append(self._step_bucket(bucket, frozen, hyper, headroom, problems))
        else:
            # Nothing is updated, but the offloads must be over before the gradients may go.
            for bucket in self._buckets:
                bucket.executor.grad_stats()
        self._clip_coef = 1.0
        self._release_gradients()
        # The step is over: what follows only tidies up and must not make it look undone.
        try:
            if not self._keep_buffers:
                for bucket in self._buckets:
                    bucket.executor.release_buffers()
            for device in devices:
                allocator.mark_phase("end", device)
        except _lib.TideError as error:
            warnings.warn(f"tide: after the step: {error}", RuntimeWarning, stacklevel=2)
        self._record(reports, skipped, t_start, time.monotonic_ns(), headroom)
        if problems:
            raise problems[0]
        return loss

    def _hyper(self, bucket: _Bucket, scale: float) -> kernels.AdamHyper:
        group = self.param_groups[bucket.group_index]
        lr, beta1, beta2, eps, weight_decay = _hyperparameters(group)
        return kernels.AdamHyper(
            lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
            grad_scale=scale, step=bucket.step + 1, decoupled=int(self._decoupled),
            maximize=int(bool(group["maximize"])))

    def _step_bucket(self, bucket: _Bucket, frozen: list[int], hyper: kernels.AdamHyper,
                     headroom: dict[int, int], problems: list[BaseException]) -> dict[str, Any]:
        device = 0 if self._cpu else bucket.params[0].device.index
        report, message = bucket.executor.step(hyper, self._policy, headroom[device])
        # The step counts advance with the committed state, and only then.
        bucket.step += 1
        bucket.state_moved()
        for i, p in enumerate(bucket.params):
            if i not in frozen:
                self.state[p]["step"] += 1
        known = len(problems)
        if report.unwritten or report.not_updated:
            outcome = bucket.executor.outcome()
            if report.unwritten:
                try:
                    bucket.write_unwritten(outcome)
                except Exception as error:  # noqa: BLE001 (a failed GPU: said below)
                    problems.append(RuntimeError(
                        "tide: the optimizer step completed (the optimizer state holds it: "
                        "state_dict() can be saved), but the model's parameters could not be "
                        f"written: {message}; and with torch: {error}"))
            if report.not_updated:
                problems.append(StepIncompleteError(
                    f"tide: {report.not_updated} of {len(bucket.sizes)} subgroups could not be "
                    f"updated ({message}): the optimizer state is inconsistent; restore the "
                    "last checkpoint"))
        if message and len(problems) == known:
            # Completed exactly, after a fault it handled.
            warnings.warn(f"tide: {message}", RuntimeWarning, stacklevel=3)
        for i, p in enumerate(bucket.params):
            bucket.versions[i] = p._version
        placed, summary = bucket.executor.last_plan()
        return {"report": report, "devices": placed, "headroom": headroom[device],
                "gpu_bytes": summary.gpu_bytes}

    def _record(self, reports: list, skipped: bool, t_start: int, t_end: int,
                headroom: dict[int, int]) -> None:
        ran = reports
        stat = {
            "step": len(self.stats) + 1,
            "skipped": skipped,
            "placement": _placement_in_force(self._placement_option),
            "gpu_subgroups": sum(r["report"].gpu_subgroups for r in ran),
            "cpu_subgroups": sum(r["report"].cpu_subgroups for r in ran),
            "fallback_subgroups": sum(r["report"].fallback_subgroups for r in ran),
            "headroom_bytes": min(headroom.values()) if headroom else 0,
            "seconds": sum(r["report"].seconds for r in ran),
            "predicted_seconds": sum(r["report"].predicted_seconds for r in ran),
            "all_cpu_seconds": sum(r["report"].all_cpu_seconds for r in ran),
            "cpu_busy_seconds": sum(r["report"].cpu_busy_seconds for r in ran),
            "buffers": max((r["report"].buffers for r in ran), default=0),
            # GPU memory the update phase's plans used (buffers, kept gradients): carved from
            # tide's allocator when it is in use (its timeline's live bytes include it, its
            # update-phase peaks leave it out), from the driver otherwise.
            "buffer_bytes": max((r["gpu_bytes"] for r in ran), default=0),
            "nonfinite": sum(r["report"].nonfinite for r in ran),
            # Faults the step handled: GPU subgroups redone on the CPU, weights written by torch.
            "rolled_forward_subgroups": sum(r["report"].rolled_forward for r in ran),
            "unwritten_subgroups": sum(r["report"].unwritten for r in ran),
            "devices": ["gpu" if d else "cpu" for r in ran for d in r["devices"]],
            "t_start_ns": t_start,
            "t_end_ns": t_end,
            "rss_bytes": _rss_bytes(),
        }
        self.stats.append(stat)

    @property
    def last_plan(self) -> dict[str, Any] | None:
        """The last step's placement and times (see `stats`), or None before the first step."""
        return self.stats[-1] if self.stats else None

    # ---- checkpoints ----

    def state_dict(self) -> dict[str, Any]:
        """torch.optim.AdamW's layout: per parameter "step", "exp_avg", "exp_avg_sq" (fp32 CPU
        tensors shaped like the parameter), plus "master_param" for low-precision parameters
        (their fp32 master weights; torch.optim ignores it)."""
        live = self.state
        full: dict[Any, Any] = {}
        for bucket in self._buckets:
            for i, p in enumerate(bucket.params):
                entry = {"step": live[p]["step"].clone()}
                if int(entry["step"]) > 0:
                    entry["exp_avg"] = bucket.gather(i, "exp_avg")
                    entry["exp_avg_sq"] = bucket.gather(i, "exp_avg_sq")
                    if bucket.dtype != torch.float32:
                        entry["master_param"] = bucket.gather(i, "param")
                full[p] = entry
        self.state = full  # super().state_dict packs self.state, with its hooks
        try:
            return super().state_dict()
        finally:
            self.state = live

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads tide's or torch.optim.Adam(W)'s state dict. Master weights: the saved ones when
        they round to the parameter's current value, else the parameter's. Everything is
        checked before anything is replaced: a state dict that does not fit (another model's
        shapes, another optimizer's, non-finite values, a negative step or second moment)
        raises ValueError naming the parameter, and the optimizer is left as it was."""
        entries = self._checked_entries(state_dict)
        groups_only = {"state": {}, "param_groups": state_dict["param_groups"]}
        live = self.state
        super().load_state_dict(groups_only)  # takes the groups' hyperparameters
        self.state = live
        by_bucket: dict[int, list[int]] = {}
        for p, step, entry in entries:
            bucket, i = self._where[id(p)]
            bucket.read_master(i)
            if step > 0:
                bucket.scatter(i, "exp_avg", entry["exp_avg"].float().cpu())
                bucket.scatter(i, "exp_avg_sq", entry["exp_avg_sq"].float().cpu())
                master = entry.get("master_param")
                if master is not None:
                    master = master.float().cpu().reshape(p.shape)
                    if torch.equal(master.to(p.dtype), p.detach().cpu()):
                        bucket.scatter(i, "param", master)
                    else:
                        warnings.warn("tide: a saved master_param does not match its parameter "
                                      "(the model changed after the save); using the "
                                      "parameter's value", stacklevel=2)
            else:
                bucket.scatter(i, "exp_avg", torch.zeros(p.numel()))
                bucket.scatter(i, "exp_avg_sq", torch.zeros(p.numel()))
            self.state[p]["step"] = torch.tensor(float(step), dtype=torch.float32)
            by_bucket.setdefault(id(bucket), []).append(step)
        for bucket in self._buckets:
            steps = by_bucket.get(id(bucket), [])
            if steps:
                if len(set(steps)) > 1:
                    warnings.warn("tide: parameters of one bucket have different step counts; "
                                  "tide's bias correction uses the largest", stacklevel=2)
                bucket.step = max(steps)

    _STATE_KEYS = frozenset({"step", "exp_avg", "exp_avg_sq", "master_param"})

    def _checked_entries(self, state_dict: Any) -> list[tuple[torch.Tensor, int, dict]]:
        """(parameter, step, saved entry) for every parameter tide holds, once the whole state
        dict has been checked against this optimizer."""
        if not isinstance(state_dict, dict) or not {"state", "param_groups"} <= state_dict.keys():
            raise ValueError("tide: not an optimizer state dict (it needs 'state' and "
                             "'param_groups')")
        groups, saved_state = state_dict["param_groups"], state_dict["state"]
        if not isinstance(groups, (list, tuple)) or not isinstance(saved_state, dict):
            raise ValueError("tide: not an optimizer state dict ('param_groups' must be a list "
                             "and 'state' a dict)")
        if len(groups) != len(self.param_groups):
            raise ValueError(f"tide: the state dict has {len(groups)} param groups, this "
                             f"optimizer {len(self.param_groups)}")
        entries = []
        for g, (saved, ours) in enumerate(zip(groups, self.param_groups)):
            if not isinstance(saved, dict) or "params" not in saved:
                raise ValueError(f"tide: param group {g} of the state dict has no 'params'")
            missing = [key for key in ("lr", "betas", "eps", "weight_decay") if key not in saved]
            if missing:
                raise ValueError(
                    f"tide: param group {g} of the state dict has no {missing[0]!r}: it is not "
                    "an Adam/AdamW state dict (another optimizer saved it)")
            if saved.get("amsgrad"):
                raise ValueError(f"tide: param group {g} of the state dict is amsgrad's, which "
                                 "tide does not support")
            try:
                _hyperparameters(saved)
            except (TypeError, ValueError) as error:
                raise ValueError(f"tide: param group {g} of the state dict: {error}") from None
            if len(saved["params"]) != len(ours["params"]):
                raise ValueError(f"tide: param group {g} of the state dict has "
                                 f"{len(saved['params'])} parameters, this optimizer's "
                                 f"{len(ours['params'])}")
            for k, (saved_id, p) in enumerate(zip(saved["params"], ours["params"])):
                if id(p) not in self._where:
                    continue  # no elements
                name = f"parameter {k} of param group {g} (shape {tuple(p.shape)})"
                entry = saved_state.get(saved_id, {})
                entries.append((p, self._checked_entry(entry, p, name), entry))
        return entries

    def _checked_entry(self, entry: Any, p: torch.Tensor, name: str) -> int:
        if not isinstance(entry, dict):
            raise ValueError(f"tide: the saved state of {name} is not a dict")
        unknown = sorted(set(entry) - self._STATE_KEYS)
        if unknown:
            raise ValueError(f"tide: the saved state of {name} has {unknown[0]!r}, which "
                             "Adam/AdamW state has not (another optimizer saved it)")
        raw = entry.get("step", 0.0)
        try:
            step = float(raw.item() if isinstance(raw, torch.Tensor) else raw)
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"tide: the saved step of {name} is not a number: {raw!r}") from None
        if not math.isfinite(step) or step < 0 or step != int(step) or step >= 2**62:
            raise ValueError(f"tide: the saved step of {name} is {step}: it must be a whole "
                             "number >= 0")
        if step == 0:
            return 0
        for key in ("exp_avg", "exp_avg_sq", "master_param"):
            value = entry.get(key)
            if value is None:
                if key == "master_param":
                    continue
                raise ValueError(f"tide: the saved state of {name} has step {step:g} but no "
                                 f"{key!r}")
            if not isinstance(value, torch.Tensor) or not value.is_floating_point():
                raise ValueError(f"tide: the saved {key} of {name} is not a floating-point "
                                 "tensor")
            if tuple(value.shape) != tuple(p.shape):
                raise ValueError(f"tide: the saved {key} of {name} has shape "
                                 f"{tuple(value.shape)}: the state dict is another model's")
            if not bool(torch.isfinite(value).all()):
                raise ValueError(f"tide: the saved {key} of {name} has non-finite values")
            if key == "exp_avg_sq" and bool((value < 0).any()):
                raise ValueError(f"tide: the saved exp_avg_sq of {name} has negative values")
        return int(step)

    def _close(self) -> None:
        self._release()


class Adam(AdamW):
    """torch.optim.Adam (L2 weight decay added to the gradient), offloaded as tide.torch.AdamW."""

    _decoupled = False
    _default_weight_decay = 0.0

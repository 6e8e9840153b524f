"""A bucket: the parameters of one param group with one dtype on one device, laid end to end and
cut into subgroups (_layout), and the executor (tide_optimizer) that holds their optimizer state
in pinned host memory. The bucket reads and writes that state through CPU tensors over the
pinned buffers (no copy), and writes the model's parameters where the executor could not.

Nothing here knows about torch.optim: tide.torch.optim drives buckets.
"""

from __future__ import annotations

import warnings

import torch

from tide import kernels
from tide.torch import _executor, _layout, _quant8
from tide.torch._distributed import local

TIDE_DTYPES = {torch.float32: kernels.FLOAT32, torch.bfloat16: kernels.BFLOAT16,
               torch.float16: kernels.FLOAT16}


def layout_of(p: torch.Tensor) -> tuple:
    """What tide's slices of a parameter describe: its memory, shape, strides, dtype, device."""
    return (p.data_ptr(), tuple(p.shape), tuple(p.stride()), p.dtype, p.device)


# The parts of a subgroup's state slot (they move with it); "grad" is a buffer of its own.
_IN_SLOT = ("param", "comp", "exp_avg", "exp_avg_sq", "exp_avg_scale", "exp_avg_sq_scale")
# Swapping the memory under a storage, so that every tensor on it follows (a private method of
# torch's UntypedStorage); without it, views are made again.
_SWAP = hasattr(torch.UntypedStorage, "_swap_data_ptr_")

class Bucket:
    """The parameters of one param group with one dtype on one device, and their executor."""

    def __init__(self, group_index: int, params: list[torch.Tensor], subgroup_size: int, *,
                 device: int, cpu_threads: int, gradients_on_gpu: bool | None,
                 state_dtype: torch.dtype = torch.float32,
                 master_dtype: torch.dtype = torch.float32,
                 owners: list[torch.Tensor] | None = None, host: bool = False):
        self.group_index = group_index
        self.device = device
        # Host-resident (FSDP2's CPUOffloadPolicy): the fp32 parameters in host memory are the
        # master weights, updated where they are; the gradients are read where they are
        # (host_grads, per slice, handed over at every step); the pinned state is the moments.
        self.host = host
        self.params = params
        # The model's parameters: `params` themselves, or the FSDP2 DTensors whose local shards
        # `params` are (_distributed): their gradients, their keys in opt.state.
        self.owners = params if owners is None else owners
        self.dtype = params[0].dtype
        self.tide_dtype = TIDE_DTYPES[self.dtype]
        # The moments' dtype in pinned memory (fp32 or bf16, or torch.uint8 for 8-bit block-wise
        # moments, _quant8); the master weights are fp32.
        self.state_dtype = state_dtype
        self.quantized = state_dtype == torch.uint8
        # torch.bfloat16: bf16 master weights with compensation (no fp32 master): the pinned
        # "param" is the parameters' own bf16 values, "comp" their bf16 compensation.
        self.master_dtype = master_dtype
        self.bf16_master = master_dtype == torch.bfloat16
        if self.bf16_master and host:
            raise ValueError("tide: master_dtype=torch.bfloat16 does not go with host-resident "
                             "parameters (host_params: fp32 parameters that are their own master "
                             "weights); bf16 master weights need bfloat16 parameters")
        if self.bf16_master and self.dtype != torch.bfloat16:
            raise ValueError(f"tide: master_dtype=torch.bfloat16 needs bfloat16 parameters (the "
                             f"model's parameters are the master weights), got {self.dtype}; "
                             "use master_dtype=torch.float32 for these")
        if self.bf16_master and self.quantized:
            raise ValueError("tide: master_dtype=torch.bfloat16 with 8-bit moments "
                             "(state_dtype=\"q8\") is not supported: use torch.float32 or "
                             "torch.bfloat16 moments")
        if self.quantized:
            # Cuts at block boundaries: every subgroup but the last holds whole blocks.
            subgroup_size = -(-subgroup_size // _quant8.BLOCK) * _quant8.BLOCK
        self.element_size = params[0].element_size()
        self.sizes, self.pieces = _layout.split([p.numel() for p in params], subgroup_size)
        slices = [(piece.subgroup, piece.sub_offset, piece.count,
                   p.data_ptr() + piece.param_offset * self.element_size)
                  for p, mine in zip(params, self.pieces) for piece in mine]
        self.executor = _executor.Executor(self.sizes, slices, device=device, dtype=self.tide_dtype,
                                           cpu_threads=cpu_threads,
                                           gradients_on_gpu=gradients_on_gpu,
                                           state_dtype=(_quant8.TIDE_STATE_BLOCK_Q8
                                                        if self.quantized
                                                        else TIDE_DTYPES[state_dtype]),
                                           master_dtype=TIDE_DTYPES[master_dtype],
                                           host_params=host)
        pageable, pageable_bytes = self.executor.pageable()
        if pageable:
            # The state outgrew the pinned share: it trains, on the CPU for those subgroups, and
            # the program should hear which knob buys the GPU back (docs/guide/pinned.md).
            warnings.warn(f"tide: {pageable} of {len(self.sizes)} subgroups of the optimizer state "
                          f"({pageable_bytes / 2**20:.1f} MiB) are held in pageable memory and "
                          "updated on the CPU only: they could not be pinned (past this rank's "
                          "share of TIDE_NODE_PINNED_LIMIT, or the host would not pin more); "
                          "raise the limit to update them on the GPU", RuntimeWarning,
                          stacklevel=4)
        self.host_grads = [0] * len(slices)  # host: per slice, its gradient's address
        first = 0  # parameter i's slices are slices[first_slice[i]:][:len(pieces[i])]
        self.first_slice = []
        for mine in self.pieces:
            self.first_slice.append(first)
            first += len(mine)
        # What tide's slices describe: the memory the parameters had when the optimizer was made.
        self.layouts = [layout_of(p) for p in params]
        self.versions = [self.version(i) for i in range(len(params))]
        self.step = 0  # update phases run: the bias correction's step number
        self.frozen: tuple[int, ...] = ()  # the parameters the executor leaves untouched
        self._views: list[dict[str, torch.Tensor]] | None = None
        # Resident subgroups (TIDE_RESIDENCY) keep their state on the GPU after a step: the
        # pinned buffers are a mirror, made current before the state is read or written here.
        self.mirror_stale = False
        self._moved = False  # a step ran since the views were made
        self._moved_to: list | None = None  # where the step said the state is
        # 8-bit moments written (scatter) and not yet quantized (flush): per (subgroup, key), the
        # subgroup's fp32 values and which of its blocks were written.
        self._pending: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        for i in range(len(params)):
            self.read_master(i)

    @property
    def entry_keys(self) -> list[str]:
        """The state keys of each parameter's entry (opt.state, state_dict()): torch's moments,
        and tide's master weights of a low-precision parameter ("master_param", fp32), or with
        bf16 master weights their compensation ("master_comp", bf16: the weights are the
        parameter itself, as in torch.optim, which keeps no master)."""
        if self.bf16_master:
            return ["exp_avg", "exp_avg_sq", "master_comp"]
        return ["exp_avg", "exp_avg_sq"] + (["master_param"] if self.dtype != torch.float32
                                            else [])

    def version(self, i: int) -> tuple[int, int]:
        """Parameter i's version counters: its owner's (a DTensor's in-place ops count there, not
        on its local shard) and its own."""
        return (self.owners[i]._version, self.params[i]._version)

    def check_layout(self, i: int) -> None:
        """Raises when parameter i is no longer the memory tide writes (before anything is
        read or written through its slices)."""
        now = layout_of(local(self.owners[i]))
        if now != self.layouts[i]:
            raise RuntimeError(
                f"tide: a parameter changed since the optimizer was created (was {self.layouts[i]}, "
                f"now {now}): its memory moved or was resized (param.data replaced, the model "
                "moved with .to()); create the optimizer after the model is in place")

    @property
    def views(self) -> list[dict[str, torch.Tensor]]:
        """CPU tensors over each subgroup's pinned buffers (no copy): "param" (the fp32 master
        weights; bf16 master weights: the bf16 weights, and "comp" their compensation),
        "exp_avg", "exp_avg_sq" (of state_dtype; 8-bit moments: their uint8 codes, and
        "exp_avg_scale", "exp_avg_sq_scale" their blocks' fp32 scales), "grad"; host-resident
        buckets have no "param" (the parameters are) and no "grad". A step may move a
        subgroup's state slot to another buffer (the commit point's spare slots, executor.h);
        the same tensors follow it, and so does every tensor derived from them: tide swaps the
        memory under their storages (see _follow). Each keeps its buffer allocated while it, or a
        tensor on its storage, lives (Executor.memory)."""
        if self._views is None:
            self._views = [self._subgroup_views(i) for i in range(len(self.sizes))]
            self._moved, self._moved_to = False, None
        elif self._moved:
            self._follow_moves()
        return self._views

    def state_moved(self, buffers: list[_executor.SubgroupBuffers] | None = None) -> None:
        """A step ran: a subgroup's state may be in another buffer now; `buffers`: where each
        subgroup's is (the step's result said), else asked when needed. With them, views made
        before follow at once, so that tensors derived from them show the step's state when
        step() returns."""
        self._moved = True
        self._moved_to = buffers
        if buffers is not None and self._views is not None and _SWAP:
            self._follow_moves()

    def _follow_moves(self) -> None:
        """Every subgroup's views onto where the last step left its state."""
        for i in range(len(self._views)):
            self._follow(i, self._moved_to[i] if self._moved_to else self.executor.buffers(i))
        self._moved, self._moved_to = False, None

    def _follow(self, subgroup: int, b: _executor.SubgroupBuffers) -> None:
        """The views of a subgroup whose state slot moved (as a whole: every part keeps its
        offset in it; the gradient buffer never moves), onto the new slot. The stable handle is
        each view's storage: its memory is swapped for the new slot's
        (UntypedStorage._swap_data_ptr_, as torch's CUDA graph trees and FSDP swap storages), so
        the same storages, and every tensor on them (opt.state's, a DTensor's local tensor,
        DeepSpeed's narrow views taken once), show the live state without being re-pointed.
        Without that call (an older torch) the views are made again, and opt.state's own
        tensors are re-pointed (_state.py); tensors derived from them then stay behind."""
        views = self._views[subgroup]
        delta = b.exp_avg - views["exp_avg"].data_ptr()
        if delta == 0:
            return
        if not _SWAP:
            self._views[subgroup] = self._subgroup_views(subgroup, b)
            return
        for key in _IN_SLOT:
            if key in views:
                old = views[key]
                raw = self.executor.memory(old.data_ptr() + delta, old.numel() * old.element_size())
                new = torch.frombuffer(raw, dtype=old.dtype, count=old.numel())
                old.untyped_storage()._swap_data_ptr_(new.untyped_storage())

    def ensure_mirror(self) -> None:
        """Makes the pinned buffers the state (a copy from the GPU when subgroups are resident
        there): before tide.torch reads or writes them, or the program may through opt.state.
        What is written there after it is what the next step updates."""
        if self.mirror_stale:
            self.executor.sync_state(written=True)
            self.mirror_stale = False

    def state_views(self, subgroup: int) -> dict[str, torch.Tensor]:
        """A subgroup's views (see views), the pinned buffers made the state first."""
        self.ensure_mirror()
        return self.views[subgroup]

    def drop_views(self) -> None:
        self._views = None

    def _subgroup_views(self, subgroup: int, b: _executor.SubgroupBuffers | None = None
                        ) -> dict[str, torch.Tensor]:
        b = self.executor.buffers(subgroup) if b is None else b

        def view(address: int, dtype: torch.dtype, element_size: int) -> torch.Tensor:
            raw = self.executor.memory(address, b.count * element_size)
            return torch.frombuffer(raw, dtype=dtype, count=b.count)

        moment_size = torch.empty(0, dtype=self.state_dtype).element_size()
        views = {"exp_avg": view(b.exp_avg, self.state_dtype, moment_size),
                 "exp_avg_sq": view(b.exp_avg_sq, self.state_dtype, moment_size)}
        if self.bf16_master:
            weights, comp = self.executor.master_bf16(subgroup)
            views["param"] = view(weights, torch.bfloat16, 2)
            views["comp"] = view(comp, torch.bfloat16, 2)
        elif not self.host:  # host-resident: the parameters are the masters
            views["param"] = view(b.param, torch.float32, 4)
        if not self.host:  # host-resident: no gradient buffer
            views["grad"] = view(b.grad, self.dtype, self.element_size)
        if self.quantized:
            scale_m, scale_v, blocks = self.executor.q8_scales(subgroup)
            for key, address in (("exp_avg_scale", scale_m), ("exp_avg_sq_scale", scale_v)):
                raw = self.executor.memory(address, 4 * blocks)
                views[key] = torch.frombuffer(raw, dtype=torch.float32, count=blocks)
        return views

    def pinned(self, key: str, piece: _layout.Piece) -> torch.Tensor:
        return self.state_views(piece.subgroup)[key][piece.sub_offset:
                                                     piece.sub_offset + piece.count]

    def read_master(self, i: int) -> None:
        """Master weights of parameter i from the parameter itself (bf16 master weights: its
        values, with zero compensation; host-resident: they are the parameter)."""
        if self.host:
            self.versions[i] = self.version(i)
            return
        flat = self.params[i].detach().reshape(-1)
        for piece in self.pieces[i]:
            self.pinned("param", piece).copy_(
                flat[piece.param_offset:piece.param_offset + piece.count])
            if self.bf16_master:
                self.pinned("comp", piece).zero_()
        self.versions[i] = self.version(i)

    def gather(self, i: int, key: str, out: torch.Tensor | None = None) -> torch.Tensor:
        """Parameter i's `key` state (fp32, on the CPU, shaped like the parameter): a copy, into
        `out` when given (contiguous, as many elements). bf16 moments are upcast (exactly), 8-bit
        ones dequantized (bit for bit as the kernels read them)."""
        if out is None:
            # The compensation of bf16 master weights stays bf16 (torch's load_state_dict casts
            # state to the parameter's dtype: bf16 survives it exactly).
            out = torch.empty(self.params[i].shape,
                              dtype=torch.bfloat16 if key == "comp" else torch.float32)
        if self.host and key == "param":
            out.view(-1).copy_(self.params[i].detach().reshape(-1))
            return out
        flat = out.view(-1)
        for piece in self.pieces[i]:
            part = flat[piece.param_offset:piece.param_offset + piece.count]
            if self.quantized and key != "param":
                part.copy_(self._moment(piece.subgroup, key)[
                    piece.sub_offset:piece.sub_offset + piece.count])
            else:
                part.copy_(self.pinned(key, piece))
        return out

    def scatter(self, i: int, key: str, value: torch.Tensor) -> None:
        """Parameter i's `key` state from `value` (any float dtype, as many elements): into bf16
        moments it is rounded to nearest even, once (torch's cast, as the kernels round); 8-bit
        moments are quantized at the next flush(), once, with the rest of their blocks (which may
        hold other parameters' elements: those keep their values, requantized under the block's
        new scale, as the kernels requantize a block)."""
        flat = value.detach().reshape(-1)
        if flat.numel() != self.params[i].numel():
            raise ValueError(f"state {key!r} has {flat.numel()} elements, the parameter "
                             f"{self.params[i].numel()}")
        if self.host and key == "param":
            self.params[i].detach().view(-1).copy_(flat)
            return
        for piece in self.pieces[i]:
            part = flat[piece.param_offset:piece.param_offset + piece.count]
            if self.quantized and key != "param":
                values = self._moment(piece.subgroup, key, pending=True)
                values[piece.sub_offset:piece.sub_offset + piece.count] = part
                _, written = self._pending[(piece.subgroup, key)]
                written[piece.sub_offset // _quant8.BLOCK:
                        _quant8.blocks(piece.sub_offset + piece.count)] = True
            else:
                self.pinned(key, piece).copy_(part)

    def _moment(self, subgroup: int, key: str, pending: bool = False) -> torch.Tensor:
        """8-bit moment `key` of a subgroup as fp32 values: what was written and not yet
        flushed, else the codes dequantized; with `pending`, a buffer that flush() quantizes."""
        held = self._pending.get((subgroup, key))
        if held is not None:
            return held[0]
        views = self.state_views(subgroup)
        values = _quant8.dequantize(key, views[key], views[key + "_scale"])
        if pending:
            written = torch.zeros(views[key + "_scale"].numel(), dtype=torch.bool)
            self._pending[(subgroup, key)] = (values, written)
        return values

    def flush(self) -> None:
        """8-bit moments written since the last flush are quantized into the pinned state (the
        blocks written, each once). Before anything reads the codes: a step, state_dict()."""
        for (subgroup, key), (values, written) in self._pending.items():
            views = self.state_views(subgroup)
            codes, scales = views[key], views[key + "_scale"]
            for first, last in _runs(written):
                begin, end = first * _quant8.BLOCK, min(last * _quant8.BLOCK, codes.numel())
                codes[begin:end], scales[first:last] = _quant8.quantize(key, values[begin:end])
        self._pending.clear()

    def q8_state(self, i: int) -> dict[str, torch.Tensor]:
        """Parameter i's exact 8-bit state (flushed): its codes of each moment ("exp_avg_q8",
        "exp_avg_sq_q8", uint8, flat) and the scales of every block its pieces touch, piece after
        piece ("exp_avg_q8_scales", ...), and where its pieces lie ("q8_pieces": subgroup
        offset and count of each), which a load must find the same to restore them."""
        out: dict[str, torch.Tensor] = {}
        pieces = self.pieces[i]
        for key in ("exp_avg", "exp_avg_sq"):
            codes, scales = [], []
            for piece in pieces:
                views = self.state_views(piece.subgroup)
                codes.append(views[key][piece.sub_offset:piece.sub_offset + piece.count].clone())
                scales.append(views[key + "_scale"][_touched(piece)].clone())
            out[key + "_q8"] = torch.cat(codes)
            out[key + "_q8_scales"] = torch.cat(scales)
        out["q8_pieces"] = torch.tensor([[p.sub_offset, p.count] for p in pieces],
                                        dtype=torch.int64)
        return out

    def q8_fits(self, i: int, entry: dict) -> bool:
        """Whether `entry` holds parameter i's exact 8-bit state for this bucket's layout (fp32
        scales: a checkpoint that went through torch.optim with a bf16 model has them rounded)."""
        pieces = entry.get("q8_pieces")
        want = [[p.sub_offset, p.count] for p in self.pieces[i]]
        return (self.quantized and isinstance(pieces, torch.Tensor)
                and pieces.tolist() == want
                and all(entry[k + "_q8_scales"].dtype == torch.float32
                        for k in ("exp_avg", "exp_avg_sq")))

    def load_q8_state(self, i: int, entry: dict) -> None:
        """Parameter i's codes and its blocks' scales, exactly as saved (q8_fits(i, entry))."""
        for key in ("exp_avg", "exp_avg_sq"):
            codes = entry[key + "_q8"].detach().cpu().to(torch.uint8)
            scales = entry[key + "_q8_scales"].detach().cpu().float()
            done_codes = done_scales = 0
            for piece in self.pieces[i]:
                views = self.state_views(piece.subgroup)
                views[key][piece.sub_offset:piece.sub_offset + piece.count] = (
                    codes[done_codes:done_codes + piece.count])
                touched = _touched(piece)
                n = touched.stop - touched.start
                views[key + "_scale"][touched] = scales[done_scales:done_scales + n]
                done_codes += piece.count
                done_scales += n

    def set_gradient(self, i: int, grad: torch.Tensor | None) -> None:
        """Host-resident: parameter i's gradient for the coming step (fp32, contiguous, in host
        memory, held by the caller until the step returned), or None."""
        base = 0 if grad is None else grad.data_ptr()
        for k, piece in enumerate(self.pieces[i]):
            self.host_grads[self.first_slice[i] + k] = (
                base + piece.param_offset * self.element_size if base else 0)

    def set_frozen(self, frozen: list[int]) -> None:
        """The parameters (indices) the coming steps leave exactly as they are."""
        flags = self.frozen_flags(frozen)
        if flags is not None:
            self.executor.set_frozen(flags)

    def frozen_flags(self, frozen: list[int]) -> list[bool] | None:
        """Per slice, frozen or not, for the executor, when `frozen` (parameter indices) is not
        what it has (None when it is); from here it is what the bucket has."""
        key = tuple(sorted(frozen))
        if key == self.frozen:
            return None
        self.frozen = key
        return [i in key for i, mine in enumerate(self.pieces) for _ in mine]



def _touched(piece: _layout.Piece) -> slice:
    """The quantization blocks of its subgroup that a piece has elements in."""
    return slice(piece.sub_offset // _quant8.BLOCK, _quant8.blocks(piece.sub_offset + piece.count))


def _runs(flags: torch.Tensor) -> list[tuple[int, int]]:
    """[first, last) of each run of True in a bool tensor."""
    runs: list[tuple[int, int]] = []
    start = None
    for k, flag in enumerate(flags.tolist() + [False]):
        if flag and start is None:
            start = k
        elif not flag and start is not None:
            runs.append((start, k))
            start = None
    return runs


def release(hooks: list, buckets: list[Bucket]) -> None:
    """An optimizer's end: its gradient hooks removed, its executors destroyed (once)."""
    for hook in hooks:
        hook.remove()
    hooks.clear()
    for bucket in buckets:
        # The bucket's own views go first: then only tensors that the program (or opt.state)
        # still holds keep the executor's memory.
        bucket.drop_views()
        bucket.executor.close()
    buckets.clear()

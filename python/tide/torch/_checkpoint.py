"""State dicts in torch.optim.Adam(W)'s layout: checked against the optimizer before anything is
replaced, and loaded into a bucket's pinned state.

Per parameter: "step", "exp_avg", "exp_avg_sq" (fp32, shaped like the parameter), and for
low-precision parameters "master_param" (tide's fp32 master weights; torch.optim ignores it), or
with bf16 master weights (master_dtype=torch.bfloat16) "master_comp" (their bf16 compensation:
the weights are the parameter itself; torch.optim ignores it too).
For an FSDP2 parameter (a DTensor) they are DTensors with its placements, and this rank checks
and loads its local shard of them.
With 8-bit moments (state_dtype="q8") also Q8_KEYS, the exact quantized state (Bucket.q8_state):
a load into an optimizer with the same layout restores it bit for bit; any other load quantizes
the fp32 moments, once.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable

import torch

from tide.torch import _quant8
from tide.torch._arguments import hyperparameters
from tide.torch._bucket import Bucket
from tide.torch._distributed import is_sharded, local

Q8_KEYS = frozenset({"exp_avg_q8", "exp_avg_sq_q8", "exp_avg_q8_scales", "exp_avg_sq_q8_scales",
                     "q8_pieces"})
STATE_KEYS = frozenset({"step", "exp_avg", "exp_avg_sq", "master_param", "master_comp"}) | Q8_KEYS


def checked_entries(state_dict: Any, param_groups: list[dict[str, Any]],
                    holds: Callable[[torch.Tensor], bool],
                    state_dtype_of: Callable[[torch.Tensor], torch.dtype] = lambda p: torch.float32
                    ) -> list[tuple[torch.Tensor, int, dict]]:
    """(parameter, step, saved entry) for every parameter the optimizer holds (`holds`), once
    the whole state dict has been checked against its param groups (and against the dtype its
    moments are kept in, `state_dtype_of`). Raises ValueError naming what does not fit."""
    if not isinstance(state_dict, dict) or not {"state", "param_groups"} <= state_dict.keys():
        raise ValueError("tide: not an optimizer state dict (it needs 'state' and "
                         "'param_groups')")
    groups, saved_state = state_dict["param_groups"], state_dict["state"]
    if not isinstance(groups, (list, tuple)) or not isinstance(saved_state, dict):
        raise ValueError("tide: not an optimizer state dict ('param_groups' must be a list "
                         "and 'state' a dict)")
    if len(groups) != len(param_groups):
        raise ValueError(f"tide: the state dict has {len(groups)} param groups, this "
                         f"optimizer {len(param_groups)}")
    entries = []
    for g, (saved, ours) in enumerate(zip(groups, param_groups)):
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
            hyperparameters(saved)
        except (TypeError, ValueError) as error:
            raise ValueError(f"tide: param group {g} of the state dict: {error}") from None
        if len(saved["params"]) != len(ours["params"]):
            raise ValueError(f"tide: param group {g} of the state dict has "
                             f"{len(saved['params'])} parameters, this optimizer's "
                             f"{len(ours['params'])}")
        for k, (saved_id, p) in enumerate(zip(saved["params"], ours["params"])):
            if not holds(p):
                continue  # no elements
            name = f"parameter {k} of param group {g} (shape {tuple(p.shape)})"
            entry = saved_state.get(saved_id, {})
            entries.append((p, checked_entry(entry, p, name, state_dtype_of(p)), entry))
    return entries


def checked_entry(entry: Any, p: torch.Tensor, name: str,
                  state_dtype: torch.dtype = torch.float32) -> int:
    """The step of one parameter's saved state, once the entry has been checked; moments kept in
    `state_dtype` must stay finite in it (an fp32 value above bf16's largest rounds to inf)."""
    if not isinstance(entry, dict):
        raise ValueError(f"tide: the saved state of {name} is not a dict")
    unknown = sorted(set(entry) - STATE_KEYS)
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
    for key in ("exp_avg", "exp_avg_sq", "master_param", "master_comp"):
        value = entry.get(key)
        if is_sharded(p) and value is not None:
            if not is_sharded(value) or value.placements != p.placements:
                raise ValueError(f"tide: the saved {key} of {name} is not sharded as the "
                                 f"parameter ({tuple(p.placements)}): load it with "
                                 "torch.distributed.checkpoint, which reshards")
            value = local(value)
            if tuple(value.shape) != tuple(local(p).shape):
                raise ValueError(f"tide: the saved {key} of {name} has a local shard of "
                                 f"shape {tuple(value.shape)}, this rank's parameter "
                                 f"{tuple(local(p).shape)}")
        if value is None:
            if key in ("master_param", "master_comp"):
                continue
            raise ValueError(f"tide: the saved state of {name} has step {step:g} but no "
                             f"{key!r}")
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            raise ValueError(f"tide: the saved {key} of {name} is not a floating-point "
                             "tensor")
        if not is_sharded(p) and tuple(value.shape) != tuple(p.shape):
            raise ValueError(f"tide: the saved {key} of {name} has shape "
                             f"{tuple(value.shape)}: the state dict is another model's")
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"tide: the saved {key} of {name} has non-finite values")
        if key == "exp_avg_sq" and bool((value < 0).any()):
            raise ValueError(f"tide: the saved exp_avg_sq of {name} has negative values")
        if (key in ("exp_avg", "exp_avg_sq") and state_dtype == torch.bfloat16
                and not bool(torch.isfinite(value.to(state_dtype)).all())):
            raise ValueError(f"tide: the saved {key} of {name} has values too large for the "
                             f"optimizer's state_dtype {state_dtype}")
    checked_q8(entry, p, name)
    return int(step)


def checked_q8(entry: dict, p: torch.Tensor, name: str) -> None:
    """The exact 8-bit state of an entry, when it has one: all of Q8_KEYS, codes of the
    parameter's size, scales finite and >= 0 (those are the absolute maxima of blocks)."""
    present = Q8_KEYS & set(entry)
    if not present:
        return
    if present != Q8_KEYS:
        raise ValueError(f"tide: the saved state of {name} has {sorted(present)[0]!r} but not "
                         f"{sorted(Q8_KEYS - present)[0]!r}")
    # torch.optim's load_state_dict casts every state tensor to the parameter's dtype: codes and
    # pieces that went through it are floats (whole numbers, exactly, up to 2^24 in fp32).
    pieces = entry["q8_pieces"]
    if (not _whole(pieces) or pieces.dim() != 2 or pieces.shape[1] != 2
            or bool((pieces < 0).any()) or int(pieces[:, 1].sum()) != p.numel()):
        raise ValueError(f"tide: the saved q8_pieces of {name} do not describe its elements")
    for key in ("exp_avg", "exp_avg_sq"):
        codes, scales = entry[key + "_q8"], entry[key + "_q8_scales"]
        if not _whole(codes) or codes.numel() != p.numel() or bool((codes > 255).any()):
            raise ValueError(f"tide: the saved {key}_q8 of {name} is not {p.numel()} uint8 "
                             "codes")
        blocks = sum(_quant8.blocks(int(o + n)) - int(o) // _quant8.BLOCK
                     for o, n in pieces.tolist())
        if (not isinstance(scales, torch.Tensor) or not scales.is_floating_point()
                or scales.numel() != blocks or not bool(torch.isfinite(scales).all())
                or bool((scales < 0).any())):
            raise ValueError(f"tide: the saved {key}_q8_scales of {name} are not {blocks} "
                             "finite scales >= 0")


def load_entry(bucket: Bucket, i: int, step: int, entry: dict) -> None:
    """Parameter i of `bucket` takes a checked entry: its moments (zeros at step 0), and its
    master weights, the saved ones when they round to the parameter's current value, else the
    parameter's. bf16 master weights are the parameter's values; their compensation is the saved
    "master_comp" (tide's bf16-master state dict), else what a saved fp32 "master_param" has
    beyond them, else zero (torch's state dict: no master)."""
    p = bucket.params[i]
    bucket.read_master(i)
    if step > 0:
        bucket.scatter(i, "exp_avg", local(entry["exp_avg"]).float().cpu())
        bucket.scatter(i, "exp_avg_sq", local(entry["exp_avg_sq"]).float().cpu())
        if bucket.bf16_master:
            _load_compensation(bucket, i, entry)
            return
        master = entry.get("master_param")
        comp = entry.get("master_comp")
        if master is None and comp is not None:
            # A bf16-master state dict into an fp32 master: the weight is w + c.
            master = p.detach().cpu().float() + local(comp).float().cpu().reshape(p.shape)
        if master is not None:
            master = local(master).float().cpu().reshape(p.shape)
            if torch.equal(master.to(p.dtype), p.detach().cpu()):
                bucket.scatter(i, "param", master)
            else:
                warnings.warn("tide: a saved master_param does not match its parameter "
                              "(the model changed after the save); using the "
                              "parameter's value", stacklevel=4)
    else:
        bucket.scatter(i, "exp_avg", torch.zeros(p.numel()))
        bucket.scatter(i, "exp_avg_sq", torch.zeros(p.numel()))


def _load_compensation(bucket: Bucket, i: int, entry: dict) -> None:
    """The bf16 compensation of parameter i (read_master zeroed it): as saved, or from an fp32
    master that rounds to the parameter (its remainder, rounded to bf16, as the kernels split a
    weight), else zero."""
    p = bucket.params[i]
    comp = entry.get("master_comp")
    if comp is not None:
        bucket.scatter(i, "comp", local(comp).cpu().reshape(p.shape))
        return
    master = entry.get("master_param")
    if master is None:
        return
    master = local(master).float().cpu().reshape(p.shape)
    weights = p.detach().cpu()
    if torch.equal(master.to(torch.bfloat16), weights):
        bucket.scatter(i, "comp", (master - weights.float()).to(torch.bfloat16))
    else:
        warnings.warn("tide: a saved master_param does not match its parameter (the model "
                      "changed after the save); starting its compensation at zero",
                      stacklevel=5)


def _whole(t: Any) -> bool:
    """A real tensor of whole numbers >= 0."""
    if not isinstance(t, torch.Tensor) or t.is_complex() or t.dtype == torch.bool:
        return False
    return bool(((t >= 0) & (t == t.round() if t.is_floating_point() else t >= 0)).all())

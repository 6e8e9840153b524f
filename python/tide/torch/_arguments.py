"""The arguments of tide.torch.AdamW / Adam: tide's own (subgroup_size, placement, threads) and
the hyperparameters of a param group, checked as torch.optim.AdamW checks them, with messages
that name the value given.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tide import _lib
from tide.torch import _executor

DEFAULT_SUBGROUP_SIZE = 1 << 24  # elements: 192 MiB of fp32 state (p, m, v) per GPU buffer

# TIDE_* knobs are parsed by tide (config/, through _lib.knob), never here.


def subgroup_size(option: int | None) -> int:
    if option is not None:
        if isinstance(option, bool) or not isinstance(option, int) or option < 1:
            raise ValueError(f"subgroup_size must be a positive integer, got {option!r}")
        return option
    value = _lib.knob("TIDE_SUBGROUP_SIZE")
    return value.integer if value.set else DEFAULT_SUBGROUP_SIZE


_PLACEMENT_NAMES = {_executor.PLACEMENT_AUTO: "auto", _executor.PLACEMENT_CPU: "cpu",
                    _executor.PLACEMENT_GPU: "gpu"}


def placement(option: str | int | None) -> _executor.PlacementPolicy | None:
    """None: TIDE_PLACEMENT (read by tide, strictly, at each step), else auto. The argument is
    parsed by tide as TIDE_PLACEMENT's values are."""
    if option is None:
        return None
    if isinstance(option, (str, int)) and not isinstance(option, bool):
        try:
            value = _lib.knob("TIDE_PLACEMENT", str(option))
        except ValueError:
            value = None
        if value is not None and value.set:
            return _executor.policy(value.choice, int(value.integer))
    accepts = _lib.knob("TIDE_PLACEMENT", "auto").accepts.decode()
    raise ValueError(f"placement must be {accepts} (one GPU subgroup every K), got {option!r}")


def placement_name(policy: _executor.PlacementPolicy) -> str | int:
    """'auto', 'cpu', 'gpu' or K: the policy a step ran under (its result says)."""
    return _PLACEMENT_NAMES.get(policy.kind, policy.k)


def placement_in_force(option: str | int | None) -> str | int:
    """The policy steps run under: the argument, else TIDE_PLACEMENT (as tide reads it), else
    'auto'."""
    policy = placement(option)
    if policy is None:
        value = _lib.knob("TIDE_PLACEMENT")
        if not value.set:
            return "auto"
        policy = _executor.policy(value.choice, int(value.integer))
    return placement_name(policy)


def choice_knob(variable: str, choices: dict[str, Any], default: Any) -> Any:
    """A TIDE_* variable that names one of `choices` (their values returned, in the order tide
    lists them), as tide reads it: unset or empty gives `default`; a bad value is a ValueError
    with tide's message."""
    value = _lib.knob(variable)
    return list(choices.values())[value.choice] if value.set else default


# "q8": 8-bit block-wise moments (_quant8), kept as torch.uint8 codes.
STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "q8": torch.uint8}


def state_dtype(option: torch.dtype | str | None) -> torch.dtype:
    """The moments' format: the argument, else TIDE_STATE_DTYPE, else torch.float32;
    torch.uint8 stands for "q8" (8-bit block-wise moments)."""
    if option is not None:
        if option == "q8":
            return torch.uint8
        if option not in (torch.float32, torch.bfloat16, torch.uint8):
            raise ValueError(f"state_dtype must be torch.float32, torch.bfloat16 or \"q8\" "
                             f"(torch.uint8), got {option!r}")
        return option
    return choice_knob("TIDE_STATE_DTYPE", STATE_DTYPES, torch.float32)


MASTER_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def master_dtype(option: torch.dtype | str | None) -> torch.dtype:
    """The master weights' format: the argument, else TIDE_MASTER_DTYPE, else torch.float32
    (an fp32 master); torch.bfloat16: bf16 master weights with compensation."""
    if option is not None:
        if isinstance(option, str) and option in MASTER_DTYPES:
            return MASTER_DTYPES[option]
        if option not in (torch.float32, torch.bfloat16):
            raise ValueError(f"master_dtype must be torch.float32 or torch.bfloat16, got "
                             f"{option!r}")
        return option
    return choice_knob("TIDE_MASTER_DTYPE", MASTER_DTYPES, torch.float32)


STATE_ROUNDINGS = ("nearest", "stochastic")


def state_rounding(option: str | None, state_dtype: torch.dtype) -> str:
    """How bf16 moments are rounded: the argument, else TIDE_STATE_ROUNDING, else "nearest".
    "stochastic" needs bf16 moments (fp32 ones are not rounded, 8-bit ones have their own
    rounding): ValueError otherwise."""
    if option is not None:
        if option not in STATE_ROUNDINGS:
            raise ValueError(f"state_rounding must be 'nearest' or 'stochastic', got {option!r}")
        where = "state_rounding='stochastic'"
        mode = option
    else:
        mode = choice_knob("TIDE_STATE_ROUNDING", {r: r for r in STATE_ROUNDINGS}, "nearest")
        where = "TIDE_STATE_ROUNDING=stochastic"
    if mode == "stochastic" and state_dtype != torch.bfloat16:
        raise ValueError(f"{where} applies to bf16 moments (state_dtype=torch.bfloat16) only; "
                         f"the moments here are {'q8' if state_dtype == torch.uint8 else state_dtype}")
    return mode


def rounding_seed(option: int | None) -> int:
    """The seed of stochastic rounding: the argument, else torch's initial seed (what
    torch.manual_seed set), so that a seeded program rounds the same way every run."""
    if option is None:
        return torch.initial_seed() & (2**64 - 1)
    if isinstance(option, bool) or not isinstance(option, int) or not 0 <= option < 2**64:
        raise ValueError(f"state_rounding_seed must be an integer from 0 to 2**64 - 1, "
                         f"got {option!r}")
    return option


def threads(option: int | None) -> int:
    if option is None:
        return 0
    if isinstance(option, bool) or not isinstance(option, int) or not 1 <= option <= 1024:
        raise ValueError(f"threads must be an integer from 1 to 1024, got {option!r}")
    return option


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"Invalid {name} value: {value!r} (must be finite)")
    return float(value)


def hyperparameters(group: dict[str, Any]) -> tuple[float, float, float, float, float]:
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

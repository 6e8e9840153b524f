"""8-bit block-wise moments (state_dtype="q8") as torch sees them: dequantized to fp32 and
quantized from it, bit for bit as the kernels do (kernels/quant8.h).

A moment of a subgroup is one uint8 code per element and one fp32 scale per block of BLOCK
elements counted from the subgroup's element 0 (the last block may be partial). exp_avg's code
is a sign bit and 7 bits of magnitude, exp_avg_sq's 8 bits of an unsigned map; an element's
value is map[code] · scale, each product rounded once to fp32. Quantizing a block: its scale is
the absolute maximum of its values, and each value gets the code of the nearest map entry to
(x · pre) · inv (fp32 operations; pre a power of two that keeps inv finite for tiny and huge
blocks), a value on a midpoint going to the lower code. The code maps come from the library
(tide_q8_code_maps), so Python and the kernels share one definition.
"""

from __future__ import annotations

import ctypes as c
import functools

import torch

from tide import _lib, kernels
from tide.torch import _executor

BLOCK = 256  # kernels::kQuantBlock (TIDE_QUANT_BLOCK)
TIDE_STATE_BLOCK_Q8 = kernels.STATE_BLOCK_Q8  # tide_optimizer_options.state_dtype

_UP = 2.0 ** 64


@functools.cache
def code_maps() -> dict[str, torch.Tensor]:
    """exp_avg's 128 magnitudes and 127 midpoints, exp_avg_sq's 256 values and 255 midpoints."""
    lib = _executor._cdll()
    out = [c.c_void_p() for _ in range(4)]
    _lib.check(lib.tide_q8_code_maps(*[c.byref(o) for o in out]))

    def table(address: c.c_void_p, n: int) -> torch.Tensor:
        return torch.tensor((c.c_float * n).from_address(address.value)[:], dtype=torch.float32)

    return {"exp_avg": table(out[0], 128), "exp_avg_mid": table(out[1], 127),
            "exp_avg_sq": table(out[2], 256), "exp_avg_sq_mid": table(out[3], 255)}


def blocks(count: int) -> int:
    return -(-count // BLOCK)


def dequantize(key: str, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp32 values of `codes` (uint8, a whole number of blocks but the last) under their blocks'
    `scales`: the kernels' q8_exp_avg_value / q8_exp_avg_sq_value."""
    maps = code_maps()
    per_element = scales.repeat_interleave(BLOCK)[:codes.numel()]
    index = codes.long()
    if key == "exp_avg":
        value = maps["exp_avg"][index & 127] * per_element
        return torch.where((index & 128) != 0, -value, value)
    return maps["exp_avg_sq"][index] * per_element


def quantize(key: str, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) of fp32 `values` (from a block boundary; the last block may be partial),
    as the kernels requantize a block."""
    n = values.numel()
    padded = torch.zeros(blocks(n) * BLOCK, dtype=torch.float32)
    padded[:n] = values
    x = padded.view(-1, BLOCK)
    absmax = x.abs().amax(dim=1)
    one = torch.ones_like(absmax)
    pre = torch.where(absmax < 1 / _UP, one * _UP, torch.where(absmax > _UP, one / _UP, one))
    inv = torch.where(absmax == 0, torch.zeros_like(absmax), one / (absmax * pre))
    y = ((x * pre[:, None]) * inv[:, None]).reshape(-1)[:n]
    maps = code_maps()
    if key == "exp_avg":
        magnitude = torch.searchsorted(maps["exp_avg_mid"], y.abs(), side="left")
        sign = (y < 0) & (magnitude != 0)
        codes = magnitude | torch.where(sign, 128, 0)
    else:
        codes = torch.searchsorted(maps["exp_avg_sq_mid"], y, side="left")
    return codes.to(torch.uint8), absmax

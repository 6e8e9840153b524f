"""The optimizer kernels of libtide.so: the CPU Adam/AdamW step of one subgroup, the
non-finite check and the fp32 → bf16/fp16 cast (include/tide/tide.h, "optimizer kernels").

The functions take CPU torch tensors (contiguous) and call the C ABI on their memory directly:

    from tide import kernels
    result = kernels.cpu_adam_step(param, grad, exp_avg, exp_avg_sq, step=t, lr=1e-3,
                                   weight_decay=0.01, param_copy=param_bf16)
    if result.nonfinite:
        ...  # elements with a non-finite gradient were left unchanged

The formula is torch.optim.AdamW's (``decoupled=True``) or torch.optim.Adam's
(``decoupled=False``), with ``step`` the step number counted from 1 (torch's ``state["step"]``
after its increment).
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
from typing import Any

from tide import _lib

FLOAT32, BFLOAT16, FLOAT16 = 0, 1, 2
STATE_BLOCK_Q8 = 16  # TIDE_STATE_BLOCK_Q8: 8-bit block-wise moments (uint8 codes, fp32 scales)
ISA_AUTO, ISA_SCALAR, ISA_AVX2, ISA_AVX512, ISA_AVX512_BF16 = 0, 1, 2, 3, 4
ISA_NAMES = {ISA_SCALAR: "scalar", ISA_AVX2: "avx2", ISA_AVX512: "avx512",
             ISA_AVX512_BF16: "avx512bf16"}
_ISA_BY_NAME = {"auto": ISA_AUTO, **{name: isa for isa, name in ISA_NAMES.items()}}


class AdamHyper(ctypes.Structure):
    _fields_ = [
        ("lr", ctypes.c_double),
        ("beta1", ctypes.c_double),
        ("beta2", ctypes.c_double),
        ("eps", ctypes.c_double),
        ("weight_decay", ctypes.c_double),
        ("grad_scale", ctypes.c_double),
        ("step", ctypes.c_int64),
        ("decoupled", ctypes.c_int32),
        ("maximize", ctypes.c_int32),
    ]


class AdamSubgroup(ctypes.Structure):
    _fields_ = [
        ("grad", ctypes.c_void_p),
        ("param", ctypes.c_void_p),
        ("exp_avg", ctypes.c_void_p),
        ("exp_avg_sq", ctypes.c_void_p),
        ("param_copy", ctypes.c_void_p),
        ("count", ctypes.c_uint64),
        ("grad_dtype", ctypes.c_int32),
        ("state_dtype", ctypes.c_int32),
        ("copy_dtype", ctypes.c_int32),
    ]


class CpuOptions(_lib.Versioned):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("threads", ctypes.c_int32),
        ("isa", ctypes.c_int32),
        ("skip_subgroup_on_nonfinite", ctypes.c_int32),
    ]


class AdamResult(_lib.Versioned):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("nonfinite", ctypes.c_uint64),
        ("applied", ctypes.c_int32),
    ]


class CpuInfo(_lib.Versioned):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("best_isa", ctypes.c_int32),
        ("supported_isas", ctypes.c_int32),
        ("threads", ctypes.c_int32),
    ]


class StateFormat(_lib.Versioned):
    """tide_state_format: the state format of a CPU step beyond the moments' dtype."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("master_dtype", ctypes.c_int32),
        ("rounding", ctypes.c_int32),
        ("seed", ctypes.c_uint64),
        ("first_index", ctypes.c_uint64),
        ("exp_avg_scale", ctypes.c_void_p),
        ("exp_avg_sq_scale", ctypes.c_void_p),
        ("param_bf16", ctypes.c_void_p),
        ("param_comp", ctypes.c_void_p),
    ]


_declared: set[int] = set()
_declare_lock = threading.Lock()


def _cdll() -> ctypes.CDLL:
    """libtide.so, with this module's functions declared on it (once)."""
    cdll = _lib.lib()
    with _declare_lock:
        if id(cdll) not in _declared:
            status = ctypes.c_int
            cdll.tide_cpu_adam_step.restype = status
            cdll.tide_cpu_adam_step.argtypes = [
                ctypes.POINTER(AdamSubgroup),
                ctypes.POINTER(StateFormat),
                ctypes.POINTER(AdamHyper),
                ctypes.POINTER(CpuOptions),
                ctypes.POINTER(AdamResult),
            ]
            cdll.tide_cpu_count_nonfinite.restype = status
            cdll.tide_cpu_count_nonfinite.argtypes = [
                ctypes.c_void_p,
                ctypes.c_int32,
                ctypes.c_uint64,
                ctypes.POINTER(CpuOptions),
                ctypes.POINTER(ctypes.c_uint64),
            ]
            cdll.tide_cpu_cast.restype = status
            cdll.tide_cpu_cast.argtypes = [
                ctypes.c_void_p,
                ctypes.c_void_p,
                ctypes.c_int32,
                ctypes.c_uint64,
                ctypes.POINTER(CpuOptions),
            ]
            cdll.tide_cpu_kernels_info.restype = status
            cdll.tide_cpu_kernels_info.argtypes = [ctypes.POINTER(CpuInfo)]
            _declared.add(id(cdll))
    return cdll


@dataclasses.dataclass(frozen=True)
class StepResult:
    nonfinite: int  # elements left unchanged (non-finite gradient or update)
    applied: bool  # False: skip_subgroup_on_nonfinite found one and wrote nothing


def _dtype_of(tensor: Any, allowed: tuple[int, ...], what: str) -> int:
    import torch

    codes = {torch.float32: FLOAT32, torch.bfloat16: BFLOAT16, torch.float16: FLOAT16}
    code = codes.get(tensor.dtype)
    if code not in allowed:
        names = {FLOAT32: "float32", BFLOAT16: "bfloat16", FLOAT16: "float16"}
        raise TypeError(f"{what} must be one of {[names[a] for a in allowed]}, not {tensor.dtype}")
    return code


def _check_buffer(tensor: Any, count: int, what: str) -> None:
    if tensor.device.type != "cpu":
        raise ValueError(f"{what} must be a CPU tensor, not on {tensor.device}")
    if not tensor.is_contiguous():
        raise ValueError(f"{what} must be contiguous")
    if tensor.numel() != count:
        raise ValueError(f"{what} has {tensor.numel()} elements, the weights {count}")


def _options(threads: int, isa: str, skip_subgroup_on_nonfinite: bool = False) -> CpuOptions:
    if isa not in _ISA_BY_NAME:
        raise ValueError(f"isa must be one of {sorted(_ISA_BY_NAME)}, not {isa!r}")
    return CpuOptions(threads=int(threads), isa=_ISA_BY_NAME[isa],
                      skip_subgroup_on_nonfinite=int(skip_subgroup_on_nonfinite))


def cpu_adam_step(
    param: Any,
    grad: Any,
    exp_avg: Any,
    exp_avg_sq: Any,
    *,
    step: int,
    lr: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    decoupled: bool = True,
    maximize: bool = False,
    grad_scale: float = 1.0,
    param_copy: Any = None,
    threads: int = 0,
    isa: str = "auto",
    skip_subgroup_on_nonfinite: bool = False,
    exp_avg_scale: Any = None,
    exp_avg_sq_scale: Any = None,
    param_comp: Any = None,
    state_rounding: str = "nearest",
    rounding_seed: int = 0,
    rounding_index: int = 0,
) -> StepResult:
    """One Adam/AdamW step, in place, over one flat subgroup.

    param: float32 master weights. grad: float32, bfloat16 or float16. exp_avg, exp_avg_sq:
    float32 or bfloat16 (both the same), or uint8 codes of 8-bit moments (kernels/quant8.h; the
    tensors' storage at a 256-byte boundary) with their fp32 block scales in exp_avg_scale and
    exp_avg_sq_scale, one per 256 elements. param_copy: optional bfloat16/float16 output, written
    with the updated weights in the same pass. grad_scale: the loss scale the gradients carry
    (they are multiplied by 1/grad_scale). threads: 0 for the pool's (TIDE_CPU_THREADS).

    bf16 master weights with compensation (tide_state_format.master_dtype): param bfloat16 (the
    weights themselves, no param_copy) and param_comp its bfloat16 compensation, both updated in
    place; fp32 or bf16 moments.

    state_rounding "stochastic" (tide_state_format.rounding; bf16 moments only): the moments are
    rounded up with the probability of the ulp's fraction lost, with random bits hashed from
    rounding_seed, step and rounding_index + i for element i (kernels/stochastic_round.h).
    """
    if state_rounding not in ("nearest", "stochastic"):
        raise ValueError(f"state_rounding must be 'nearest' or 'stochastic', got {state_rounding!r}")
    count = param.numel()
    bf16_master = param_comp is not None
    if bf16_master:
        _dtype_of(param, (BFLOAT16,), "param (with param_comp: bf16 master weights)")
        _dtype_of(param_comp, (BFLOAT16,), "param_comp")
        _check_buffer(param_comp, count, "param_comp")
        if param_copy is not None:
            raise TypeError("bf16 master weights (param_comp) take no param_copy: param is the "
                            "bf16 weight")
    else:
        _dtype_of(param, (FLOAT32,), "param")
    for name, tensor in (("param", param), ("grad", grad), ("exp_avg", exp_avg),
                         ("exp_avg_sq", exp_avg_sq)):
        _check_buffer(tensor, count, name)
    q8 = str(exp_avg.dtype) == "torch.uint8"
    state_dtype = STATE_BLOCK_Q8 if q8 else _dtype_of(exp_avg, (FLOAT32, BFLOAT16), "exp_avg")
    if q8:
        blocks = -(-count // 256)
        for name, tensor in (("exp_avg_scale", exp_avg_scale),
                             ("exp_avg_sq_scale", exp_avg_sq_scale)):
            if tensor is None:
                raise TypeError(f"uint8 (8-bit) moments need {name}")
            _dtype_of(tensor, (FLOAT32,), name)
            _check_buffer(tensor, blocks, name)
    if exp_avg_sq.dtype != exp_avg.dtype:
        raise TypeError("exp_avg and exp_avg_sq must have the same dtype")
    if q8 and bf16_master:
        raise TypeError("bf16 master weights (param_comp) with 8-bit moments are not supported")
    subgroup = AdamSubgroup(
        grad=grad.data_ptr(),
        param=None if bf16_master else param.data_ptr(),
        exp_avg=exp_avg.data_ptr(),
        exp_avg_sq=exp_avg_sq.data_ptr(),
        param_copy=None,
        count=count,
        grad_dtype=_dtype_of(grad, (FLOAT32, BFLOAT16, FLOAT16), "grad"),
        state_dtype=state_dtype,
        copy_dtype=BFLOAT16,
    )
    if param_copy is not None:
        _check_buffer(param_copy, count, "param_copy")
        subgroup.copy_dtype = _dtype_of(param_copy, (BFLOAT16, FLOAT16), "param_copy")
        subgroup.param_copy = param_copy.data_ptr()
    hyper = AdamHyper(
        lr=lr,
        beta1=betas[0],
        beta2=betas[1],
        eps=eps,
        weight_decay=weight_decay,
        grad_scale=grad_scale,
        step=int(step),
        decoupled=int(decoupled),
        maximize=int(maximize),
    )
    options = _options(threads, isa, skip_subgroup_on_nonfinite)
    result = AdamResult()
    state_format = StateFormat()
    if state_rounding == "stochastic":
        if bf16_master or q8:
            raise TypeError("stochastic rounding applies to bf16 moments with fp32 master weights")
        state_format.rounding = 1
        state_format.seed = rounding_seed
        state_format.first_index = rounding_index
    elif bf16_master:
        state_format.master_dtype = BFLOAT16
        state_format.param_bf16 = param.data_ptr()
        state_format.param_comp = param_comp.data_ptr()
    elif q8:
        state_format.exp_avg_scale = exp_avg_scale.data_ptr()
        state_format.exp_avg_sq_scale = exp_avg_sq_scale.data_ptr()
    _lib.check(_cdll().tide_cpu_adam_step(
        ctypes.byref(subgroup), ctypes.byref(state_format), ctypes.byref(hyper),
        ctypes.byref(options), ctypes.byref(result)))
    return StepResult(nonfinite=result.nonfinite, applied=bool(result.applied))


def cpu_count_nonfinite(values: Any, *, threads: int = 0, isa: str = "auto") -> int:
    """The number of NaN and infinite values in a float32/bfloat16/float16 CPU tensor."""
    _check_buffer(values, values.numel(), "values")
    out = ctypes.c_uint64()
    options = _options(threads, isa)
    _lib.check(
        _cdll().tide_cpu_count_nonfinite(
            values.data_ptr(),
            _dtype_of(values, (FLOAT32, BFLOAT16, FLOAT16), "values"),
            values.numel(),
            ctypes.byref(options),
            ctypes.byref(out),
        )
    )
    return out.value


def cpu_cast(src: Any, dst: Any, *, threads: int = 0, isa: str = "auto") -> None:
    """dst (bfloat16/float16) = src (float32), rounded to nearest even."""
    _dtype_of(src, (FLOAT32,), "src")
    _check_buffer(src, src.numel(), "src")
    _check_buffer(dst, src.numel(), "dst")
    options = _options(threads, isa)
    _lib.check(
        _cdll().tide_cpu_cast(
            src.data_ptr(),
            dst.data_ptr(),
            _dtype_of(dst, (BFLOAT16, FLOAT16), "dst"),
            src.numel(),
            ctypes.byref(options),
        )
    )


def cpu_info() -> dict:
    """The CPU kernels' instruction sets and thread count."""
    info = CpuInfo()
    _lib.check(_cdll().tide_cpu_kernels_info(ctypes.byref(info)))
    return {
        "isa": ISA_NAMES[info.best_isa],
        "supported": [name for isa, name in ISA_NAMES.items() if info.supported_isas & (1 << isa)],
        "threads": info.threads,
    }

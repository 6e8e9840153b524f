"""tide's CPU Adam/AdamW step against torch.optim.Adam/AdamW: 100 steps with a changing learning
rate, fresh random gradients each step, weights within 1e-6 relative (norm) of PyTorch's.

The reference is torch.optim's for-loop implementation (foreach=False, PyTorch's default on CPU
tensors) unless a test names another. The gradients are drawn independently of the weights, so
rounding differences between implementations only accumulate, never amplify; the bound is also
never below twice what PyTorch's fused implementation differs from the reference by on this
machine, measured on the same data.
"""

import math
import os

import pytest
import torch

from tide import kernels

pytestmark = pytest.mark.numerics

STEPS = 100
N = 4_099  # not a multiple of any vector width


@pytest.fixture(autouse=True)
def one_torch_thread():
    """PyTorch on one thread: its MKL sqrt over a few thousand elements otherwise waits for a
    second OpenMP thread, which on a busy 2-core machine costs milliseconds a call."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def lr_at(step: int) -> float:
    """A warm-up then cosine schedule, so that lr changes every step."""
    warmup = 10
    if step <= warmup:
        return 1e-3 * step / warmup
    return 1e-4 + 0.5 * (1e-3 - 1e-4) * (1 + math.cos(math.pi * (step - warmup) / STEPS))


class Run:
    """tide's weights after STEPS steps (and its low-precision copy), the reference's, and the
    bound on their relative error."""

    def __init__(self, param, reference, fused, copy):
        self.param, self.reference, self.copy = param, reference, copy
        self.bound = max(1e-6, 2 * relative_error(fused, reference))

    def check(self):
        error = relative_error(self.param, self.reference)
        assert error <= self.bound, (error, self.bound)


def run(torch_optimizer, *, decoupled, weight_decay, maximize, grad_dtype=torch.float32,
        copy_dtype=None, grad_scale=1.0, isa="auto", torch_options=None, seed=None):
    """Runs STEPS steps of tide, of `torch_optimizer` with `torch_options` (default: the for-loop)
    and of its fused implementation on the same gradients."""
    generator = torch.Generator().manual_seed(seed if seed is not None else torch.seed())
    p0 = torch.randn(N, generator=generator)
    reference = torch.nn.Parameter(p0.clone())
    fused = torch.nn.Parameter(p0.clone())
    hyper = dict(lr=lr_at(1), betas=(0.9, 0.999), eps=1e-8, weight_decay=weight_decay,
                 maximize=maximize)
    optimizer = torch_optimizer([reference], **hyper, **(torch_options or {"foreach": False}))
    fused_optimizer = torch_optimizer([fused], **hyper, fused=True)
    param = p0.clone()
    exp_avg = torch.zeros(N)
    exp_avg_sq = torch.zeros(N)
    copy = torch.empty(N, dtype=copy_dtype) if copy_dtype is not None else None
    for step in range(1, STEPS + 1):
        lr = lr_at(step)
        # Gradients exactly representable in grad_dtype, so both sides see the same values.
        grad = torch.randn(N, generator=generator).to(grad_dtype)
        reference.grad = grad.float()
        fused.grad = grad.float()
        for o in (optimizer, fused_optimizer):
            for group in o.param_groups:
                group["lr"] = lr
            o.step()
        result = kernels.cpu_adam_step(
            param, (grad.float() * grad_scale).to(grad_dtype), exp_avg, exp_avg_sq, step=step,
            lr=lr, weight_decay=weight_decay, decoupled=decoupled, maximize=maximize,
            grad_scale=grad_scale, param_copy=copy, isa=isa)
        assert result.nonfinite == 0 and result.applied
    return Run(param, reference.detach(), fused.detach(), copy)


@pytest.mark.parametrize("maximize", [False, True], ids=["minimize", "maximize"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1], ids=["no_decay", "decay"])
@pytest.mark.parametrize("optimizer", ["AdamW", "Adam"])
def test_matches_torch_over_100_steps(optimizer, weight_decay, maximize):
    run(getattr(torch.optim, optimizer), decoupled=optimizer == "AdamW",
        weight_decay=weight_decay, maximize=maximize).check()


@pytest.mark.parametrize("torch_impl", ["foreach", "fused"])
@pytest.mark.parametrize("optimizer", ["AdamW", "Adam"])
def test_matches_torchs_foreach_and_fused_implementations(optimizer, torch_impl):
    run(getattr(torch.optim, optimizer), decoupled=optimizer == "AdamW", weight_decay=0.05,
        maximize=False, torch_options={torch_impl: True}).check()


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512", "avx512bf16"])
def test_every_instruction_set_matches_torch(isa):
    if isa not in kernels.cpu_info()["supported"]:
        pytest.skip(f"this CPU cannot run {isa}")
    run(torch.optim.AdamW, decoupled=True, weight_decay=0.01, maximize=False, isa=isa).check()


@pytest.mark.parametrize("grad_dtype", [torch.bfloat16, torch.float16])
def test_low_precision_gradients_and_weight_copy(grad_dtype):
    """The offloaded step: 16-bit gradients in, the 16-bit weight copy out in the same pass,
    equal to PyTorch's cast of the fp32 weights."""
    for copy_dtype in (torch.bfloat16, torch.float16):
        result = run(torch.optim.AdamW, decoupled=True, weight_decay=0.01, maximize=False,
                     grad_dtype=grad_dtype, copy_dtype=copy_dtype)
        result.check()
        assert torch.equal(result.copy.view(torch.int16),
                           result.param.to(copy_dtype).view(torch.int16))


def test_loss_scaled_gradients_are_unscaled():
    run(torch.optim.AdamW, decoupled=True, weight_decay=0.01, maximize=False,
        grad_dtype=torch.float16, grad_scale=1024.0).check()


def test_nonfinite_gradients_are_reported_and_never_written():
    torch.manual_seed(torch.seed())
    param = torch.randn(1000)
    exp_avg = torch.randn(1000) * 0.1
    exp_avg_sq = torch.rand(1000) * 0.01 + 1e-4
    grad = torch.randn(1000, dtype=torch.bfloat16)
    bad = torch.tensor([3, 500, 999])
    grad[bad] = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=torch.bfloat16)
    before = param.clone(), exp_avg.clone(), exp_avg_sq.clone()
    copy = torch.zeros(1000, dtype=torch.bfloat16)
    result = kernels.cpu_adam_step(param, grad, exp_avg, exp_avg_sq, step=3, param_copy=copy)
    assert result.nonfinite == 3 and result.applied
    for now, then in zip((param, exp_avg, exp_avg_sq), before):
        assert torch.isfinite(now).all()
        assert torch.equal(now[bad], then[bad])
        good = torch.ones(1000, dtype=torch.bool)
        good[bad] = False
        assert not torch.equal(now[good], then[good])
    assert torch.equal(copy, param.to(torch.bfloat16))
    assert kernels.cpu_count_nonfinite(grad) == 3

    # All or nothing for the subgroup, on request.
    before = param.clone()
    result = kernels.cpu_adam_step(param, grad, exp_avg, exp_avg_sq, step=4,
                                   skip_subgroup_on_nonfinite=True)
    assert result.nonfinite == 3 and not result.applied
    assert torch.equal(param, before)


def test_cast_rounds_as_torch_does():
    """tide's vector casts against PyTorch's on every class of value: all 65536 high halves with
    the low bits at every rounding case, and random bit patterns."""
    high = torch.arange(1 << 16, dtype=torch.int64) << 16
    low = torch.tensor([0x0, 0x1, 0x0FFF, 0x1000, 0x1001, 0x7FFF, 0x8000, 0x8001, 0xFFFF])
    bits = (high[:, None] | low[None, :]).flatten()
    bits = torch.cat([bits, torch.randint(0, 1 << 32, (1 << 20,))])
    values = bits.to(torch.int32).view(torch.float32)  # wraps to the same 32-bit patterns
    for dtype in (torch.bfloat16, torch.float16):
        out = torch.empty(values.numel(), dtype=dtype)
        kernels.cpu_cast(values, out)
        expected = values.to(dtype)
        nan = torch.isnan(values)
        assert torch.equal(out[~nan].view(torch.int16), expected[~nan].view(torch.int16))
        assert torch.isnan(out[nan].float()).all()


def test_bad_arguments_raise_tide_errors():
    param = torch.zeros(8)
    with pytest.raises(kernels._lib.TideError, match="step"):
        kernels.cpu_adam_step(param, torch.ones(8), torch.zeros(8), torch.zeros(8), step=0)
    with pytest.raises(kernels._lib.TideError, match="beta1"):
        kernels.cpu_adam_step(param, torch.ones(8), torch.zeros(8), torch.zeros(8), step=1,
                              betas=(1.5, 0.999))
    with pytest.raises(TypeError):
        kernels.cpu_adam_step(param, torch.ones(8, dtype=torch.float64), torch.zeros(8),
                              torch.zeros(8), step=1)


def test_cpu_info_names_the_default_instruction_set():
    """The widest this CPU runs, or TIDE_CPU_ISA's (make test runs the numerics tests once per
    variant this way)."""
    info = kernels.cpu_info()
    assert info["isa"] in info["supported"]
    assert "scalar" in info["supported"]
    assert info["threads"] >= 1
    forced = os.environ.get("TIDE_CPU_ISA", "auto")
    widest = [isa for isa in ("avx512bf16", "avx512", "avx2", "scalar")
              if isa in info["supported"]][0]
    assert info["isa"] == (widest if forced == "auto" else forced)

"""The reference that tide's optimizer is compared with in end-to-end training tests, and how far a
correct implementation may land from it on this machine, measured.

The reference is PyTorch's for-loop implementation, named explicitly (``foreach=False``): it is
PyTorch's default on CPU tensors, while on CUDA tensors the default is ``foreach``. Two correct
implementations of Adam round differently (tide multiplies where PyTorch divides by the bias
correction; PyTorch's fused kernel vectorises with this CPU's instruction set), and a training run
may amplify such last-bit differences: under bf16 autocast, a weight whose bf16 rounding flips
changes its gradients at bf16 precision, and Adam turns that into full-size steps. How much
depends on the machine (the CPU's matmul and vector paths): on AMD Zen 4, PyTorch's fused and
for-loop AdamW part by 1.6% after 10 autocast steps of test_optim's model; here, with PyTorch's
kernels forced to AVX2, tide and PyTorch part by 1.2% while PyTorch's two stay within 1e-7.

So the bound is measured: next to the reference, the same training runs with

- PyTorch's fused implementation (another rounding of the same formula), and
- the reference started from weights nudged by ±1e-7 relative (about one rounding of every weight,
  which is what a correct implementation's first step may differ by),

and tide may differ from the reference by ``max(floor, FACTOR × the largest of those differences)``.
In fp32 training those stay below 1e-5 (about 3e-6 measured), so the floor decides; under bf16
autocast they are a few percent on every machine measured, and the end-to-end check is then only a
coarse one: tests that need a tight check compare steps on the same gradients instead, which does
not amplify (test_optim's test_autocast_bf16_step_matches_torch_on_the_same_gradients).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

REFERENCE = {"foreach": False}  # torch.optim's for-loop implementation
VARIANTS = {"fused": ({"fused": True}, 0.0), "nudged +1e-7": (REFERENCE, 1e-7),
            "nudged -1e-7": (REFERENCE, -1e-7)}
FACTOR = 2.0


def max_rel_diff(a_model: torch.nn.Module, b_model: torch.nn.Module) -> float:
    """The largest difference between corresponding parameters, relative to the largest value of
    b's parameter (per parameter)."""
    worst = 0.0
    for a, b in zip(a_model.parameters(), b_model.parameters(), strict=True):
        scale = b.detach().float().abs().max().item() or 1.0
        worst = max(worst, (a.detach().float() - b.detach().float()).abs().max().item() / scale)
    return worst


class TorchReference:
    """A training run with PyTorch's reference implementation, and the bound measured next to it.

    make():                    a fresh model (the same weights every call)
    train(model, options):     trains it with torch.optim's optimizer built with **options
                               (foreach=False or fused=True); what it returns is kept as `result`
    """

    def __init__(self, make: Callable[[], torch.nn.Module],
                 train: Callable[[torch.nn.Module, dict], Any], *, floor: float = 1e-5):
        self.model = make()
        self.result = train(self.model, dict(REFERENCE))
        self.variants: dict[str, float] = {}
        self.variant_results: dict[str, Any] = {}
        for name, (options, nudge) in VARIANTS.items():
            model = make()
            if nudge:
                with torch.no_grad():
                    for p in model.parameters():
                        p.mul_(1.0 + nudge)
            self.variant_results[name] = train(model, dict(options))
            self.variants[name] = max_rel_diff(model, self.model)
        self.floor = floor
        self.spread = max(self.variants.values())
        self.bound = max(floor, FACTOR * self.spread)

    def assert_close(self, model: torch.nn.Module, what: str = "tide") -> float:
        diff = max_rel_diff(model, self.model)
        assert diff <= self.bound, (
            f"{what} differs from torch.optim (foreach=False) by {diff:.3g} (relative, largest "
            f"weight), more than the bound {self.bound:.3g} = max({self.floor:g}, {FACTOR:g} x "
            f"what correct implementations differ by here: "
            + ", ".join(f"{k} {v:.3g}" for k, v in self.variants.items()) + ")")
        return diff

    def bound_on(self, difference: Callable[[Any, Any], float], floor: float) -> float:
        """The same rule for another measure of the runs (e.g. their losses): max(floor, FACTOR x
        the largest difference(variant's result, reference's result))."""
        return max(floor, FACTOR * max(difference(result, self.result)
                                       for result in self.variant_results.values()))

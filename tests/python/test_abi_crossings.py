"""Boundary crossings per step: a step of tide.torch.AdamW over a model whose gradients were all
offloaded during backward enters libtide's C ABI at most 3 times (counted by tide_abi_calls; the
per-gradient offload calls are made in backward, in the gradients' hooks, not in step())."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import tide.torch as tt  # noqa: E402
from tide import _lib  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                               torch.nn.Linear(64, 32)).to(DEVICE)


@pytest.mark.parametrize("subgroup_size", [1 << 16, 1000])  # one subgroup; several
def test_a_step_crosses_into_tide_at_most_three_times(subgroup_size):
    model = make_model()
    params = list(model.parameters())
    opt = tt.AdamW(params, lr=1e-3, subgroup_size=subgroup_size)
    assert len(opt._buckets) == 1 and (subgroup_size > 5000 or len(opt._buckets[0].sizes) > 1)
    x = torch.randn(8, 32, device=DEVICE)
    for step in range(3):
        model(x).square().mean().backward()
        before = _lib.abi_calls()
        opt.step()
        crossings = _lib.abi_calls() - before
        plan = opt.last_plan
        # Every gradient went to tide in its hook during backward; none at step().
        assert plan["gradients_offloaded_in_backward"] == len(params), plan
        assert plan["gradients_offloaded_at_step"] == 0, plan
        assert crossings <= 3, (step, crossings)
        assert crossings == 1, (step, crossings)  # today: the one step call
        opt.zero_grad()
    # The step did its work: the state is there, and the parameters moved.
    assert all(float(opt.state[p]["step"]) == 3 for p in params)


def test_the_count_is_of_this_thread_and_every_call():
    before = _lib.abi_calls()
    assert _lib.abi_calls() == before  # reading the counter is not a crossing
    _lib.version()
    _lib.knob("TIDE_SUBGROUP_SIZE", "4K")
    assert _lib.abi_calls() == before + 2

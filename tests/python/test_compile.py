"""tide.torch under torch.compile: a compiled model (its backward still calls the gradient hooks)
and a compiled optimizer step (PyTorch's "compiling the optimizer" recipe), which must run tide's
step as it is, untraced.

Dynamo's "eager" and "aot_eager" backends: what matters here is what Dynamo and AOTAutograd do
with tide's hooks and step, not Inductor's code (which would cost a C++ compile per test).
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
import tide.torch as tt  # noqa: E402
from test_optim import batches, loss_of, make_model, train  # noqa: E402
from torch_reference import TorchReference  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled_train(model, opt, data):
    train(torch.compile(model, backend="aot_eager"), opt, data)


@pytest.mark.parametrize("placement", ["cpu", "gpu"])
def test_a_compiled_model_offloads_in_backward_and_trains_as_torch(placement):
    data = batches(12)
    reference = TorchReference(make_model, lambda model, options: compiled_train(
        model, torch.optim.AdamW(model.parameters(), lr=3e-3, **options), data))
    ours = make_model()
    opt = tt.AdamW(ours.parameters(), lr=3e-3, placement=placement)
    compiled_train(ours, opt, data)
    reference.assert_close(ours)
    plan = opt.last_plan
    # AOTAutograd's compiled backward still accumulates into .grad: every hook ran there.
    assert plan["gradients_offloaded_in_backward"] == len(list(ours.parameters()))
    assert plan["gradients_offloaded_at_step"] == 0


def test_a_compiled_step_is_tides_step_untraced():
    """torch.compile(opt.step): Dynamo leaves tide's step alone (its state bookkeeping counts
    references and version counters, and crosses into C): the same bits as the step called
    directly, with state reads and writes between steps, and nothing of tide's traced."""
    data = batches(10)

    def run(compiled):
        model = make_model()
        opt = tt.AdamW(model.parameters(), lr=3e-3, placement=2, subgroup_size=3000)
        step = torch.compile(opt.step, backend="eager") if compiled else opt.step
        for i, tokens in enumerate(data):
            loss_of(model, tokens).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)  # gradients written again
            if i == 4:
                with torch.no_grad():
                    model.head.weight.mul_(0.5)  # a weight written from outside
                opt.state[model.head.bias]["exp_avg"].zero_()
            step()
            opt.zero_grad()
        return model, opt

    eager, _ = run(False)
    torch._dynamo.utils.counters.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled, opt = run(True)
    for a, b in zip(compiled.parameters(), eager.parameters(), strict=True):
        assert torch.equal(a, b)
    traced = [str(w.message) for w in caught if "Dynamo" in str(w.message)]
    assert not traced, traced[0]
    # Dynamo met nothing it could not trace (it did not enter tide's code), and broke the graph
    # only where it skipped the step.
    assert not torch._dynamo.utils.counters["unimplemented"]
    breaks = list(torch._dynamo.utils.counters["graph_break"])
    assert breaks and all("torch.compiler.disable" in reason for reason in breaks), breaks
    assert opt.last_plan["gpu_subgroups"] > 0 and opt.last_plan["cpu_subgroups"] > 0

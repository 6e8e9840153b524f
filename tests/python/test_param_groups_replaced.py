"""Param groups changed after tide.torch.AdamW was made, as DeepSpeed's ZeRO changes them: at
deepspeed.initialize ZeRO 1 and 2 make each group's `params` one flat fp32 partition (the model's
parameters become views into a flat buffer) and at every step set `param_groups` to one group's
dict at a time; ZeRO-3 lists one sub-group's partition while it steps it and none in between.
tide steps what the groups list as torch.optim.AdamW does: a new parameter gets fresh state, one
no longer listed is not stepped and keeps its state. tests/python/test_deepspeed.py runs DeepSpeed.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import tide.torch as tt  # noqa: E402
from torch_reference import REFERENCE  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Both sides step the same gradients in fp32 (no amplification through training): what tide's
# kernel and torch's for-loop AdamW part by is a few ulps per step (tide multiplies where torch
# divides by the bias correction); 1e-6 relative after 4 steps leaves room for that, while a
# parameter stepped with the other group's hyperparameters or not at all is off by 1e-3 or more.
TOLERANCE = 1e-6


def model_and_groups(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    model.to(DEVICE)
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim == 1]
    return model, [{"params": decay, "weight_decay": 0.1, "lr": 2e-2},
                   {"params": no_decay, "weight_decay": 0.0, "lr": 1e-2}]


def flatten_like_zero(opt):
    """What ZeRO 1/2 does to a client optimizer: each group's parameters are laid into one flat
    buffer (their .data views into it) and the group holds an fp32 copy of that buffer. Returns,
    per group, (the flat partition, the buffer, the group's original parameters)."""
    flats = []
    for group in opt.param_groups:
        originals = list(group["params"])
        buffer = torch.cat([p.detach().reshape(-1) for p in originals])
        offset = 0
        for p in originals:
            p.data = buffer[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        flat = buffer.clone().float().requires_grad_(True)
        group["params"] = [flat]
        flats.append((flat, buffer, originals))
    return flats


def train_zero_like(make_opt, steps=4):
    """Trains as ZeRO 1/2 without offload: gradients flattened into the flat partition's .grad,
    one group stepped at a time (param_groups set to that group alone), the model's parameters
    copied from the partition afterwards. Returns the flat partitions."""
    model, groups = model_and_groups()
    opt = make_opt(groups)
    flats = flatten_like_zero(opt)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(4, 7, generator=g).to(DEVICE)
        model.zero_grad()
        model(x).square().mean().backward()
        everything = opt.param_groups
        for group, (flat, buffer, originals) in zip(everything, flats):
            flat.grad = torch.cat([p.grad.reshape(-1) for p in originals]).float()
            opt.param_groups = [group]
            opt.step()
            opt.param_groups = everything
            buffer.copy_(flat.detach())
    return [flat.detach().clone() for flat, _, _ in flats], opt


def test_replaced_params_are_stepped_group_by_group_as_torch_steps_them():
    """Before: tide refused (the model's parameters had moved into the flat buffer); and with
    param_groups set to the second group alone it would have stepped it with the first's
    hyperparameters."""
    torch_flats, _ = train_zero_like(lambda g: torch.optim.AdamW(g, **REFERENCE))
    tide_flats, opt = train_zero_like(lambda g: tt.AdamW(g))
    for k, (a, b) in enumerate(zip(tide_flats, torch_flats)):
        diff = ((a - b).abs().max() / b.abs().max()).item()
        assert diff <= TOLERANCE, f"group {k}: tide differs from torch.optim by {diff:.3g}"
    # every group was stepped 4 times (not 8: one group per call)
    assert [float(opt.state[g["params"][0]]["step"]) for g in opt.param_groups] == [4.0, 4.0]
    # its state dict is torch's for the flat partitions, and loads into torch.optim.AdamW
    saved = opt.state_dict()
    assert sorted(saved["state"]) == [0, 1]
    assert saved["state"][0]["exp_avg"].shape == tide_flats[0].shape


def test_state_dict_round_trip_after_replacement():
    """DeepSpeed's checkpoints call the client optimizer's state_dict() and load_state_dict()
    on the flat partitions; a fresh optimizer whose groups were replaced the same way takes it
    and continues exactly as the first."""
    _, first = train_zero_like(lambda g: tt.AdamW(g), steps=2)
    saved = first.state_dict()
    model, groups = model_and_groups()
    second = tt.AdamW(groups)
    flatten_like_zero(second)
    for group, src in zip(second.param_groups, first.param_groups):
        group["params"][0].data.copy_(src["params"][0].detach())
    second.load_state_dict(saved)
    for a, b in zip(first.param_groups, second.param_groups):
        pa, pb = a["params"][0], b["params"][0]
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(first.state[pa][key], second.state[pb][key]), key
        grad = torch.linspace(-1, 1, pa.numel(), device=DEVICE)
        pa.grad, pb.grad = grad.clone(), grad.clone()
    first.step()
    second.step()
    for a, b in zip(first.param_groups, second.param_groups):
        assert torch.equal(a["params"][0], b["params"][0])


def swap_sub_groups_like_zero3(make_opt, steps=3):
    """What ZeRO-3 does: a group lists one sub-group's flat partition while that is stepped and
    nothing in between; the other sub-group keeps its state meanwhile. Returns the partitions
    and the optimizer."""
    torch.manual_seed(0)
    parts = [torch.randn(n, device=DEVICE, requires_grad=True) for n in (37, 11)]
    opt = make_opt([{"params": list(parts), "weight_decay": 0.1}])
    opt.param_groups[0]["params"] = []
    g = torch.Generator().manual_seed(2)
    for _ in range(steps):
        for part in parts:
            part.grad = torch.randn(part.numel(), generator=g).to(DEVICE)
            opt.param_groups[0]["params"] = [part]
            opt.step()
            opt.param_groups[0]["params"] = []
    return [p.detach().clone() for p in parts], opt, parts


def test_sub_groups_swapped_in_and_out_keep_their_state_as_in_torch():
    """Before: the partitions were not the parameters tide was built with, and tide stepped
    nothing (or refused); now each keeps its own state across the swaps, as in torch."""
    expected, _, _ = swap_sub_groups_like_zero3(lambda g: torch.optim.AdamW(g, **REFERENCE))
    got, opt, parts = swap_sub_groups_like_zero3(lambda g: tt.AdamW(g))
    for a, b in zip(got, expected):
        assert ((a - b).abs().max() / b.abs().max()).item() <= TOLERANCE
    assert [float(opt.state[p]["step"]) for p in parts] == [3.0, 3.0]
    # ZeRO-3's checkpoints list every partition for state_dict() and load_state_dict()
    opt.param_groups[0]["params"] = list(parts)
    saved = opt.state_dict()
    assert [saved["state"][i]["exp_avg"].numel() for i in (0, 1)] == [37, 11]


def test_params_replaced_without_state_free_their_buckets():
    model, groups = model_and_groups()
    opt = tt.AdamW(groups)
    before = opt.pinned_state_bytes()
    flatten_like_zero(opt)
    for group in opt.param_groups:
        group["params"][0].grad = torch.zeros_like(group["params"][0])
    opt.step()
    # the same elements, now in one bucket per group: the originals' buckets went
    assert len(opt._buckets) == 2
    assert opt.pinned_state_bytes() == before
    assert all(p not in opt.state for p in model.parameters())


def test_a_group_tide_was_not_given_is_refused():
    _, groups = model_and_groups()
    opt = tt.AdamW(groups)
    opt.param_groups = [{"params": [torch.zeros(2, device=DEVICE, requires_grad=True)],
                         **opt.defaults}]
    with pytest.raises(RuntimeError, match="add_param_group"):
        opt.step()

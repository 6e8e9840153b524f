"""Resident subgroups through tide.torch (TIDE_RESIDENCY, docs/design/runtime.md#resident-subgroups):
with placement auto, the state that fits stays on the (stand-in) device across steps, and
everything that reads or writes the state sees it exactly as without residency: opt.state (also a
tensor derived from it and held across steps), state_dict, load_state_dict, state surgery. The
reference is the same optimizer with TIDE_RESIDENCY=off, bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch

import tide.torch as tt
from tide.torch import _executor


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def planned_at_the_starting_rates(monkeypatch):
    """Plans made at the rates the optimizer starts from, unrefined: without a GPU, the stand-in's
    emulated kernels run slower than the CPU update, and refinement learns that within a few steps
    and takes the state home (docs/design/planner.md#rates). These tests are about what resident
    state looks like, not about whether this machine should keep it."""
    made = _executor.options

    def unrefined(**kwargs):
        out = made(**kwargs)
        out.refine = 0
        return out

    monkeypatch.setattr(_executor, "options", unrefined)


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 48), torch.nn.ReLU(),
                               torch.nn.Linear(48, 8)).to(DEVICE)


def make_pair(monkeypatch, **kwargs):
    """The same model and optimizer twice: resident (the default) and TIDE_RESIDENCY=off."""
    made = []
    for residency in ("auto", "off"):
        monkeypatch.setenv("TIDE_RESIDENCY", residency)
        model = make_model()
        opt = tt.AdamW(list(model.parameters()), lr=1e-2, weight_decay=0.01,
                       subgroup_size=1500, **kwargs)
        made.append((model, opt))
    monkeypatch.delenv("TIDE_RESIDENCY")
    return made


def train(pairs, steps: int, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(8, 32, generator=gen).to(DEVICE) for _ in range(steps)]
    for x in xs:
        for model, opt in pairs:
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()


def same_state(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["state"].keys() == sb["state"].keys()
    for k in sa["state"]:
        for key, value in sa["state"][k].items():
            assert torch.equal(value, sb["state"][k][key]), (k, key)


def same_weights(ma: torch.nn.Module, mb: torch.nn.Module) -> None:
    for pa, pb in zip(ma.parameters(), mb.parameters()):
        assert torch.equal(pa, pb)


def test_state_stays_resident_and_steps_are_exact(monkeypatch):
    (ma, oa), (mb, ob) = pairs = make_pair(monkeypatch)
    train(pairs, 6)
    assert oa.last_plan["resident_subgroups"] == len(oa._buckets[0].sizes) > 1
    assert oa.last_plan["resident_bytes"] > 0
    assert ob.last_plan["resident_subgroups"] == 0
    same_weights(ma, mb)
    same_state(oa, ob)


def test_a_view_held_across_steps_shows_the_state(monkeypatch):
    (ma, oa), (mb, ob) = pairs = make_pair(monkeypatch)
    train(pairs, 3)
    pa, pb = next(ma.parameters()), next(mb.parameters())
    held = oa.state[pa]["exp_avg"][0:4]     # derived from the entry's tensor: shares its storage
    entry = oa.state[pa]["exp_avg_sq"]      # the entry's own tensor, held
    for _ in range(3):
        train(pairs, 1)
        assert torch.equal(held, ob.state[pb]["exp_avg"][0:4])
        assert torch.equal(entry, ob.state[pb]["exp_avg_sq"])
    same_weights(ma, mb)


def test_state_surgery_between_steps_is_the_state(monkeypatch):
    (ma, oa), (mb, ob) = pairs = make_pair(monkeypatch)
    train(pairs, 3)
    for opt, model in ((oa, ma), (ob, mb)):
        for p in model.parameters():
            opt.state[p]["exp_avg"].mul_(0.5)
            opt.state[p]["exp_avg_sq"].zero_()
    train(pairs, 3)
    same_weights(ma, mb)
    same_state(oa, ob)


def test_load_state_dict_and_resume_are_exact(monkeypatch):
    (ma, oa), (mb, ob) = pairs = make_pair(monkeypatch)
    train(pairs, 3)
    saved = copy.deepcopy(ob.state_dict())      # from the non-resident one
    saved_weights = copy.deepcopy(mb.state_dict())
    train(pairs, 2)                             # the resident one moves on...
    ma.load_state_dict(saved_weights)           # ...and is rolled back to step 3
    oa.load_state_dict(saved)
    mb.load_state_dict(saved_weights)
    ob.load_state_dict(saved)
    train(pairs, 3, seed=7)
    same_weights(ma, mb)
    same_state(oa, ob)


@pytest.mark.parametrize("state_dtype", [torch.bfloat16, "q8"])
def test_other_state_formats_are_exact_when_resident(monkeypatch, state_dtype):
    (ma, oa), (mb, ob) = pairs = make_pair(monkeypatch, state_dtype=state_dtype)
    train(pairs, 5)
    assert oa.last_plan["resident_subgroups"] > 0
    same_weights(ma, mb)
    same_state(oa, ob)


def test_residency_knob_is_strict(monkeypatch):
    monkeypatch.setenv("TIDE_RESIDENCY", "yes")
    model = make_model()
    with pytest.raises(Exception, match="TIDE_RESIDENCY"):
        tt.AdamW(list(model.parameters()), lr=1e-2)


def test_a_step_reports_the_pressure_its_passes_put_on_resident_state():
    """Under tide's allocator and a memory cap: a forward pass that needs more than the forecast
    left takes resident state back home inside its allocation; the next step's stats say so
    (evicted_subgroups, evicted_bytes, evict_seconds), and only that step's. The gpu_iteration
    benchmark reads these per step under a cap."""
    import ctypes

    from tide import _lib
    from tide.torch import allocator
    lib = allocator._lib_declared()  # tide_alloc and tide_free, typed
    free_b, total_b = ctypes.c_size_t(), ctypes.c_size_t()
    _lib.check(lib.tide_device_memory(0, ctypes.byref(free_b), ctypes.byref(total_b)))
    limit_before = tt.headroom(0)["limit_bytes"]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 256)).to(DEVICE)
    tt.set_per_process_memory_fraction(64 * 2**20 / total_b.value, 0)
    tt.empty_cache()
    try:
        opt = tt.AdamW(model.parameters(), lr=1e-3, subgroup_size=1 << 17, placement="auto")
        gen = torch.Generator().manual_seed(1)

        def iteration(activations: int) -> dict:
            tt.mark_phase("forward")
            act = lib.tide_alloc(activations, 0, None)
            assert act is not None, _lib.lib().tide_last_error()
            model(torch.randn(4, 256, generator=gen).to(DEVICE)).square().mean().backward()
            tt.mark_phase("backward")
            lib.tide_free(act, activations, 0, None)
            opt.step()
            opt.zero_grad()
            return opt.last_plan

        plans = [iteration(8 << 20) for _ in range(4)]
        assert plans[-1]["resident_subgroups"] > 0, plans[-1]
        for plan in plans:
            assert plan["evicted_subgroups"] == plan["evicted_bytes"] == 0, plan
            assert plan["evict_seconds"] == 0.0
        # A forward pass the forecast did not see: all the cap leaves beside the resident state,
        # and half of that state.
        h = tt.headroom(0)
        resident = plans[-1]["resident_bytes"]
        bigger = h["limit_bytes"] - tt.memory_allocated(0) + resident // 2
        pressed = iteration(bigger)
        assert pressed["evicted_subgroups"] > 0, pressed
        assert pressed["evicted_bytes"] >= resident // 2
        assert pressed["evict_seconds"] > 0
        after = iteration(8 << 20)
        assert after["evicted_subgroups"] == after["evicted_bytes"] == 0, after
        assert after["evict_seconds"] == 0.0
        assert {"cache_releases"} <= after.keys()
    finally:
        tt.set_per_process_memory_fraction(limit_before / total_b.value, 0)


def test_a_forward_pass_past_the_forecast_takes_the_kept_gradients_back(monkeypatch):
    """gradients_on_gpu=True keeps the GPU subgroups' gradient buffers from zero_grad() through the
    forward pass, sized from the forecast. A forward pass that needs more than the forecast said
    (here without resident state, TIDE_RESIDENCY=off) gets those buffers back inside its
    allocation, before any gradient reached them, instead of failing; the step says so
    (withdrawn_gradients, withdrawn_bytes) and completes with the same bits as a twin that never
    kept gradients on the GPU. Failed before: the allocation failed."""
    import ctypes

    from tide import _lib
    from tide.torch import allocator
    monkeypatch.setenv("TIDE_RESIDENCY", "off")
    lib = allocator._lib_declared()
    free_b, total_b = ctypes.c_size_t(), ctypes.c_size_t()
    _lib.check(lib.tide_device_memory(0, ctypes.byref(free_b), ctypes.byref(total_b)))
    limit_before = tt.headroom(0)["limit_bytes"]

    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                   torch.nn.Linear(1024, 256)).to(DEVICE)

    model, twin = build(), build()
    tt.set_per_process_memory_fraction(64 * 2**20 / total_b.value, 0)
    tt.empty_cache()
    try:
        opt = tt.AdamW(model.parameters(), lr=1e-3, subgroup_size=1 << 17, placement="gpu",
                       gradients_on_gpu=True)
        twin_opt = tt.AdamW(twin.parameters(), lr=1e-3, subgroup_size=1 << 17, placement="gpu")
        gen = torch.Generator().manual_seed(1)

        def iteration(activations: int) -> dict:
            x = torch.randn(4, 256, generator=gen).to(DEVICE)
            tt.mark_phase("forward")
            act = lib.tide_alloc(activations, 0, None)
            assert act is not None, _lib.lib().tide_last_error()
            model(x).square().mean().backward()
            tt.mark_phase("backward")
            lib.tide_free(act, activations, 0, None)
            opt.step()
            opt.zero_grad()
            twin(x).square().mean().backward()
            twin_opt.step()
            twin_opt.zero_grad()
            return opt.last_plan

        opt.zero_grad()
        plans = [iteration(8 << 20) for _ in range(4)]
        assert all(p["withdrawn_gradients"] == p["withdrawn_bytes"] == 0 for p in plans), plans
        kept = plans[-1]["buffer_bytes"]
        assert plans[-1]["gpu_subgroups"] > 0 and kept > 0, plans[-1]
        # A forward pass that needs all the cap leaves, and part of the kept gradients' memory.
        bigger = tt.headroom(0)["limit_bytes"] - tt.memory_allocated(0) + (1 << 20)
        pressed = iteration(bigger)
        assert pressed["withdrawn_gradients"] > 0, pressed
        assert pressed["withdrawn_bytes"] > 0, pressed
        assert pressed["evicted_subgroups"] == 0, pressed
        after = iteration(8 << 20)
        assert after["withdrawn_gradients"] == 0, after
        for p, q in zip(model.parameters(), twin.parameters()):
            assert torch.equal(p, q)
    finally:
        tt.set_per_process_memory_fraction(limit_before / total_b.value, 0)

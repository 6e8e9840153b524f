"""The fault soak's loop, shared by tests/python/test_soak.py (one process) and its FSDP2
configuration (fsdp_workers.scenario_soak, on each rank): step attempts under faults drawn from a
seeded schedule, each checked against a fault-free reference that replays only the steps that
happened (test_soak.py's docstring says what is checked and why).

A configuration comes with `make(config, weights=None, state=None) -> (model, opt)`: a model with
`loss(step)`, and a tide optimizer, from the given weights and state_dict() when they are given.
Tensors may be DTensors (FSDP2): what is compared and poisoned is this process's local shard.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import random
import time
import warnings

import torch
from tide.torch import allocator as tide_allocator

from standin_faults import differences

# The driver faults a step attempt may meet, with their weights in the schedule (a failing copy
# and a failing allocation together: both armed); besides, independently, a non-finite gradient
# and a load_state_dict before the step, each with its probability.
FAULTS = {"none": 4, "fail_copy": 3, "fail_alloc": 2, "fail_copy+fail_alloc": 1,
          "fail_launch": 2, "fail_pin": 1, "device_lost": 1, "device_lost_between": 1}
NONFINITE = 0.2
LOAD_STATE_DICT = 0.15


@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    placement: object
    dtype: torch.dtype = torch.float32
    state_dtype: object = torch.float32
    master_dtype: torch.dtype = torch.float32
    host: bool = False
    # The model: "net" (standin_faults.Net), "wide" (Net and a parameter wide enough that an
    # optimizer's first step grows its pinned arena), "fsdp2" (fsdp_workers' model, sharded).
    model: str = "net"
    subgroup: int = 160
    # Two param groups (weight decay and none), hence two buckets, which one step must update
    # together or not at all.
    two_groups: bool = False

    def describe(self):
        return (f"placement={self.placement!r} dtype={self.dtype} state_dtype={self.state_dtype} "
                f"master_dtype={self.master_dtype} host_params={self.host} model={self.model} "
                f"subgroup_size={self.subgroup} two_groups={self.two_groups}")

    @property
    def pins_at_steps(self):
        # Only a first step of an optimizer pins more host memory (its spare slots), and only
        # when its arena has no room left for them: the wide model's does not (see test_soak).
        return self.model == "wide"


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def snapshot(model, opt):
    """Everything a step may change, of this process's shards: the weights and the state dict."""
    weights = [local(p.detach()).clone() for p in model.parameters()]
    state = {index: {key: local(value).clone() for key, value in entry.items()}
             for index, entry in opt.state_dict()["state"].items()}
    return weights, state


def counters(standin):
    """What each driver fault counts, so that its position can be drawn over a step's."""
    return {"fail_copy": standin.copies(), "fail_alloc": standin.allocations(),
            "fail_launch": standin.launches(), "fail_pin": standin.pinnings(),
            "device_lost": standin.calls()}


def poison(model, rng):
    """inf/-inf/NaN in a few elements of one gradient (of this process's shard); returns
    (parameter index, flat indices)."""
    with_grad = [i for i, p in enumerate(model.parameters())
                 if p.grad is not None and local(p.grad).numel() > 0]
    index = rng.choice(with_grad)
    flat = local(list(model.parameters())[index].grad).view(-1)
    elements = sorted(rng.sample(range(flat.numel()), min(flat.numel(), rng.randint(1, 3))))
    for e in elements:
        flat[e] = rng.choice([float("inf"), float("-inf"), float("nan")])
    return index, elements


def position(kind, typical, rng):
    """Which of the step's copies, allocations, ... the fault hits: one of those a fault-free
    step makes, or one beyond them (nothing fails). Pinnings are few (a first step's growth):
    always one of them."""
    if kind == "fail_pin":
        return rng.randint(1, max(1, typical.get(kind, 1)))
    return rng.randint(1, typical.get(kind, 8) + 1)  # 8 before a step counted them


def draw(config, seed, attempt):
    """What happens to one attempt: (event, load_state_dict first, a non-finite gradient, the
    generator the rest of the attempt draws from). Each attempt has its own generator: what it
    draws does not depend on what earlier attempts drew (how many values a draw takes depends on
    the counts it is scaled to)."""
    rng = random.Random(f"{seed}:{attempt}")
    event = rng.choices(list(FAULTS), weights=list(FAULTS.values()))[0]
    if config.placement == "cpu" and event in ("device_lost_between", "fail_launch"):
        event = "none"  # an all-CPU step makes no driver call and launches no kernel
    if event == "fail_pin" and not config.pins_at_steps:
        event = "none"  # its steps pin nothing
    load = rng.random() < LOAD_STATE_DICT
    nonfinite = rng.random() < NONFINITE
    return event, load, nonfinite, rng


def soak(config, make, standin, seed, steps, where):
    """`steps` attempts of `config` under the schedule of `seed`; returns the counts. Fails with
    an AssertionError naming `where` and the attempt."""
    # Per kind: how often the schedule drew it, and how often it fired (the step met it: an
    # armed fault beyond the step's last copy, say, fails nothing).
    counts = {kind: 0 for kind in FAULTS}
    counts |= {f"{kind} fired": 0 for kind in FAULTS if kind != "none"}
    counts |= {"nonfinite": 0, "load_state_dict": 0, "attempts": 0, "completed": 0, "raised": 0,
               "completed_after_fault": 0, "fresh_optimizers": 0}

    model, opt = make(config)
    ref_model, ref_opt = make(config)
    per_step = None  # what a fault-free step counts of copies, allocations, ... driver calls
    per_first_step = None  # the same for a fresh optimizer's first step
    per_cold_step = None  # the same for a step after the device memory cache was emptied
    fresh = True  # the optimizer has not stepped yet
    completed = 0

    def renew(model, opt):
        """A fresh optimizer (and model) from the last state, as a job resumes from it."""
        held = snapshot(model, opt)
        weights = [p.detach().clone() for p in model.parameters()]
        state = copy.deepcopy(opt.state_dict())
        del opt, model
        gc.collect()
        model, opt = make(config, weights, state)
        counts["fresh_optimizers"] += 1
        diff = differences(snapshot(model, opt), held)
        assert not diff, f"{at}: the fresh optimizer differs from the last state: {diff}"
        return model, opt

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "completed after a fault"
        # `extra` has no gradient at even steps, so its step count stays behind (as documented).
        warnings.filterwarnings("ignore", "tide: parameters of one bucket have different step",
                                UserWarning)
        for attempt in range(1, steps + 1):
            at = f"{where}, attempt {attempt} (after {completed} completed steps)"
            event, load, nonfinite, rng = draw(config, seed, attempt)
            counts[event] += 1
            counts["load_state_dict"] += load
            counts["nonfinite"] += nonfinite
            counts["attempts"] += 1
            step = completed + 1

            if event == "fail_pin" and not fresh:
                # Pinning happens where an arena grows: at an optimizer's first step (its spare
                # slots), as after a resume.
                model, opt = renew(model, opt)
                fresh = True
            if load:
                held = snapshot(model, opt)
                opt.load_state_dict(copy.deepcopy(opt.state_dict()))
                diff = differences(snapshot(model, opt), held)
                assert not diff, f"{at}: load_state_dict of the current state changed {diff}"

            opt.zero_grad()
            model.loss(step).backward()
            poisoned = poison(model, rng) if nonfinite else None
            grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
            before = snapshot(model, opt)

            cold = "fail_alloc" in event
            if cold:
                # Device memory is allocated where a step needs more than tide's caching
                # allocator holds: never in a steady step (its buffers are kept). So the
                # attempt comes after the cache was emptied (as torch.cuda.empty_cache()
                # between steps does), and the step allocates its buffers again.
                for bucket in opt._buckets:
                    bucket.executor.release_buffers()
                tide_allocator.empty_cache()
            typical = (per_cold_step if cold else per_first_step if fresh else per_step) or {}
            fault = []  # (kind, n): the n-th copy, allocation, ... driver call of the step fails
            if event == "device_lost_between":
                fault = [("device_lost", 1)]
            elif event != "none":
                fault = [(kind, position(kind, typical, rng)) for kind in event.split("+")]
            start = counters(standin)
            injected = standin.stat("injected_faults")
            raised = None
            for kind, n in fault:
                standin.arm(kind, n)
            try:
                opt.step()
            except Exception as error:  # noqa: BLE001 (any error: the state decides)
                raised = error.with_traceback(None)
            now = snapshot(model, opt)
            for _ in range(3):  # nothing lands later (on the stand-in queued work still runs)
                time.sleep(0.002)
                diff = differences(snapshot(model, opt), now)
                assert not diff, f"{at}, {fault}: written after step() ended: {diff}"
            standin.disarm()
            fired = standin.stat("injected_faults") > injected
            if fired:
                counts[f"{event} fired"] += 1
            elif cold and raised is None:
                # Armed beyond the step's last allocation: it counted a whole cold step.
                per_cold_step = {k: counters(standin)[k] - start[k] for k in start}
            if fault:
                for bucket in opt._buckets:
                    bucket.executor.release_buffers()
                diff = differences(snapshot(model, opt), now)
                assert not diff, f"{at}, {fault}: written after step() ended: {diff}"
            elif raised is None:
                made = {k: counters(standin)[k] - start[k] for k in start}
                if fresh:
                    per_first_step = made
                else:
                    per_step = made

            if raised is not None:
                counts["raised"] += 1
                assert fault, f"{at}: step() raised without a fault: {raised!r}"
                # Pinned memory that cannot be had is an out-of-memory like any other: the
                # subgroups that needed it are updated on the CPU, and the step completes.
                assert event != "fail_pin", f"{at}, {fault}: step() raised: {raised!r}"
                diff = differences(now, before)
                assert not diff, (f"{at}, {fault}: step() raised ({raised}) and changed "
                                  f"{diff}")
            else:
                fresh = False
                counts["completed"] += 1
                moved = (opt.last_plan["rolled_forward_subgroups"]
                         + opt.last_plan["fallback_subgroups"])
                if fault and moved:
                    counts["completed_after_fault"] += 1
                # The subgroups that found no pinned memory were updated on the CPU.
                assert not (event == "fail_pin" and fired and not moved), (at, opt.last_plan)
                for p, g in zip(ref_model.parameters(), grads):
                    p.grad = g
                ref_opt.step()
                completed += 1
                diff = differences(now, snapshot(ref_model, ref_opt))
                assert not diff, (f"{at}, {fault}: step() returned, but not with the fault-free "
                                  f"step's bits: {diff}")
                assert opt.last_plan["nonfinite"] == ref_opt.last_plan["nonfinite"], at
                if poisoned is not None:
                    check_poisoned(config, poisoned, before, now, opt.last_plan, at)
            if event.startswith("device_lost"):
                # The device is gone: go on with a fresh optimizer from the last state.
                del raised
                model, opt = renew(model, opt)
                fresh = True

    assert counts["completed"] > 0, (where, counts)
    return counts


def check_poisoned(config, poisoned, before, now, plan, at):
    """A non-finite gradient's elements keep their weight and state, and are counted."""
    index, elements = poisoned
    assert plan["nonfinite"] >= len(elements), (at, plan)
    (w0, s0), (w1, s1) = before, now
    assert torch.equal(w0[index].view(-1)[elements], w1[index].view(-1)[elements]), (
        f"{at}: a weight with a non-finite gradient changed")
    keys = ["master_param", "master_comp"]
    if config.state_dtype != "q8":  # 8-bit moments share a block's scale
        keys += ["exp_avg", "exp_avg_sq"]
    for key in keys:
        if key in s0.get(index, {}):
            assert torch.equal(s0[index][key].view(-1)[elements],
                               s1[index][key].view(-1)[elements]), (
                f"{at}: {key} of an element with a non-finite gradient changed")

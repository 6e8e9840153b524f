"""A step of tide.torch.AdamW happens exactly, or not at all (CPU mode, the stand-in's fault
injection).

For every placement, a step is run with a fault at each of its positions in turn: every copy,
every device allocation, every kernel launch, and the device lost at each driver call the step
makes. Whatever the
position, afterwards the model's weights, the optimizer's state dict (master weights, moments,
step counts) and a parameter without a gradient in that step are bit for bit either what a
fault-free run has after the step ("completed exactly") or what it had before ("not happened",
and then step() raised). Nothing changes after step() returns or raises. Training then goes on:
the next step is bit for bit the fault-free run's, and the weights stay within the tolerance of
torch.optim.AdamW's (a bias correction off by one step would be far outside it).

The model is tiny and cut into a few subgroups (one parameter straddles three), so that every
position of a step can be tried in a few seconds per placement.

These sweeps run without resident state (TIDE_RESIDENCY=off): a resident subgroup's state is on
the device, so reading the state after the step (the snapshots) is itself a copy a fault can hit,
and a lost device loses it (the documented window). Resident state has its own test at the end:
copy and allocation faults at every position of a step that updates it.
"""

from __future__ import annotations

import time
import warnings

import pytest

torch = pytest.importorskip("torch")
import tide.torch as tt  # noqa: E402
from standin_faults import Net, Standin, same, snapshot  # noqa: E402

if torch.cuda.is_available():
    pytest.skip("fault injection needs the stand-in driver (CPU mode)", allow_module_level=True)

PLACEMENTS = ["cpu", "gpu", 2, "auto"]
SUBGROUP = 160
STEPS = 3  # the fault is in step 2; step 1 gives the moments values, step 3 checks what follows


@pytest.fixture(autouse=True)
def no_residency(monkeypatch, request):
    # Two buckets keep the default: with a fixed placement nothing is resident, but the step
    # still asks the allocator for the residency budget, which a lost device must not turn into
    # a raise after the first bucket was stepped.
    if not any(word in request.node.name for word in ("resident", "two_buckets")):
        monkeypatch.setenv("TIDE_RESIDENCY", "off")


def make(dtype, placement, state_dtype=torch.float32, host=False, two_groups=False):
    model = Net(dtype)
    params = list(model.parameters())
    if two_groups:
        # Two buckets (their hyperparameters differ), in the parameters' order.
        params = [{"params": params[:2]}, {"params": params[2:], "weight_decay": 0.0}]
    opt = tt.AdamW(params, lr=1e-2, weight_decay=0.1, subgroup_size=SUBGROUP,
                   placement=placement, state_dtype=state_dtype, host_params=host)
    return model, opt


def backward(model, opt, step):
    opt.zero_grad()
    model.loss(step).backward()


@pytest.fixture(scope="module")
def standin():
    make(torch.float32, "cpu")  # loads tide over the stand-in (CPU mode)
    s = Standin()
    yield s
    s.disarm()


def counters(standin):
    return (standin.copies(), standin.allocations(), standin.launches(), standin.calls())


def fault_free(dtype, placement, standin, state_dtype, host=False, two_groups=False):
    """Snapshots before the step under test, after it and after the next, and what one such
    step counts of copies, allocations, kernel launches and driver calls."""
    model, opt = make(dtype, placement, state_dtype, host, two_groups)
    backward(model, opt, 1)
    opt.step()
    backward(model, opt, 2)
    before = snapshot(model, opt)
    counts = counters(standin)
    opt.step()
    counts = tuple(after - start for after, start in zip(counters(standin), counts))
    after = snapshot(model, opt)
    if host:  # the parameters were stepped where they are, with no master copy
        assert opt.last_plan["host_resident_elements"] == 4 * SUBGROUP - 16
    backward(model, opt, 3)
    opt.step()
    return before, after, snapshot(model, opt), counts


def torch_reference(dtype):
    """torch.optim.AdamW's weights after STEPS steps of the same losses (fp32 masters for a
    bf16 model, as tide keeps them)."""
    model = Net(dtype)
    masters = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()]
    ref = torch.optim.AdamW(masters, lr=1e-2, weight_decay=0.1)
    for step in range(1, STEPS + 1):
        for p in model.parameters():
            p.grad = None
        model.loss(step).backward()
        for m, p in zip(masters, model.parameters()):
            m.grad = None if p.grad is None else p.grad.float()
        ref.step()
        with torch.no_grad():
            for m, p in zip(masters, model.parameters()):
                p.copy_(m)
    return [m.detach().clone() for m in masters]


def run_with_fault(dtype, placement, standin, kind, n, expected, state_dtype, host=False,
                   two_groups=False):
    before, after, final = expected
    model, opt = make(dtype, placement, state_dtype, host, two_groups)
    backward(model, opt, 1)
    opt.step()
    backward(model, opt, 2)
    assert same(snapshot(model, opt), before)
    standin.arm(kind, n)
    raised = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "completed after a fault"
        try:
            opt.step()
        except Exception as error:  # noqa: BLE001 (any error: the state decides)
            # Without its traceback (this frame): the optimizer goes when this run ends, not at
            # a garbage collection while a later run has the device lost (it would stay, leaked,
            # with a RuntimeWarning).
            raised = error.with_traceback(None)
    now = snapshot(model, opt)
    # Nothing lands later: on the stand-in, work queued before a device loss still runs. Poll
    # a little while it is lost, then bring it back and wait for all of it.
    for _ in range(3):
        time.sleep(0.002)
        assert same(snapshot(model, opt), now), f"{kind} {n}: a write after step() returned"
    standin.disarm()
    for bucket in opt._buckets:
        bucket.executor.release_buffers()
    assert same(snapshot(model, opt), now), f"{kind} {n}: a write after step() returned"

    if raised is None:
        assert same(now, after), f"{kind} {n}: step() returned, but not with the step's bits"
    else:
        assert same(now, before), (f"{kind} {n}: step() raised ({raised}) and changed "
                                   "something")
        opt.step()  # not happened: the same step again
        assert same(snapshot(model, opt), after), f"{kind} {n}: the retried step differs"
    backward(model, opt, 3)
    opt.step()
    assert same(snapshot(model, opt), final), f"{kind} {n}: the next step differs"
    return raised is not None, model


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_step_completes_exactly_or_not_at_all_whatever_fails(standin, placement, dtype):
    completes_exactly_or_not_at_all(standin, placement, dtype, torch.float32)


# bf16 moments (state_dtype): the state dict shows them upcast to fp32, exactly, so the same
# bit-for-bit comparisons hold; the placements that copy state to and from the "GPU".
@pytest.mark.parametrize("placement", ["gpu", 2])
def test_with_bf16_moments_a_step_completes_exactly_or_not_at_all(standin, placement):
    completes_exactly_or_not_at_all(standin, placement, torch.bfloat16, torch.bfloat16)


# 8-bit moments: the state dict holds their exact codes and scales (besides the dequantized fp32
# moments), so the comparisons are bit for bit over the quantized state too; a frozen parameter
# ("extra" at step 2) shares quantization blocks with its neighbours (FrozenQ8Blocks).
@pytest.mark.parametrize("placement", ["cpu", "gpu", 2])
def test_with_8bit_moments_a_step_completes_exactly_or_not_at_all(standin, placement):
    completes_exactly_or_not_at_all(standin, placement, torch.bfloat16, "q8")


# Host-resident fp32 parameters (host_params, FSDP2's CPUOffloadPolicy regime): the weights are
# the master weights, written in place by CPU updates and by the commit of GPU subgroups.
@pytest.mark.parametrize("placement", ["gpu", 2])
def test_host_resident_parameters_step_exactly_or_not_at_all(standin, placement):
    completes_exactly_or_not_at_all(standin, placement, torch.float32, torch.float32, host=True)


# Two buckets (two param groups): one step updates both or neither. The device lost at calls
# spread over the step (trying each of its thousands would take minutes): most of them fall in
# the first bucket's step, which completes it, and then the second bucket's step must complete
# too, not raise.
def test_two_buckets_step_together_or_not_at_all(standin):
    completes_exactly_or_not_at_all(standin, 2, torch.float32, torch.float32, two_groups=True)


def completes_exactly_or_not_at_all(standin, placement, dtype, state_dtype, host=False,
                                    two_groups=False):
    expected_before, expected_after, expected_final, counts = fault_free(
        dtype, placement, standin, state_dtype, host, two_groups)
    copies, allocations, launches, calls = counts
    expected = (expected_before, expected_after, expected_final)
    assert copies > 0 and calls > 0
    reference = None if two_groups else torch_reference(dtype)
    every = max(1, calls // 24) if two_groups else 1
    positions = ([("fail_copy", n) for n in range(1, copies + 2)]
                 + [("fail_alloc", n) for n in range(1, allocations + 2)]
                 + [("fail_launch", n) for n in range(1, launches + 2)]
                 + [("device_lost", n) for n in range(1, calls + 2, every)])
    outcomes = {"raised": 0, "completed": 0}
    for kind, n in positions:
        raised, model = run_with_fault(dtype, placement, standin, kind, n, expected,
                                       state_dtype, host, two_groups)
        outcomes["raised" if raised else "completed"] += 1
    # Both outcomes occur: a device lost at the step's first call cannot complete it.
    assert outcomes["raised"] > 0 and outcomes["completed"] > 0, outcomes
    if reference is None:
        return  # its second group has no weight decay: not torch_reference's hyperparameters
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    for (name, ours), theirs in zip(model.named_parameters(), reference):
        if name == "extra":
            continue  # no gradient at step 2: tide's bias correction counts per bucket (docs/guide/optimizer.md)
        scale = theirs.abs().max().item() or 1.0
        assert (ours.detach().float() - theirs).abs().max().item() / scale < tolerance


# Resident state (placement auto, TIDE_RESIDENCY=auto): steps 1 and 2 leave the subgroups the
# forecast holds resident on the device; step 3 is run with a copy or an allocation failing at each of its
# positions (the faults are disarmed before the state is read back). Each step completes exactly
# (rolled forward on the CPU from the device's state) or not at all, and the next is exact too.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_resident_state_completes_exactly_or_not_at_all(standin, dtype):
    def steps(n_steps, fault=None):
        model, opt = make(dtype, "auto")
        raised = None
        for step in range(1, n_steps + 1):
            backward(model, opt, step)
            if step == 3 and fault is not None:
                standin.arm(*fault)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                try:
                    opt.step()
                except Exception as error:  # noqa: BLE001
                    raised = error.with_traceback(None)
            standin.disarm()
            if step == 2:
                assert opt.last_plan["resident_subgroups"] > 0
                counts = (standin.copies(), standin.allocations())
            if step == 3 and fault is None:
                counts = tuple(a - b for a, b in zip((standin.copies(), standin.allocations()),
                                                     counts))
            if step == 3 and raised is not None:
                opt.step()  # not happened: the same step again
        return snapshot(model, opt), raised, counts if fault is None else None

    expected, _, (copies, allocations) = steps(4)
    assert copies > 0
    for fault in ([("fail_copy", n) for n in range(1, copies + 1)]
                  + [("fail_alloc", n) for n in range(1, allocations + 1)]):
        got, raised, _ = steps(4, fault)
        assert same(got, expected), f"{fault}: raised {raised}"

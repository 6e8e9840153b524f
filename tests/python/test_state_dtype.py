"""bf16 moments: tide.torch.AdamW(..., state_dtype=torch.bfloat16), or TIDE_STATE_DTYPE.

The moments live in pinned memory as bf16 (half their bytes), rounded to nearest even after every
update by every kernel alike; the master weights stay fp32. opt.state and state_dict() show them as
torch keeps them, fp32 (upcast: exact), so checkpoints keep torch's layout and a bf16-state
checkpoint restores the exact bits.

The reference for the numbers is named: ``adamw_float64_bf16_moments`` below, AdamW in float64 whose
moments are rounded to bf16 after each step (the same algorithm). Each step is compared from the
same state (tide's), so nothing amplifies; what a correct fp32 implementation may differ from it
by is measured per element: its weights within a few fp32 roundings of the update, and its bf16
moments equal to a rounding of the float64 moment moved by a few fp32 roundings (an element near a
bf16 rounding midpoint may round either way).
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
import tide.torch as tt  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SHAPES = [(40, 30), (30,), (30, 20), (77,)]
SUBGROUP = 700  # the first and the third parameters lie across subgroup cuts
LR, BETAS, EPS, WD = 1e-2, (0.9, 0.999), 1e-8, 0.1


def make_params(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter((torch.randn(shape, generator=g) * 0.5).to(DEVICE, dtype))
            for shape in SHAPES]


def gradients(step):
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(shape, generator=g).to(DEVICE) * (1.0 + step) for shape in SHAPES]


def make_opt(params, placement="cpu", **options):
    options.setdefault("state_dtype", torch.bfloat16)
    return tt.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                    subgroup_size=SUBGROUP, placement=placement, **options)


def step_with(params, opt, steps):
    for step in steps:
        for p, g in zip(params, gradients(step)):
            p.grad = g.to(p.dtype)
        opt.step()


def moments_in_pinned_memory(opt, i):
    """Parameter i's moments as tide holds them (of the bucket's state dtype)."""
    bucket = opt._buckets[0]
    return [torch.cat([bucket.pinned(key, piece) for piece in bucket.pieces[i]]).clone()
            for key in ("exp_avg", "exp_avg_sq")]


def adamw_float64_bf16_moments(p, g, m, v, step):
    """The reference: one AdamW step (torch's formula) in float64, from fp32 weights and moments;
    the moments stored rounded to bf16 (the weights use them before the rounding)."""
    p, g, m, v = (t.double() for t in (p, g, m, v))
    p = p * (1 - LR * WD)
    m = BETAS[0] * m + (1 - BETAS[0]) * g
    v = BETAS[1] * v + (1 - BETAS[1]) * g * g
    bc1, bc2 = 1 - BETAS[0] ** step, 1 - BETAS[1] ** step
    p = p - (LR / bc1) * m / ((v.sqrt() / bc2 ** 0.5) + EPS)
    return p, m, v


def starting_state(params, opt, step):
    """(weights, exp_avg, exp_avg_sq) of each parameter before `step`, as the state dict shows
    them (zero moments before the first)."""
    before = opt.state_dict()["state"] if step > 1 else {}
    return [(p.detach().cpu().clone(),
             before[i]["exp_avg"] if before else torch.zeros(p.shape),
             before[i]["exp_avg_sq"] if before else torch.zeros(p.shape))
            for i, p in enumerate(params)]


def bf16_roundings(x):
    """The bf16 values a correct fp32 computation of float64 `x` may round to: x moved by a few
    fp32 roundings either way, then rounded (to fp32, then to bf16, as tide's kernels do)."""
    delta = 8 * 2.0 ** -24 * x.abs()
    lo = (x - delta).float().to(torch.bfloat16).float()
    hi = (x + delta).float().to(torch.bfloat16).float()
    return torch.minimum(lo, hi), torch.maximum(lo, hi)


# ---- the argument and the knob ----

def test_bad_state_dtypes_are_refused(monkeypatch):
    monkeypatch.delenv("TIDE_STATE_DTYPE", raising=False)
    for bad in (torch.float16, torch.float64, "bfloat16", torch.int8):
        with pytest.raises(ValueError, match="state_dtype must be torch.float32, "
                                             "torch.bfloat16 or"):
            make_opt(make_params(), state_dtype=bad)
    for bad in ("bf16", "BFLOAT16", "float16", " float32"):
        monkeypatch.setenv("TIDE_STATE_DTYPE", bad)
        with pytest.raises(ValueError, match="TIDE_STATE_DTYPE.*float32, bfloat16 or q8"):
            tt.AdamW(make_params(), subgroup_size=SUBGROUP)


def state_dtype_of(opt):
    return opt._buckets[0].state_dtype  # (a call on the optimizer itself keeps it alive)


def test_the_argument_wins_over_the_knob(monkeypatch):
    monkeypatch.delenv("TIDE_STATE_DTYPE", raising=False)
    assert state_dtype_of(tt.AdamW(make_params())) == torch.float32
    monkeypatch.setenv("TIDE_STATE_DTYPE", "bfloat16")
    assert state_dtype_of(tt.AdamW(make_params())) == torch.bfloat16
    assert state_dtype_of(tt.Adam(make_params())) == torch.bfloat16
    assert state_dtype_of(make_opt(make_params(), state_dtype=torch.float32)) == torch.float32
    monkeypatch.setenv("TIDE_STATE_DTYPE", "float32")
    opt = make_opt(make_params())
    assert opt._buckets[0].state_dtype == torch.bfloat16
    assert opt._buckets[0].views[0]["exp_avg"].dtype == torch.bfloat16
    assert opt._buckets[0].views[0]["param"].dtype == torch.float32


# ---- numbers ----

@pytest.mark.numerics
@pytest.mark.parametrize("placement", ["cpu", "gpu", 2])
def test_each_step_is_the_float64_reference_with_moments_rounded_to_bf16(placement):
    params = make_params()
    opt = make_opt(params, placement)
    flips = total = 0
    for step in range(1, 7):
        start = starting_state(params, opt, step)
        step_with(params, opt, [step])
        after = opt.state_dict()["state"]
        for i, (p, g) in enumerate(zip(params, gradients(step))):
            ref_p, ref_m, ref_v = adamw_float64_bf16_moments(*start[i][:1], g.cpu(),
                                                             *start[i][1:], step)
            ours_p = p.detach().cpu().double()
            # The weights: a few fp32 roundings of the weight and of the update.
            update = (ref_p - start[i][0].double() * (1 - LR * WD)).abs()
            slack = 4 * 2.0 ** -24 * ref_p.abs() + 1e-5 * update + 1e-12
            assert ((ours_p - ref_p).abs() <= slack).all(), f"step {step}, parameter {i}"
            # The moments: bf16 values (what the state dict shows is their exact upcast), each
            # one of the roundings a correct fp32 computation may give.
            for key, ref in (("exp_avg", ref_m), ("exp_avg_sq", ref_v)):
                ours = after[i][key]
                assert ours.dtype == torch.float32
                assert torch.equal(ours, ours.to(torch.bfloat16).float())
                lo, hi = bf16_roundings(ref)
                assert ((ours >= lo) & (ours <= hi)).all(), f"step {step}, {key} {i}"
                flips += int((ours != ref.float().to(torch.bfloat16).float()).sum())
                total += ours.numel()
            # And tide holds exactly those bits.
            m, v = moments_in_pinned_memory(opt, i)
            assert m.dtype == torch.bfloat16
            assert torch.equal(m.float().view(p.shape), after[i]["exp_avg"])
            assert torch.equal(v.float().view(p.shape), after[i]["exp_avg_sq"])
    # The criterion is not vacuous: almost every moment is exactly the reference's rounding.
    assert flips <= total // 100, (flips, total)


@pytest.mark.numerics
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("state_dtype", [torch.bfloat16, "q8"], ids=["bf16_moments", "q8"])
def test_gpu_subgroups_equal_the_cpu_path_bit_for_bit(dtype, state_dtype):
    """(8-bit moments, state_dtype="q8": the state dict's exact codes and scales too.)"""
    results = {}
    for placement in ("cpu", "gpu", 2, "auto"):
        params = make_params(dtype)
        opt = make_opt(params, placement, state_dtype=state_dtype)
        step_with(params, opt, range(1, 5))
        if placement == "gpu":
            assert opt.last_plan["cpu_subgroups"] == 0
        results[placement] = ([p.detach().clone() for p in params], opt.state_dict()["state"])
    weights, state = results["cpu"]
    for placement, (w, s) in results.items():
        assert all(torch.equal(a, b) for a, b in zip(w, weights)), placement
        for i, entry in state.items():
            assert all(torch.equal(s[i][key], entry[key]) for key in entry), (placement, i)


def test_bf16_moments_train_as_fp32_moments_do():
    """Not the same bits, but the same training: after 20 steps the weights are close to those
    of fp32 moments (a rounding of 2^-9 in the moments moves each update by about that much)."""
    runs = {}
    for state_dtype in (torch.float32, torch.bfloat16):
        params = make_params()
        opt = make_opt(params, state_dtype=state_dtype)
        step_with(params, opt, range(1, 21))
        runs[state_dtype] = torch.cat([p.detach().reshape(-1) for p in params])
    moved = (runs[torch.float32] - torch.cat([p.detach().reshape(-1)
                                              for p in make_params()])).abs().max()
    assert (runs[torch.bfloat16] - runs[torch.float32]).abs().max() < 0.02 * moved
    assert not torch.equal(runs[torch.bfloat16], runs[torch.float32])


# ---- opt.state and checkpoints ----

def test_opt_state_shows_fp32_copies_and_takes_writes_rounded_once():
    params = make_params()
    opt = make_opt(params, "gpu")
    step_with(params, opt, [1, 2])
    for i, p in enumerate(params):
        entry = opt.state[p]
        assert entry["exp_avg"].dtype == torch.float32 and entry["exp_avg"].shape == p.shape
        m, _ = moments_in_pinned_memory(opt, i)
        assert torch.equal(entry["exp_avg"], m.float().view(p.shape))
    held = opt.state[params[1]]["exp_avg"]
    written = torch.full(params[1].shape, 1.0 + 2.0 ** -12)  # between two bf16 values
    held.copy_(written)
    step_with(params, opt, [3])  # takes the write (rounded to 1.0), then steps
    assert held is opt.state[params[1]]["exp_avg"]  # a copy held across a step is refreshed
    m, _ = moments_in_pinned_memory(opt, 1)
    assert torch.equal(held, m.float())
    g = gradients(3)[1].cpu()  # where opt.state shows the moments: host memory
    expected = (BETAS[0] * torch.ones_like(g).double() + (1 - BETAS[0]) * g.double())
    lo, hi = bf16_roundings(expected)
    assert ((held >= lo) & (held <= hi)).all()


def test_a_bf16_state_checkpoint_restores_the_exact_bits(tmp_path):
    params = make_params()
    opt = make_opt(params, 2)
    step_with(params, opt, [1, 2, 3])
    torch.save({"model": [p.detach() for p in params], "optimizer": opt.state_dict()},
               tmp_path / "checkpoint.pt")
    checkpoint = torch.load(tmp_path / "checkpoint.pt")
    resumed_params = make_params(seed=5)
    with torch.no_grad():
        for p, saved in zip(resumed_params, checkpoint["model"]):
            p.copy_(saved)
    resumed = make_opt(resumed_params, "cpu")
    resumed.load_state_dict(checkpoint["optimizer"])
    for i in range(len(params)):
        for ours, theirs in zip(moments_in_pinned_memory(resumed, i),
                                moments_in_pinned_memory(opt, i)):
            assert torch.equal(ours.view(torch.int16), theirs.view(torch.int16))
    step_with(params, opt, [4, 5])
    step_with(resumed_params, resumed, [4, 5])
    assert all(torch.equal(a, b) for a, b in zip(params, resumed_params))


def test_torch_checkpoints_load_both_ways():
    """A torch.optim.AdamW checkpoint (fp32 moments) into bf16 moments: each rounded once, to
    nearest even. A bf16-moment checkpoint into torch.optim.AdamW and into fp32-state tide:
    exact fp32 values, and training goes on."""
    params = make_params()
    theirs = torch.optim.AdamW(params, lr=LR, weight_decay=WD, foreach=False)
    step_with(params, theirs, [1, 2])
    saved = copy.deepcopy(theirs.state_dict())
    ours = make_opt([p.detach().clone().requires_grad_(True) for p in params])
    with torch.no_grad():
        for p, q in zip(ours.param_groups[0]["params"], params):
            p.copy_(q)
    ours.load_state_dict(saved)
    for i, p in enumerate(params):
        # tide's moments are in host memory, torch's where the parameters are.
        m, v = moments_in_pinned_memory(ours, i)
        assert torch.equal(m.view(p.shape), saved["state"][i]["exp_avg"].cpu().to(torch.bfloat16))
        assert torch.equal(v.view(p.shape),
                           saved["state"][i]["exp_avg_sq"].cpu().to(torch.bfloat16))
    ours_saved = ours.state_dict()
    fp32_tide = make_opt([p.detach().clone().requires_grad_(True) for p in params],
                         state_dtype=torch.float32)
    fp32_tide.load_state_dict(ours_saved)
    back = torch.optim.AdamW([p.detach().clone().requires_grad_(True) for p in params], lr=LR,
                             weight_decay=WD, foreach=False)
    back.load_state_dict(ours_saved)
    for i, p in enumerate(back.param_groups[0]["params"]):
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(back.state[p][key].cpu(), ours_saved["state"][i][key])
            assert torch.equal(fp32_tide.state_dict()["state"][i][key],
                               ours_saved["state"][i][key])
    step_with(ours.param_groups[0]["params"], ours, [3])


def test_a_load_that_does_not_fit_leaves_bf16_state_as_it_was():
    params = make_params()
    opt = make_opt(params, 2)
    step_with(params, opt, [1])
    before = [moments_in_pinned_memory(opt, i) for i in range(len(params))]
    bad = copy.deepcopy(opt.state_dict())
    bad["state"][2]["exp_avg_sq"][0, 0] = -1.0
    with pytest.raises(ValueError, match="negative"):
        opt.load_state_dict(bad)
    # Finite in fp32, infinite in bf16: refused too (fp32 state would take it).
    bad = copy.deepcopy(opt.state_dict())
    bad["state"][0]["exp_avg_sq"][1, 1] = 3.3999e38
    with pytest.raises(ValueError, match="too large for the optimizer's state_dtype"):
        opt.load_state_dict(bad)
    fp32_state = make_opt(make_params(), 2, state_dtype=torch.float32)
    step_with(fp32_state.param_groups[0]["params"], fp32_state, [1])
    fp32_state.load_state_dict(bad)
    for i, (m, v) in enumerate(before):
        now = moments_in_pinned_memory(opt, i)
        assert torch.equal(now[0], m) and torch.equal(now[1], v)

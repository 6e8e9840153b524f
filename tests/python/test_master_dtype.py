"""bf16 master weights with compensation through tide.torch: AdamW(..., master_dtype=torch.bfloat16)
or TIDE_MASTER_DTYPE=bfloat16.

The model's bf16 parameters are the master weights (no fp32 master); each element has a bf16
compensation c, and the weight is w + c (kernels/adam_math.h, adam_master_element). opt.state and
state_dict() keep torch's keys plus "master_comp" (bf16) instead of "master_param".

References, named: (1) torch.optim.AdamW (foreach=False) on a float64 copy of the parameters, run
from the same start with the same gradients: w + c follows it to within a bound measured here,
while plain bf16 weights (torch.optim.AdamW on the bf16 parameters) fall far behind; (2) the same
algorithm run directly by tide.kernels.cpu_adam_step(..., param_comp=c) (the kernel the C ABI
exports, tests/python/test_master_bf16.py): tide.torch's result equals it bit for bit, under
every placement (the GPU kernel's source on the stand-in is bit for bit with the CPU variants).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import tide.torch as tt  # noqa: E402
from tide import kernels  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SHAPES = [(40, 30), (30,), (30, 20), (77,)]
SUBGROUP = 700  # the first and the third parameters lie across subgroup cuts
LR, BETAS, EPS, WD = 1e-4, (0.9, 0.999), 1e-8, 0.01


def make_params(dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g).to(DEVICE, dtype))
            for shape in SHAPES]


def gradients(step):
    """A steady drift (alternating signs) plus noise: many updates smaller than half a bf16 ulp
    of the weight, which plain bf16 weights lose."""
    g = torch.Generator().manual_seed(1000 + step)
    out = []
    for shape in SHAPES:
        n = torch.Size(shape).numel()
        drift = torch.where(torch.arange(n) % 2 == 0, 1.0, -1.0).reshape(shape)
        out.append((drift + 0.5 * torch.randn(shape, generator=g)).to(torch.bfloat16))
    return out


def make_opt(params, placement="cpu", **options):
    options.setdefault("master_dtype", torch.bfloat16)
    return tt.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                    subgroup_size=SUBGROUP, placement=placement, **options)


def step_with(params, opt, steps):
    for step in steps:
        for p, g in zip(params, gradients(step)):
            p.grad = g.to(DEVICE)
        opt.step()


def tide_state(params, opt):
    """(w, c, exp_avg, exp_avg_sq) per parameter, as CPU tensors (copies)."""
    out = []
    for p in params:
        entry = opt.state[p]
        out.append((p.detach().cpu().clone(), entry["master_comp"].clone(),
                    entry["exp_avg"].clone(), entry["exp_avg_sq"].clone()))
    return out


def same_bits(a, b):
    return all(torch.equal(x.view(-1), y.view(-1)) and x.dtype == y.dtype
               for pa, pb in zip(a, b) for x, y in zip(pa, pb))


# ---- the argument, the knob, what is refused ----

def test_bad_master_dtypes_are_refused(monkeypatch):
    monkeypatch.delenv("TIDE_MASTER_DTYPE", raising=False)
    for bad in (torch.float16, torch.float64, "bf16", torch.uint8):
        with pytest.raises(ValueError, match="master_dtype must be torch.float32 or "
                                             "torch.bfloat16"):
            make_opt(make_params(), master_dtype=bad)
    for bad in ("bf16", "BFLOAT16", "float16", " float32", "fp32"):
        monkeypatch.setenv("TIDE_MASTER_DTYPE", bad)
        with pytest.raises(ValueError, match="TIDE_MASTER_DTYPE.*float32 or bfloat16"):
            tt.AdamW(make_params(), subgroup_size=SUBGROUP)


def bf16_master_of(opt):
    return opt._buckets[0].bf16_master  # (a call on the optimizer itself keeps it alive)


def test_the_argument_wins_over_the_knob(monkeypatch):
    monkeypatch.delenv("TIDE_MASTER_DTYPE", raising=False)
    params = make_params()
    assert not bf16_master_of(tt.AdamW(params))
    monkeypatch.setenv("TIDE_MASTER_DTYPE", "bfloat16")
    assert bf16_master_of(tt.AdamW(params))
    assert bf16_master_of(tt.Adam(params))
    assert not bf16_master_of(make_opt(params, master_dtype=torch.float32))
    monkeypatch.setenv("TIDE_MASTER_DTYPE", "float32")
    opt = make_opt(params, master_dtype="bfloat16")
    views = opt._buckets[0].views[0]
    assert views["param"].dtype == torch.bfloat16 and views["comp"].dtype == torch.bfloat16


def test_fp32_parameters_and_8bit_moments_are_refused():
    with pytest.raises(ValueError, match="needs bfloat16 parameters.*got torch.float32"):
        make_opt(make_params(torch.float32))
    with pytest.raises(ValueError, match="needs bfloat16 parameters.*got torch.float16"):
        make_opt(make_params(torch.float16))
    # A model with one fp32 parameter among bf16 ones: refused as well, naming the dtype.
    mixed = make_params()[:2] + make_params(torch.float32)[2:]
    with pytest.raises(ValueError, match="needs bfloat16 parameters"):
        make_opt(mixed)
    with pytest.raises(ValueError, match="8-bit moments"):
        make_opt(make_params(), state_dtype="q8")


def test_host_resident_parameters_are_refused(monkeypatch):
    """host_params steps fp32 parameters in host memory as their own master weights; bf16 master
    weights need bf16 parameters: asking for both (the argument or TIDE_MASTER_DTYPE) is a
    ValueError naming both, whatever the parameters' dtype."""
    monkeypatch.delenv("TIDE_MASTER_DTYPE", raising=False)
    for dtype in (torch.bfloat16, torch.float32):
        with pytest.raises(ValueError, match="host-resident parameters are their own fp32 master weights; bf16 master "
                       "weights need bf16 parameters"):
            make_opt(make_params(dtype), host_params=True)
    monkeypatch.setenv("TIDE_MASTER_DTYPE", "bfloat16")
    with pytest.raises(ValueError, match="host-resident parameters are their own fp32 master weights; bf16 master "
                       "weights need bf16 parameters"):
        tt.AdamW(make_params(), host_params=True)
    tt.AdamW(make_params(), host_params=False)  # no host-resident parameters: fine


# ---- numbers ----

def kernel_reference(steps, state_dtype):
    """The same algorithm run by the C ABI's kernel directly, per parameter (a parameter's
    elements do not interact): (w, c, exp_avg, exp_avg_sq) after `steps`."""
    out = []
    for i, p in enumerate(make_params()):
        w = p.detach().cpu().reshape(-1).clone()
        c = torch.zeros_like(w)
        m = torch.zeros(w.numel(), dtype=state_dtype)
        v = torch.zeros(w.numel(), dtype=state_dtype)
        for step in steps:
            g = gradients(step)[i].reshape(-1)
            kernels.cpu_adam_step(w, g, m, v, step=step, lr=LR, betas=BETAS,
                                  eps=EPS, weight_decay=WD, param_comp=c)
        out.append((w, c, m.float(), v.float()))
    return out


@pytest.mark.numerics
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("placement", ["cpu", "gpu", "auto", 2])
def test_every_placement_is_the_kernel_bit_for_bit(placement, state_dtype):
    params = make_params()
    opt = make_opt(params, placement, state_dtype=state_dtype)
    steps = range(1, 6)
    step_with(params, opt, steps)
    if placement == "gpu":
        assert "gpu" in opt.last_plan["devices"]
    ours = [(w.reshape(-1), c.reshape(-1), m.reshape(-1), v.reshape(-1))
            for w, c, m, v in tide_state(params, opt)]
    assert same_bits(ours, kernel_reference(steps, state_dtype))


@pytest.mark.numerics
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_compensated_weights_follow_torch_adamw_on_a_float64_master(state_dtype):
    params = make_params()
    opt = make_opt(params, "auto", state_dtype=state_dtype)
    ref = [torch.nn.Parameter(p.detach().cpu().double()) for p in params]
    plain = [torch.nn.Parameter(p.detach().cpu().clone()) for p in params]
    start = [r.detach().clone() for r in ref]
    kw = dict(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, foreach=False)
    opt_ref, opt_plain = torch.optim.AdamW(ref, **kw), torch.optim.AdamW(plain, **kw)
    for step in range(1, 201):
        grads = gradients(step)
        for p, r, q, g in zip(params, ref, plain, grads):
            p.grad = g.to(DEVICE)
            r.grad = g.double()
            q.grad = g.clone()
        opt.step()
        opt_ref.step()
        opt_plain.step()
    moved = torch.cat([(r.detach() - s).reshape(-1) for r, s in zip(ref, start)]).norm()
    ours = torch.cat([(p.detach().cpu().double() + opt.state[p]["master_comp"].double()
                       - r.detach()).reshape(-1) for p, r in zip(params, ref)])
    theirs = torch.cat([(q.detach().double() - r.detach()).reshape(-1)
                        for q, r in zip(plain, ref)])
    err, err_plain = ours.norm() / moved, theirs.norm() / moved
    # Measured: 2.9e-3 (fp32 moments) and 4.3e-3 (bf16 moments) of the distance moved (w alone,
    # without c: 9.1e-2); plain bf16 weights 0.99 (the updates vanish). The kernel-level test
    # (test_master_bf16.py) measured about the same.
    assert err < 2e-2, float(err)
    assert err_plain > 0.5, float(err_plain)
    # The pair is a split: |c| is at most half an ulp of w.
    for p in params:
        w, c = p.detach().cpu().float(), opt.state[p]["master_comp"].float()
        assert bool((c.abs() <= w.abs() * 2.0 ** -8).all())


# ---- opt.state and checkpoints ----

def test_state_shows_torch_keys_and_the_compensation():
    params = make_params()
    opt = make_opt(params)
    step_with(params, opt, [1, 2])
    for p in params:
        entry = opt.state[p]
        assert set(entry) == {"step", "exp_avg", "exp_avg_sq", "master_comp"}
        assert entry["master_comp"].dtype == torch.bfloat16
        assert entry["exp_avg"].dtype == torch.float32
        assert entry["master_comp"].shape == p.shape
    assert any(bool((opt.state[p]["master_comp"] != 0).any()) for p in params)
    saved = opt.state_dict()["state"]
    assert set(saved[0]) == {"step", "exp_avg", "exp_avg_sq", "master_comp"}


def test_pinned_bytes_count_no_weight_copy():
    """The state's pinned bytes (opt.last_plan["pinned_state_bytes"], the node summary's
    figure): a bf16 master's weights and compensation take the fp32 master's 4 bytes and no
    bf16 upload copy is kept, so 2 bytes per parameter fewer than an fp32 master of the same
    bf16 parameters."""
    n = sum(torch.Size(shape).numel() for shape in SHAPES)
    figures = {}
    for master in (torch.float32, torch.bfloat16):
        params = make_params()
        opt = make_opt(params, master_dtype=master)
        step_with(params, opt, [1])
        figures[master] = opt.last_plan["pinned_state_bytes"]
    assert figures[torch.float32] - figures[torch.bfloat16] == 2 * n


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_a_checkpoint_round_trip_is_bit_exact(tmp_path, state_dtype):
    params = make_params()
    opt = make_opt(params, state_dtype=state_dtype)
    step_with(params, opt, [1, 2, 3])
    torch.save({"model": [p.detach().clone() for p in params], "opt": opt.state_dict()},
               tmp_path / "ckpt.pt")
    step_with(params, opt, [4, 5])

    saved = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    resumed = make_params()
    with torch.no_grad():
        for p, w in zip(resumed, saved["model"]):
            p.copy_(w)
    opt2 = make_opt(resumed, "gpu", state_dtype=state_dtype)  # another placement: the same bits
    opt2.load_state_dict(saved["opt"])
    step_with(resumed, opt2, [4, 5])
    assert same_bits(tide_state(params, opt), tide_state(resumed, opt2))


def test_a_torch_checkpoint_loads_with_zero_compensation():
    params = make_params()
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in params]
    topt = torch.optim.AdamW(theirs, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    for step in (1, 2):
        for p, g in zip(theirs, gradients(step)):
            p.grad = g.to(DEVICE)
        topt.step()
    with torch.no_grad():
        for p, q in zip(params, theirs):
            p.copy_(q)
    opt = make_opt(params)
    opt.load_state_dict(topt.state_dict())
    for p, q in zip(params, theirs):
        entry = opt.state[p]
        assert bool((entry["master_comp"] == 0).all())
        assert torch.equal(entry["exp_avg"], topt.state[q]["exp_avg"].float().cpu())
        assert int(entry["step"]) == 2
    # And tide's state dict goes into torch.optim.AdamW (which ignores "master_comp").
    step_with(params, opt, [3])
    topt.load_state_dict(opt.state_dict())
    assert int(topt.state[theirs[0]]["step"]) == 3


def test_an_fp32_master_checkpoint_gives_its_remainder_as_compensation():
    params = make_params()
    fp32 = make_opt(params, master_dtype=torch.float32)
    step_with(params, fp32, [1, 2])
    saved = fp32.state_dict()
    masters = [fp32.state[p]["master_param"].clone() for p in params]
    opt = make_opt(params)
    opt.load_state_dict(saved)
    for p, master in zip(params, masters):
        comp = opt.state[p]["master_comp"]
        assert torch.equal(comp, (master - p.detach().cpu().float()).to(torch.bfloat16))
        assert bool((comp != 0).any())


def test_a_parameter_written_outside_restarts_its_compensation():
    params = make_params()
    opt = make_opt(params)
    step_with(params, opt, [1, 2])
    entry = opt.state[params[1]]
    m, v = entry["exp_avg"].reshape(-1).clone(), entry["exp_avg_sq"].reshape(-1).clone()
    assert bool((entry["master_comp"] != 0).any())
    with torch.no_grad():
        params[1].add_(1.0)  # as model.load_state_dict would
    # Step 3 starts from the new value with zero compensation: the kernel's result from there.
    w = params[1].detach().cpu().reshape(-1).clone()
    c = torch.zeros_like(w)
    kernels.cpu_adam_step(w, gradients(3)[1].reshape(-1), m, v, step=3, lr=LR, betas=BETAS,
                          eps=EPS, weight_decay=WD, param_comp=c)
    step_with(params, opt, [3])
    assert torch.equal(params[1].detach().cpu().reshape(-1), w)
    assert torch.equal(opt.state[params[1]]["master_comp"].reshape(-1), c)


def test_a_bf16_master_checkpoint_gives_an_fp32_master_its_sum():
    params = make_params()
    opt = make_opt(params)
    step_with(params, opt, [1, 2])
    saved = opt.state_dict()
    sums = [p.detach().cpu().float() + opt.state[p]["master_comp"].float() for p in params]
    fp32 = make_opt(params, master_dtype=torch.float32)
    fp32.load_state_dict(saved)
    for p, total in zip(params, sums):
        assert torch.equal(fp32.state[p]["master_param"], total)

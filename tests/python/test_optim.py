"""tide.torch.AdamW / Adam against torch.optim: numerics under every placement, checkpoints both
ways, param groups, LR schedulers, clipping, GradScaler, and the edge cases of a drop-in optimizer.

Without a GPU these run in CPU mode (CPU tensors over the stand-in driver); with one (`-m gpu`),
the same checks run on CUDA tensors.
"""

from __future__ import annotations

import copy
import math

import pytest

torch = pytest.importorskip("torch")
import tide.torch as tt  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PLACEMENTS = ["cpu", "gpu", 2, "auto"]


class TinyTransformer(torch.nn.Module):
    def __init__(self, vocab=61, d=32, heads=4, layers=2, seq=12):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.randn(seq, d) * 0.02)
        # No biases: the attention key bias gets a gradient that is pure rounding noise, which Adam
        # normalises into full-size steps, so no two implementations agree on it.
        layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True,
                                                 bias=False)
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, tokens):
        return self.head(self.blocks(self.embed(tokens) + self.pos[: tokens.shape[1]]))


def make_model(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return TinyTransformer().to(DEVICE, dtype)


def batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 61, (4, 12), generator=g).to(DEVICE) for _ in range(n)]


def loss_of(model, tokens):
    logits = model(tokens[:, :-1]).float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             tokens[:, 1:].reshape(-1))


def train(model, opt, data, *, after_backward=None, scheduler=None):
    for tokens in data:
        loss_of(model, tokens).backward()
        if after_backward is not None:
            after_backward(model, opt)
        opt.step()
        opt.zero_grad()
        if scheduler is not None:
            scheduler.step()


def max_rel_diff(a_model, b_model):
    worst = 0.0
    for a, b in zip(a_model.parameters(), b_model.parameters()):
        scale = b.detach().float().abs().max().item() or 1.0
        worst = max(worst, (a.detach().float() - b.detach().float()).abs().max().item() / scale)
    return worst


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("kind", ["AdamW", "Adam"])
def test_fp32_model_matches_torch_under_every_placement(placement, kind):
    ours, ref = make_model(), make_model()
    wd = 0.1 if kind == "AdamW" else 0.01
    opt = getattr(tt, kind)(ours.parameters(), lr=3e-3, weight_decay=wd, subgroup_size=3000,
                            placement=placement)
    ref_opt = getattr(torch.optim, kind)(ref.parameters(), lr=3e-3, weight_decay=wd)
    data = batches(50)
    train(ours, opt, data)
    train(ref, ref_opt, data)
    assert max_rel_diff(ours, ref) < 1e-5
    plan = opt.last_plan
    assert plan["gpu_subgroups"] + plan["cpu_subgroups"] == len(plan["devices"]) > 4
    if placement == "cpu":
        assert plan["gpu_subgroups"] == 0
    if placement == "gpu":
        assert plan["cpu_subgroups"] == 0
    if placement == 2:
        assert plan["gpu_subgroups"] == math.ceil(len(plan["devices"]) / 2)


def test_bf16_model_is_bf16_rounding_of_fp32_master_weights():
    """The reference keeps fp32 master weights, updated by torch.optim.AdamW with the same bf16
    gradients, and the model must be their bf16 rounding at every step (within one bf16 ulp: a
    master weight 1e-7 away from a rounding boundary may round the other way)."""
    ours = make_model(torch.bfloat16)
    opt = tt.AdamW(ours.parameters(), lr=1e-3, weight_decay=0.1, subgroup_size=3000,
                   placement=2)
    masters = [p.detach().float().clone().requires_grad_(True) for p in ours.parameters()]
    ref_opt = torch.optim.AdamW(masters, lr=1e-3, weight_decay=0.1)
    for tokens in batches(20):
        loss_of(ours, tokens).backward()
        for m, p in zip(masters, ours.parameters()):
            m.grad = p.grad.float()
        opt.step()
        opt.zero_grad()
        ref_opt.step()
        for p, m in zip(ours.parameters(), masters):
            rounded = m.detach().to(torch.bfloat16).float()
            ulp = torch.pow(2.0, torch.floor(torch.log2(m.detach().abs().clamp_min(1e-30))) - 7)
            off = (p.detach().float() - rounded).abs()
            assert (off <= ulp).all()
            assert (off > 0).float().mean() < 1e-3  # boundary cases only
    saved = opt.state_dict()["state"]
    for index, m in enumerate(masters):
        master = saved[index]["master_param"]
        assert master.dtype == torch.float32
        assert torch.allclose(master, m.detach().cpu(), rtol=1e-5, atol=1e-7)
        assert torch.allclose(saved[index]["exp_avg"], ref_opt.state[m]["exp_avg"],
                              rtol=1e-5, atol=1e-9)


def test_checkpoint_moves_between_tide_and_torch_both_ways():
    data = batches(20)
    straight = make_model()
    train(straight, torch.optim.AdamW(straight.parameters(), lr=3e-3), data)

    # tide for 10 steps, saved; continued by a fresh tide optimizer and by torch's.
    first = make_model()
    opt = tt.AdamW(first.parameters(), lr=3e-3, subgroup_size=2500, placement=2)
    train(first, opt, data[:10])
    saved = copy.deepcopy(opt.state_dict())
    model_saved = copy.deepcopy(first.state_dict())
    assert set(saved["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}  # fp32: no master copy
    assert saved["state"][0]["exp_avg"].shape == next(first.parameters()).shape
    assert saved["param_groups"][0]["params"] == list(range(len(list(first.parameters()))))

    for continue_with in ("tide", "torch"):
        model = make_model(seed=5)  # different weights: the load must bring them
        model.load_state_dict(model_saved)
        if continue_with == "tide":
            resumed = tt.AdamW(model.parameters(), lr=1.0, placement="auto", subgroup_size=4000)
        else:
            resumed = torch.optim.AdamW(model.parameters(), lr=1.0)
        resumed.load_state_dict(saved)
        assert resumed.param_groups[0]["lr"] == 3e-3
        train(model, resumed, data[10:])
        assert max_rel_diff(model, straight) < 1e-5, continue_with

    # torch for 10 steps, saved; continued by tide.
    torch_first = make_model()
    torch_opt = torch.optim.AdamW(torch_first.parameters(), lr=3e-3)
    train(torch_first, torch_opt, data[:10])
    model = make_model(seed=7)
    model.load_state_dict(torch_first.state_dict())
    resumed = tt.AdamW(model.parameters(), subgroup_size=2500, placement=2)
    resumed.load_state_dict(torch_opt.state_dict())
    train(model, resumed, data[10:])
    assert max_rel_diff(model, straight) < 1e-5


def test_param_groups_and_lr_scheduler():
    ours, ref = make_model(), make_model()

    def groups(model):
        decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
        return [{"params": decay, "weight_decay": 0.2},
                {"params": no_decay, "weight_decay": 0.0, "lr": 1e-3}]

    opt = tt.AdamW(groups(ours), lr=5e-3, subgroup_size=2000, placement=2)
    ref_opt = torch.optim.AdamW(groups(ref), lr=5e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[5e-3, 1e-3], total_steps=30)
    ref_sched = torch.optim.lr_scheduler.OneCycleLR(ref_opt, max_lr=[5e-3, 1e-3], total_steps=30)
    data = batches(30)
    train(ours, opt, data, scheduler=sched)
    train(ref, ref_opt, data, scheduler=ref_sched)
    assert opt.param_groups[1]["lr"] == ref_opt.param_groups[1]["lr"]
    assert max_rel_diff(ours, ref) < 1e-5


def test_tensor_lr_and_maximize():
    ours, ref = make_model(), make_model()
    opt = tt.AdamW(ours.parameters(), lr=torch.tensor(2e-3), maximize=True, subgroup_size=3000)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=torch.tensor(2e-3), maximize=True)
    data = batches(10)
    train(ours, opt, data)
    train(ref, ref_opt, data)
    assert max_rel_diff(ours, ref) < 1e-5


@pytest.mark.parametrize("how", ["tide", "torch"])
def test_gradient_clipping(how):
    ours, ref = make_model(), make_model()
    opt = tt.AdamW(ours.parameters(), lr=3e-3, subgroup_size=3000, placement=2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=3e-3)
    norms = []

    def clip_ours(model, o):
        if how == "tide":
            norms.append(o.clip_grad_norm_(0.5))
        else:  # changes the gradients after their offload: tide must notice
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)))

    ref_norms = []

    def clip_ref(model, o):
        ref_norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)))

    data = batches(15)
    train(ours, opt, data, after_backward=clip_ours)
    train(ref, ref_opt, data, after_backward=clip_ref)
    assert norms == pytest.approx(ref_norms, rel=1e-4)
    assert max(ref_norms) > 0.5  # the clipping did something
    assert max_rel_diff(ours, ref) < 1e-5


def test_grad_scaler_skips_a_step_on_inf_and_unscales_otherwise():
    device = "cuda" if DEVICE == "cuda" else "cpu"
    ours, ref = make_model(), make_model()
    opt = tt.AdamW(ours.parameters(), lr=3e-3, subgroup_size=3000, placement=2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=3e-3)
    scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 10)
    ref_scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 10)
    data = batches(12)
    for step, tokens in enumerate(data):
        for model, o, s in ((ours, opt, scaler), (ref, ref_opt, ref_scaler)):
            loss = loss_of(model, tokens)
            if step == 5:
                loss = loss * float("inf")  # every gradient non-finite: the step is skipped
            s.scale(loss).backward()
            s.step(o)
            s.update()
            o.zero_grad()
        if step == 5:
            assert opt.last_plan["skipped"]
            assert scaler.get_scale() == ref_scaler.get_scale() == 2.0 ** 9
    assert not opt.last_plan["skipped"]
    assert max_rel_diff(ours, ref) < 1e-5


def test_grad_scaler_with_unscale_and_clipping():
    device = "cuda" if DEVICE == "cuda" else "cpu"
    ours, ref = make_model(), make_model()
    opt = tt.AdamW(ours.parameters(), lr=3e-3, subgroup_size=3000, placement=2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=3e-3)
    for model, o in ((ours, opt), (ref, ref_opt)):
        scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 8)
        for tokens in batches(8):
            scaler.scale(loss_of(model, tokens)).backward()
            scaler.unscale_(o)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            scaler.step(o)
            scaler.update()
            o.zero_grad()
    assert max_rel_diff(ours, ref) < 1e-5


def test_parameters_without_gradients_are_left_alone():
    """A parameter that gets no gradient (unused this step) is not updated, its moments not
    decayed, as with torch, even when it shares a subgroup with parameters that are. (Its step
    count stays behind, but the bias correction uses its bucket's step count: a known
    difference from torch, which counts per parameter.)"""
    ours, ref = make_model(), make_model()
    opt = tt.AdamW(ours.parameters(), lr=3e-3, subgroup_size=1 << 20)  # one subgroup
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=3e-3)
    data = batches(2)
    train(ours, opt, data[:1])
    train(ref, ref_opt, data[:1])
    before = ours.head.bias.detach().clone()
    moments = opt.state_dict()["state"]
    bias_index = [n for n, _ in ours.named_parameters()].index("head.bias")
    for model, o in ((ours, opt), (ref, ref_opt)):
        loss_of(model, data[1]).backward()
        model.head.bias.grad = None
        o.step()
        o.zero_grad()
    assert torch.equal(ours.head.bias.detach(), before)
    after = opt.state_dict()["state"][bias_index]
    assert torch.equal(after["exp_avg"], moments[bias_index]["exp_avg"])
    assert torch.equal(after["exp_avg_sq"], moments[bias_index]["exp_avg_sq"])
    assert max_rel_diff(ours, ref) < 1e-5  # every other parameter as torch's
    assert int(opt.state[ours.head.bias]["step"]) == 1
    assert int(opt.state[ours.head.weight]["step"]) == 2


def test_parameters_written_from_outside_are_picked_up():
    """model.load_state_dict after creating the optimizer: the master weights follow."""
    ours, ref = make_model(), make_model(seed=3)
    opt = tt.AdamW(ours.parameters(), lr=3e-3, subgroup_size=3000)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=3e-3)
    ours.load_state_dict(ref.state_dict())
    data = batches(5)
    train(ours, opt, data)
    train(ref, ref_opt, data)
    assert max_rel_diff(ours, ref) < 1e-5


def test_autocast_bf16_training_matches_torch():
    """fp32 parameters under torch.autocast(bfloat16): fp32 gradients, offloaded as such."""
    ours, ref = make_model(), make_model()
    opt = tt.AdamW(ours.parameters(), lr=3e-3, subgroup_size=3000, placement=2, threads=1)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=3e-3)
    for model, o in ((ours, opt), (ref, ref_opt)):
        for tokens in batches(10):
            with torch.autocast(DEVICE, dtype=torch.bfloat16):
                loss = loss_of(model, tokens)
            loss.backward()
            assert next(model.parameters()).grad.dtype == torch.float32
            o.step()
            o.zero_grad()
    assert max_rel_diff(ours, ref) < 1e-5


def test_gradient_accumulation_over_micro_batches():
    ours, ref = make_model(), make_model()
    opt = tt.AdamW(ours.parameters(), lr=3e-3, subgroup_size=3000, placement=2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=3e-3)
    data = batches(12)
    for model, o in ((ours, opt), (ref, ref_opt)):
        for i in range(0, 12, 3):
            for tokens in data[i:i + 3]:
                (loss_of(model, tokens) / 3).backward()
            o.step()
            o.zero_grad()
    assert max_rel_diff(ours, ref) < 1e-5


@pytest.mark.skipif(DEVICE == "cuda", reason="counts the stand-in device's bytes in tide's allocator")
def test_gpu_buffers_are_freed_after_the_step_unless_kept():
    """The headroom is what the update phase may use: its buffers must not stay allocated into
    the next forward pass, unless asked for. They come from tide's allocator (its cache), so
    they are counted there."""
    for keep in (False, True):
        model = make_model()
        opt = tt.AdamW(model.parameters(), subgroup_size=3000, placement="gpu", keep_buffers=keep)
        before = tt.memory_allocated(0)
        train(model, opt, batches(2))
        assert opt.last_plan["gpu_subgroups"] > 0
        if keep:
            assert tt.memory_allocated(0) >= before + opt.stats[-1]["buffer_bytes"]
        else:
            assert tt.memory_allocated(0) == before


def test_step_stats_and_closure():
    model = make_model()
    opt = tt.AdamW(model.parameters(), subgroup_size=3000, placement="auto")
    assert opt.last_plan is None
    tokens = batches(1)[0]

    def closure():
        opt.zero_grad()
        loss = loss_of(model, tokens)
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert isinstance(loss, torch.Tensor)
    plan = opt.last_plan
    assert plan["step"] == 1 and not plan["skipped"]
    assert plan["seconds"] > 0 and plan["predicted_seconds"] > 0
    assert plan["t_end_ns"] >= plan["t_start_ns"]
    assert set(plan["devices"]) <= {"gpu", "cpu"}
    assert len(opt.stats) == 1


def test_bad_arguments_and_knobs_are_clear_errors(monkeypatch):
    params = make_model().parameters
    with pytest.raises(ValueError, match="amsgrad"):
        tt.AdamW(params(), amsgrad=True)
    with pytest.raises(ValueError, match="placement"):
        tt.AdamW(params(), placement="sometimes")
    with pytest.raises(ValueError, match="placement K"):
        tt.AdamW(params(), placement=0)
    with pytest.raises(ValueError, match="subgroup_size"):
        tt.AdamW(params(), subgroup_size=0)
    with pytest.raises(ValueError, match="threads"):
        tt.AdamW(params(), threads=0)
    with pytest.raises(ValueError, match="Invalid learning rate"):
        tt.AdamW(params(), lr=-1.0)
    monkeypatch.setenv("TIDE_SUBGROUP_SIZE", "lots")
    with pytest.raises(ValueError, match="TIDE_SUBGROUP_SIZE"):
        tt.AdamW(params())
    monkeypatch.setenv("TIDE_SUBGROUP_SIZE", "4K")
    opt = tt.AdamW(params())
    assert max(opt._buckets[0].sizes) == 4096
    monkeypatch.setenv("TIDE_PLACEMENT", "everywhere")
    model = make_model()
    opt = tt.AdamW(model.parameters())
    loss_of(model, batches(1)[0]).backward()
    with pytest.raises(Exception, match="TIDE_PLACEMENT"):
        opt.step()
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        tt.AdamW([torch.nn.Parameter(torch.zeros(4, dtype=torch.float64, device=DEVICE))])


def test_a_failed_construction_leaves_no_gradient_hooks():
    model = make_model()
    params = list(model.parameters())
    good = params[:-1]
    bad = params[-1].detach().to(torch.float64).requires_grad_(True)
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        tt.AdamW([{"params": good}, {"params": [bad]}])
    assert all(not p._post_accumulate_grad_hooks for p in good)


def test_parameter_memory_moving_is_an_error():
    model = make_model()
    opt = tt.AdamW(model.parameters(), subgroup_size=3000)
    model.head.weight.data = model.head.weight.data.clone()
    loss_of(model, batches(1)[0]).backward()
    with pytest.raises(RuntimeError, match="memory moved"):
        opt.step()


@pytest.mark.gpu
def test_on_a_gpu_the_optimizer_runs_on_cuda_tensors_with_tides_allocator_headroom():
    """`pytest -m gpu`: with a GPU, every test above runs on CUDA tensors; this one checks that
    it is so, and that a bf16 model under `auto` places some subgroups on the GPU."""
    assert DEVICE == "cuda" and not tt.cpu_mode()
    model = make_model(torch.bfloat16)
    opt = tt.AdamW(model.parameters(), lr=1e-3, subgroup_size=3000, placement="auto")
    train(model, opt, batches(5))
    assert next(model.parameters()).is_cuda
    assert opt.last_plan["headroom_bytes"] > 0
    assert opt.last_plan["gpu_subgroups"] > 0

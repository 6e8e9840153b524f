"""opt.state[p] of tide.torch.AdamW as torch.optim.AdamW keeps it: "step", "exp_avg", "exp_avg_sq"
(and "master_param" for low-precision parameters) as CPU tensors over tide's pinned state, read
and written by programs between steps (loggers, state surgery, trainers' resume logic,
torch.distributed.checkpoint), checked against torch.optim.AdamW doing the same.

Parameters inside one subgroup get views of the pinned buffers; parameters across subgroups get
copies kept in step with the state (tide.torch._state). Tests that compare numbers step both
optimizers on the same gradients (nothing amplifies rounding), so the bound is a few float32
roundings, or twice what torch's fused implementation differs from its for-loop one by.
"""

from __future__ import annotations

import copy
import gc
import pickle
import weakref

import pytest

torch = pytest.importorskip("torch")
import tide.torch as tt  # noqa: E402
from torch_reference import REFERENCE  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# 25, 7, 12 and 9 elements in subgroups of 16: the first and the last parameters lie across two
# subgroups, the second and the third inside one.
SHAPES = [(5, 5), (7,), (4, 3), (9,)]
SUBGROUP = 16
ACROSS, WHOLE, WHOLE_TOO = 0, 1, 2


def make_params(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g).to(DEVICE, dtype))
            for shape in SHAPES]


def gradients(step, seed=0):
    g = torch.Generator().manual_seed(1000 * seed + step)
    return [torch.randn(shape, generator=g).to(DEVICE) for shape in SHAPES]


def tide_opt(params, placement="gpu", **options):
    opt = tt.AdamW(params, lr=1e-2, weight_decay=0.1, subgroup_size=SUBGROUP,
                   placement=placement, **options)
    if [tuple(p.shape) for p in opt.param_groups[0]["params"]] == SHAPES:
        pieces = [len(mine) for mine in opt._buckets[0].pieces]
        assert pieces == [2, 1, 1, 2], pieces  # the premise of the tests below
    return opt


def step_with(params, opt, steps):
    for step in steps:
        for p, g in zip(params, gradients(step)):
            p.grad = g.to(p.dtype)
        opt.step()


def stepped(dtype=torch.float32, placement="gpu", steps=1, **options):
    """Parameters and tide's optimizer after `steps` steps."""
    params = make_params(dtype)
    opt = tide_opt(params, placement, **options)
    step_with(params, opt, range(1, steps + 1))
    return params, opt


def torch_opt(params, **options):
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, **(options or REFERENCE))


class SideBySide:
    """tide's AdamW, torch's for-loop AdamW (the reference) and torch's fused AdamW, each on its
    own copy of the same parameters (fp32 masters for torch when the model is bf16), stepped on
    the same gradients."""

    def __init__(self, dtype=torch.float32, placement="gpu", skip=()):
        self.dtype = dtype
        self.ours = make_params(dtype)
        self.opt = tide_opt(self.ours, placement)
        self.copies = {name: [p.detach().float().clone().requires_grad_(True) for p in self.ours]
                       for name in ("reference", "fused")}
        self.torch = {"reference": torch_opt(self.copies["reference"]),
                      "fused": torch_opt(self.copies["fused"], fused=True)}
        self.skip = skip  # parameters without a gradient (at every step)
        self.steps = 0

    def step(self):
        self.steps += 1
        grads = gradients(self.steps)
        for k, g in enumerate(grads):
            has = k not in self.skip
            self.ours[k].grad = g.to(self.dtype) if has else None
            for params in self.copies.values():
                params[k].grad = g.to(self.dtype).float() if has else None
        self.opt.step()
        for o in self.torch.values():
            o.step()

    def surgery(self, edit):
        """`edit(state_of_param_k, k)` on tide's and on both of torch's optimizers."""
        for k, p in enumerate(self.ours):
            if p in self.opt.state:
                edit(self.opt.state[p], k)
        for name, o in self.torch.items():
            for k, p in enumerate(self.copies[name]):
                if p in o.state:
                    edit(o.state[p], k)

    def bound(self, key=None):
        """How far tide's values (weights, or the state under `key`) may be from the
        reference's, relative to the largest: eight float32 roundings, or twice what torch's
        fused differs by."""
        fused = max(relative(a, b) for a, b in zip(self.values("fused", key),
                                                   self.values("reference", key)))
        return max(8 * 2.0 ** -23, 2 * fused)

    def values(self, name, key=None):
        if name == "tide":
            params, o = self.ours, self.opt
        else:
            params, o = self.copies[name], self.torch[name]
        if key is None:
            if name == "tide" and self.dtype != torch.float32:
                return [o.state[p]["master_param"] for p in params]
            return [p.detach() for p in params]
        return [o.state[p][key] for p in params if p in o.state]

    def off(self, key=None):
        return max(relative(a, b) for a, b in zip(self.values("tide", key),
                                                  self.values("reference", key), strict=True))


def relative(a, b):
    a, b = a.detach().float().cpu(), b.detach().float().cpu()
    return float((a - b).abs().max() / (b.abs().max() or 1.0))


# ---- which keys, when ----

def test_entries_appear_at_a_parameters_first_step_with_its_keys_as_in_torch():
    both = SideBySide(skip={2})
    assert len(both.opt.state) == len(both.torch["reference"].state) == 0
    assert not both.opt.state
    both.step()
    theirs = both.torch["reference"].state
    ours = both.opt.state
    assert len(ours) == len(theirs) == 3
    assert [k for k, p in enumerate(both.ours) if p in ours] == \
        [k for k, p in enumerate(both.copies["reference"]) if p in theirs] == [0, 1, 3]
    for p, q in zip(both.ours, both.copies["reference"]):
        if p not in ours:
            continue
        assert list(ours[p]) == list(theirs[q]) == ["step", "exp_avg", "exp_avg_sq"]
        for key, value in ours[p].items():
            assert value.device.type == "cpu" and value.dtype == torch.float32
            assert value.shape == theirs[q][key].shape
        assert float(ours[p]["step"]) == 1.0
    # Iterating opt.state: its parameters, each entry a dict.
    assert all(isinstance(entry, dict) for entry in ours.values())
    assert {id(p) for p in ours} == {id(both.ours[k]) for k in (0, 1, 3)}


def test_low_precision_parameters_also_show_their_master_weights():
    params, opt = stepped(torch.bfloat16)
    for p in params:
        entry = opt.state[p]
        assert list(entry) == ["step", "exp_avg", "exp_avg_sq", "master_param"]
        master = entry["master_param"]
        assert master.dtype == torch.float32 and master.shape == p.shape
        assert torch.equal(master.to(torch.bfloat16), p.detach().cpu())


# ---- reading and writing, against torch ----

@pytest.mark.numerics
@pytest.mark.parametrize("placement", ["cpu", "gpu", 2])
def test_state_surgery_between_steps_matches_torch(placement):
    """Read after each step as torch's; exp_avg halved in place, exp_avg_sq replaced by an
    assigned tensor, between steps on both: the next steps are torch's, and not what they would
    have been without the surgery."""
    both = SideBySide(placement=placement)
    untouched = SideBySide(placement=placement)
    for _ in range(3):
        both.step()
        untouched.step()
        for key in ("exp_avg", "exp_avg_sq"):
            assert both.off(key) <= both.bound(key)

    def edit(state, k):
        state["exp_avg"].mul_(0.5)
        state["exp_avg_sq"] = state["exp_avg_sq"] * 2.0 if k % 2 else state["exp_avg_sq"]

    both.surgery(edit)
    for key in ("exp_avg", "exp_avg_sq"):  # read back before the step, as written
        assert both.off(key) <= both.bound(key)
    for _ in range(3):
        both.step()
        untouched.step()
    assert both.off() <= both.bound()
    for key in ("exp_avg", "exp_avg_sq"):
        assert both.off(key) <= both.bound(key)
    assert max(relative(a, b) for a, b in zip(untouched.values("tide"),
                                              both.values("reference"))) > 100 * both.bound()


@pytest.mark.numerics
@pytest.mark.parametrize("which", [WHOLE, ACROSS], ids=["inside-one-subgroup",
                                                        "across-subgroups"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_tensor_held_across_a_gpu_step_is_the_live_state(which, dtype):
    """A reference taken before a step that runs on the GPU (whose commit moves the state to
    another pinned buffer) shows the state after it, and a write through it is what the next
    step uses."""
    both = SideBySide(dtype, placement="gpu")
    both.step()
    p, q = both.ours[which], both.copies["reference"][which]
    held = {key: both.opt.state[p][key] for key in both.opt.state[p] if key != "step"}
    where = {key: t.data_ptr() for key, t in held.items()}
    both.step()
    assert both.opt.last_plan["cpu_subgroups"] == 0
    if which == WHOLE:  # a view, re-pointed to where the GPU's commit put the state
        assert all(held[key].data_ptr() != where[key] for key in held)
    saved = both.opt.state_dict()["state"][which]
    for key, tensor in held.items():
        assert tensor is both.opt.state[p][key]
        assert torch.equal(tensor, saved[key])
    theirs = both.torch["reference"].state[q]
    assert relative(held["exp_avg"], theirs["exp_avg"]) <= both.bound("exp_avg")

    held["exp_avg"].mul_(0.5)
    theirs["exp_avg"].mul_(0.5)
    both.torch["fused"].state[both.copies["fused"][which]]["exp_avg"].mul_(0.5)
    if dtype != torch.float32:  # the master weights too: moved by a tenth of their value
        held["master_param"].mul_(0.9)
        for name in ("reference", "fused"):
            with torch.no_grad():
                both.copies[name][which].mul_(0.9)
    both.step()
    assert relative(held["exp_avg"], theirs["exp_avg"]) <= both.bound("exp_avg")
    assert both.off() <= both.bound()
    if dtype != torch.float32:
        assert torch.equal(held["master_param"].to(dtype), p.detach().cpu())


def test_a_parameter_without_a_gradient_keeps_its_state_through_a_gpu_step():
    """The frozen slices: its tensors, written before the step, read the same after it, and its
    step count stays, while the other parameters of its subgroups move on."""
    both = SideBySide(placement="gpu")
    both.step()
    both.skip = {WHOLE, ACROSS}
    held = {k: both.opt.state[both.ours[k]]["exp_avg"] for k in (WHOLE, ACROSS)}
    for tensor in held.values():
        tensor.fill_(0.25)
    moving = both.opt.state[both.ours[WHOLE_TOO]]["exp_avg"]
    before = (moving.clone(), moving.data_ptr())
    both.step()
    assert moving.data_ptr() != before[1]  # its subgroup moved on the GPU
    assert not torch.equal(moving, before[0])
    assert float(both.opt.state[both.ours[WHOLE_TOO]]["step"]) == 2.0
    for k, tensor in held.items():
        assert torch.equal(tensor, torch.full_like(tensor, 0.25))
        assert torch.equal(both.opt.state_dict()["state"][k]["exp_avg"], tensor)
        assert float(both.opt.state[both.ours[k]]["step"]) == 1.0


@pytest.mark.numerics
@pytest.mark.parametrize("placement,which", [("cpu", WHOLE), ("cpu", ACROSS), ("gpu", ACROSS),
                                             (2, ACROSS), ("gpu", WHOLE), (2, WHOLE)])
def test_views_derived_from_the_state_show_it_and_take_writes_through_data(placement, which):
    """Tensors derived from opt.state's tensors after step 1, as DeepSpeed's
    safe_get/set_full_optimizer_state take them (a narrow view, kept; written through `.data`,
    which no version counter sees), or through detach() (which holds the storage, not the
    tensor), show the state after step 3, and what is written through them is what the next
    step uses: views of the state wherever its subgroup is updated (on the GPU its slot moves at
    every step, and the memory under the views' storage moves with it); copies kept and refreshed
    for a parameter across subgroups, wherever updated."""
    from tide.torch import _bucket

    if not _bucket._SWAP and which == WHOLE and placement != "cpu":
        pytest.skip(f"torch {torch.__version__} has no UntypedStorage._swap_data_ptr_: tensors "
                    "derived from a GPU-updated subgroup's state stay behind, as "
                    "docs/guide/optimizer.md says (test_without_the_storage_swap_...)")
    both = SideBySide(placement=placement)
    both.step()
    p = both.ours[which]
    n = p.numel()
    derived = {"exp_avg": both.opt.state[p]["exp_avg"].view(-1).narrow(0, 1, n - 1),
               "exp_avg_sq": both.opt.state[p]["exp_avg_sq"].detach().view(-1)[1:]}
    both.step()
    both.step()
    saved = both.opt.state_dict()["state"][which]
    for key, view in derived.items():
        # Failed on an H200 with torch 2.11 for ("gpu", WHOLE) only: the message says whether
        # that torch could move the views' storage (_swap_data_ptr_) with the slot.
        assert torch.equal(view, saved[key].view(-1)[1:]), (
            f"{key}; torch {torch.__version__}, storage swap available: {_bucket._SWAP}")
    derived["exp_avg"].data.copy_(derived["exp_avg"] * 0.5)
    for name, o in both.torch.items():
        o.state[both.copies[name][which]]["exp_avg"].view(-1)[1:].mul_(0.5)
    both.step()
    assert torch.equal(derived["exp_avg"],
                       both.opt.state_dict()["state"][which]["exp_avg"].view(-1)[1:])
    assert both.off("exp_avg") <= both.bound("exp_avg")
    assert both.off() <= both.bound()


@pytest.mark.numerics
def test_without_the_storage_swap_the_entrys_own_tensors_follow_the_state(monkeypatch):
    """On a torch without UntypedStorage._swap_data_ptr_ (the H200's torch 2.11 may be one),
    what docs/guide/optimizer.md promises there: the entry's own tensors, held across steps, are
    re-pointed to where a GPU step left the state, and what is written through them counts."""
    from tide.torch import _bucket

    monkeypatch.setattr(_bucket, "_SWAP", False)
    both = SideBySide(placement="gpu")
    both.step()
    p = both.ours[WHOLE]
    held = {key: both.opt.state[p][key] for key in ("exp_avg", "exp_avg_sq")}
    both.step()
    both.step()
    saved = both.opt.state_dict()["state"][WHOLE]
    for key, t in held.items():
        assert torch.equal(t, saved[key]), key
    held["exp_avg"].mul_(0.5)
    for name, o in both.torch.items():
        o.state[both.copies[name][WHOLE]]["exp_avg"].mul_(0.5)
    both.step()
    assert torch.equal(held["exp_avg"], both.opt.state_dict()["state"][WHOLE]["exp_avg"])
    assert both.off() <= both.bound()


def test_copies_of_a_parameter_across_subgroups_cost_nothing_unless_used():
    """Read through the entry, they are the state; written, the next step takes them; not held
    after a step, they are let go and made again when read."""
    params = make_params()
    opt = tide_opt(params, placement=2)
    p = params[ACROSS]
    for step in (1, 2):
        step_with(params, opt, [step])
        entry = opt.state[p]
        assert dict.__getitem__(entry, "exp_avg").numel() == 0  # nothing made until read
        assert torch.equal(entry["exp_avg"], opt.state_dict()["state"][ACROSS]["exp_avg"])
        assert torch.equal(dict(entry)["exp_avg_sq"],
                           opt.state_dict()["state"][ACROSS]["exp_avg_sq"])
    entry["exp_avg"].fill_(0.5)
    assert torch.equal(opt.state_dict()["state"][ACROSS]["exp_avg"],
                       torch.full(p.shape, 0.5))


def test_entries_copy_pickle_and_print_as_plain_dicts():
    params, opt = stepped()
    saved = opt.state_dict()["state"]
    for k, p in enumerate(params):
        entry = opt.state[p]
        for plain in (dict(entry), {**entry}, entry.copy(), copy.deepcopy(entry),
                      pickle.loads(pickle.dumps(entry))):
            assert type(plain) is dict and list(plain) == list(saved[k])
            assert all(torch.equal(plain[key], saved[k][key]) for key in plain)
        assert "exp_avg" in repr(entry)


# ---- what programs do to opt.state ----

def test_assigned_replaced_and_removed_entries():
    """Lightning's state moves assign each tensor (`v[key] = v[key].to(device)`): taken as
    written. An entry replaced by another dict is loaded; one removed starts again from zero
    moments, as torch's would (its first moment is then (1 - beta1) * the gradient)."""
    both = SideBySide(placement=2)
    both.step()
    for p, entry in both.opt.state.items():
        for key, value in entry.items():
            if key != "step":
                entry[key] = value.clone()  # another tensor, the same values
    replaced = both.ours[3]
    both.opt.state[replaced] = {key: value.clone() for key, value in
                                both.opt.state[replaced].items()}
    both.step()
    assert both.off() <= both.bound()
    assert both.off("exp_avg") <= both.bound("exp_avg")
    assert float(both.opt.state[replaced]["step"]) == 2.0

    removed = both.ours[WHOLE]
    del both.opt.state[removed]
    grads = gradients(both.steps + 1)
    both.step()
    entry = both.opt.state[removed]
    assert float(entry["step"]) == 1.0
    g = grads[WHOLE].cpu()
    assert torch.allclose(entry["exp_avg"], 0.1 * g, rtol=1e-6, atol=0)
    assert torch.allclose(entry["exp_avg_sq"], 0.001 * g ** 2, rtol=1e-6, atol=0)


def test_a_value_the_state_cannot_take_fails_the_step_before_anything_changed():
    params, opt = stepped()
    before = copy.deepcopy(opt.state_dict())
    weights = [p.detach().clone() for p in params]
    opt.state[params[0]]["exp_avg"].fill_(7.0)  # a write that a later error must not lose
    opt.state[params[WHOLE]]["exp_avg"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"'exp_avg' has shape \(3,\), the parameter \(7,\)"):
        opt.step()
    assert all(torch.equal(p.detach(), w) for p, w in zip(params, weights))
    assert float(opt.state[params[0]]["step"]) == 1.0
    opt.state[params[WHOLE]]["exp_avg"] = before["state"][WHOLE]["exp_avg"]
    opt.step()
    assert float(opt.state[params[0]]["step"]) == 2.0


def test_step_counts_as_the_program_left_them_among_untouched_entries():
    """A step takes only what the program did to opt.state and leaves the rest as it is: a step
    count given as a number, a key deleted, a step count the program put there as a tensor of
    its own (another dtype), each beside untouched entries, and a frozen parameter (no
    gradient) whose count stays. A step count of two elements is refused before anything
    changed."""
    params, opt = stepped()
    opt.state[params[WHOLE]]["step"] = 5
    del opt.state[params[WHOLE_TOO]]["exp_avg"]
    own = torch.tensor(9.0, dtype=torch.float64)
    opt.state[params[ACROSS]]["step"] = own
    moments = opt.state[params[WHOLE_TOO]]["exp_avg_sq"].clone()
    for p, g in zip(params, gradients(2)):
        p.grad = None if p is params[-1] else g
    opt.step()
    counts = [opt.state[p]["step"] for p in params]
    assert [float(c) for c in counts] == [10.0, 6.0, 2.0, 1.0]
    assert counts[ACROSS] is own and own.dtype == torch.float64  # counted in place
    assert counts[WHOLE].dtype == torch.float32 and counts[WHOLE].dim() == 0
    assert "exp_avg" in opt.state[params[WHOLE_TOO]]  # the state's own tensor, back
    assert not torch.equal(opt.state[params[WHOLE_TOO]]["exp_avg_sq"], moments)  # stepped
    opt.state[params[WHOLE]]["step"] = torch.tensor([6.0, 6.0])
    weights = [p.detach().clone() for p in params]
    for p, g in zip(params, gradients(3)):
        p.grad = g
    with pytest.raises(ValueError, match="'step' must be a number or a 1-element tensor"):
        opt.step()
    assert all(torch.equal(p.detach(), w) for p, w in zip(params, weights))
    assert [float(opt.state[p]["step"]) for p in params if p is not params[WHOLE]] == \
        [10.0, 2.0, 1.0]


# ---- checkpoints ----

# bf16 moments: opt.state's tensors are fp32 copies, held ones refreshed; the state dict's upcast
# moments round-trip exactly.
STATE_DTYPES = pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16],
                                       ids=["fp32-moments", "bf16-moments"])


@STATE_DTYPES
def test_state_dict_round_trips_unchanged_and_loads_into_held_tensors(state_dtype):
    params, opt = stepped(torch.bfloat16, placement=2, steps=2, state_dtype=state_dtype)
    saved = copy.deepcopy(opt.state_dict())
    other = tide_opt(make_params(torch.bfloat16), placement="cpu", state_dtype=state_dtype)
    for p, q in zip(other.param_groups[0]["params"], params):
        with torch.no_grad():
            p.copy_(q)
    other.load_state_dict(saved)
    again = other.state_dict()
    assert again["param_groups"] == saved["param_groups"]
    assert again["state"].keys() == saved["state"].keys()
    for k, entry in saved["state"].items():
        assert again["state"][k].keys() == entry.keys()
        assert all(torch.equal(again["state"][k][key], entry[key]) for key in entry)
    # A tensor held before a load shows the loaded state.
    held = opt.state[params[WHOLE]]["exp_avg"]
    weights = [p.detach().clone() for p in params]
    step_with(params, opt, [3])
    with torch.no_grad():
        for p, w in zip(params, weights):
            p.copy_(w)
    opt.load_state_dict(saved)
    assert torch.equal(held, saved["state"][WHOLE]["exp_avg"])


@STATE_DTYPES
def test_trainer_like_resume_from_a_file(tmp_path, state_dtype):
    """Save model and optimizer, build both again, load, go on: bit for bit the run that never
    stopped, and opt.state reads what was saved."""
    straight_params, _ = stepped(placement=2, steps=6, state_dtype=state_dtype)
    params, opt = stepped(placement=2, steps=3, state_dtype=state_dtype)
    torch.save({"model": [p.detach() for p in params], "optimizer": opt.state_dict()},
               tmp_path / "checkpoint.pt")
    checkpoint = torch.load(tmp_path / "checkpoint.pt")
    resumed_params = make_params(seed=9)
    with torch.no_grad():
        for p, saved in zip(resumed_params, checkpoint["model"]):
            p.copy_(saved)
    resumed = tide_opt(resumed_params, placement=2, state_dtype=state_dtype)
    resumed.load_state_dict(checkpoint["optimizer"])
    for k, p in enumerate(resumed_params):
        assert torch.equal(resumed.state[p]["exp_avg"],
                           checkpoint["optimizer"]["state"][k]["exp_avg"])
    step_with(resumed_params, resumed, range(4, 7))
    assert all(torch.equal(a, b) for a, b in zip(resumed_params, straight_params))


def test_torch_distributed_checkpoint_state_dict_functions():
    """get_optimizer_state_dict / set_optimizer_state_dict (one process, no process group):
    keyed by parameter names, equal to torch's layout, and a resumed run bit for bit the one
    that never stopped. On an optimizer without state, DCP makes it with a zero-gradient step
    at lr 0, as it does for torch's."""
    dcp = pytest.importorskip("torch.distributed.checkpoint.state_dict")

    def model_of(seed):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3)).to(DEVICE)

    def run(model, opt, steps):
        for step in steps:
            g = torch.Generator().manual_seed(step)
            x = torch.randn(4, 6, generator=g).to(DEVICE)
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()

    fresh = model_of(0)
    fresh_opt = tide_opt(fresh.parameters())
    fresh_ref = model_of(0)
    fresh_torch = torch_opt(fresh_ref.parameters())
    ours, theirs = (dcp.get_optimizer_state_dict(fresh, fresh_opt),
                    dcp.get_optimizer_state_dict(fresh_ref, fresh_torch))
    assert ours["state"].keys() == theirs["state"].keys() == {
        "0.weight", "0.bias", "1.weight", "1.bias"}
    for name, entry in theirs["state"].items():
        assert ours["state"][name].keys() == entry.keys()
        assert all(torch.equal(ours["state"][name][key].cpu(), entry[key].cpu())
                   for key in entry)
    assert [g["params"] for g in ours["param_groups"]] == \
        [g["params"] for g in theirs["param_groups"]]

    straight = model_of(1)
    run(straight, tide_opt(straight.parameters()), range(6))
    model = model_of(1)
    opt = tide_opt(model.parameters())
    run(model, opt, range(3))
    saved = copy.deepcopy(dcp.get_optimizer_state_dict(model, opt))
    assert torch.equal(saved["state"]["1.weight"]["exp_avg"],
                       opt.state[model[1].weight]["exp_avg"])
    resumed_opt = tide_opt(model.parameters())
    dcp.set_optimizer_state_dict(model, resumed_opt, saved)
    for name, p in model.named_parameters():
        assert torch.equal(resumed_opt.state[p]["exp_avg_sq"], saved["state"][name]["exp_avg_sq"])
    del opt
    gc.collect()  # its gradient hooks go with it
    run(model, resumed_opt, range(3, 6))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), straight.parameters()))


# ---- lifetime ----

def test_a_deleted_optimizer_is_freed():
    """The gradient hooks held the optimizer and the optimizer's finalizer held the parameters:
    no tide optimizer was ever freed before the process ended, nor its pinned memory."""
    params, opt = stepped()
    natives = [bucket.executor.native for bucket in opt._buckets]
    gone = weakref.ref(opt)
    del opt
    gc.collect()
    assert gone() is None
    assert all(native.destroyed for native in natives)
    for p in params:
        assert not p._post_accumulate_grad_hooks


def test_tensors_kept_after_the_optimizer_is_gone_keep_its_memory():
    """A view of the pinned state (or a tensor derived from it) outliving the optimizer keeps
    the executor's memory allocated, with the last values; it is freed with the last such
    tensor."""
    params, opt = stepped()
    view = opt.state[params[WHOLE]]["exp_avg_sq"]
    derived = opt.state[params[WHOLE_TOO]]["exp_avg"][2:5]
    values = (view.clone(), derived.clone())
    native = opt._buckets[0].executor.native
    del opt
    gc.collect()
    assert not native.destroyed and native.views == 2
    assert torch.equal(view, values[0]) and torch.equal(derived, values[1])
    del view
    gc.collect()
    assert not native.destroyed
    del derived
    gc.collect()
    assert native.destroyed and native.views == 0


def test_copies_count_as_shared_without_torchs_storage_use_count(monkeypatch):
    """_state asks a private torch function whether views share a copy's storage; a torch without
    it must keep every copy in step (never wrong, only slower), not fail at import or miss one."""
    from tide.torch import _state

    lone = torch.zeros(4)
    viewed = torch.zeros(4)
    view = viewed[1:]  # noqa: F841 (holds the storage)
    assert not _state._shared(lone) and _state._shared(viewed)
    monkeypatch.delattr(torch._C, "_storage_Use_Count")
    assert _state._shared(lone) and _state._shared(viewed)

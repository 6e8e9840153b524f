"""tide.torch.AdamW against inputs that must be refused, cleanly and before anything changes: a
parameter resized in place, state dicts that do not fit, hyperparameters of the wrong type or
range, a TIDE_* value or a TIDE_LIBRARY that is wrong.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import tide.torch as tt  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def two_layers(seed=0, shapes=((8, 6), (6, 4))):  # weights (6, 8) and (4, 6)
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[torch.nn.Linear(a, b, bias=False) for a, b in shapes]).to(DEVICE)


def train_step(model, opt):
    opt.zero_grad()
    model(torch.randn(5, model[0].in_features, device=DEVICE)).square().mean().backward()
    opt.step()


def snapshot(model, opt):
    weights = [p.detach().clone() for p in model.parameters()]
    state = {i: {k: v.clone() for k, v in e.items()} for i, e in opt.state_dict()["state"].items()}
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    return weights, state, groups


def same(a, b):
    (wa, sa, ga), (wb, sb, gb) = a, b
    return (all(torch.equal(x, y) for x, y in zip(wa, wb)) and sa.keys() == sb.keys()
            and all(sa[i].keys() == sb[i].keys() and all(torch.equal(sa[i][k], sb[i][k])
                                                         for k in sa[i]) for i in sa)
            and ga == gb)


# ---- a parameter resized in place (item 4) ----

def test_a_parameter_shrunk_in_place_is_refused_before_anything_is_read_or_written(repo):
    """`p.data = p.data[:1]` keeps the data pointer: tide used to read its gradient and write
    its weights as if it still had 2^20 elements (a crash). Run apart: a crash fails the test."""
    code = f"""
import torch, tide.torch as tt
big = torch.nn.Parameter(torch.randn(1 << 20, device={DEVICE!r}))
small = torch.nn.Parameter(torch.randn(100, device={DEVICE!r}))
opt = tt.AdamW([big, small], subgroup_size=1 << 16)
(big.sum() + small.square().sum()).backward()
opt.step()
opt.zero_grad()
before = small.detach().clone()
pointer = big.data_ptr()
big.data = big.data[:1]
assert big.data_ptr() == pointer
(big.sum() + small.square().sum()).backward()
try:
    opt.step()
    print("no error")
except RuntimeError as error:
    print("refused:", error)
assert torch.equal(small.detach(), before)
"""
    env = dict(os.environ, PYTHONPATH=str(repo / "python"))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "refused: tide: a parameter changed since the optimizer was created" in result.stdout
    assert "(1048576,)" in result.stdout and "(1,)" in result.stdout


# ---- load_state_dict (item 5) ----

def test_a_state_dict_of_another_models_shapes_is_refused_and_changes_nothing():
    ours = two_layers()
    opt = tt.AdamW(ours.parameters(), lr=1e-3, betas=(0.9, 0.99))
    train_step(ours, opt)
    # The same number of parameters, other shapes.
    other = [torch.nn.Parameter(torch.randn(6, 8)), torch.nn.Parameter(torch.randn(6, 4))]
    other_opt = torch.optim.AdamW(other, lr=5e-2, betas=(0.5, 0.6))
    for p in other:
        p.grad = torch.ones_like(p)
    other_opt.step()
    before = snapshot(ours, opt)
    with pytest.raises(ValueError, match=r"exp_avg of parameter 1 of param group 0 \(shape "
                                         r"\(4, 6\)\) has shape \(6, 4\): the state dict is "
                                         r"another model's"):
        opt.load_state_dict(other_opt.state_dict())
    assert same(snapshot(ours, opt), before)  # not even lr or betas
    train_step(ours, opt)  # and it still trains


def test_another_optimizers_state_dict_is_refused_and_changes_nothing():
    ours = two_layers()
    opt = tt.AdamW(ours.parameters())
    train_step(ours, opt)
    sgd = torch.optim.SGD(two_layers().parameters(), lr=0.1, momentum=0.9)
    before = snapshot(ours, opt)
    with pytest.raises(ValueError, match="no 'betas': it is not an Adam/AdamW state dict"):
        opt.load_state_dict(sgd.state_dict())
    assert same(snapshot(ours, opt), before)
    # An Adam-shaped group with another optimizer's state.
    forged = opt.state_dict()
    forged["state"][0]["momentum_buffer"] = torch.zeros(6, 8)
    with pytest.raises(ValueError, match="'momentum_buffer', which Adam/AdamW state has not"):
        opt.load_state_dict(forged)
    assert same(snapshot(ours, opt), before)


@pytest.mark.parametrize("damage, message", [
    (lambda e: e["exp_avg"].view(-1).__setitem__(3, float("nan")), "exp_avg of parameter 0 .* "
                                                                   "non-finite"),
    (lambda e: e["exp_avg_sq"].view(-1).__setitem__(0, -1.0), "exp_avg_sq of parameter 0 .* "
                                                              "negative"),
    (lambda e: e.__setitem__("step", torch.tensor(-3.0)), "step of parameter 0 .* is -3.0"),
    (lambda e: e.__setitem__("step", torch.tensor(float("inf"))), "step of parameter 0 .* inf"),
    (lambda e: e.__setitem__("step", torch.tensor(2.5)), "step of parameter 0 .* whole number"),
])
def test_non_finite_or_negative_saved_state_is_refused_naming_the_parameter(damage, message):
    ours = two_layers()
    opt = tt.AdamW(ours.parameters())
    train_step(ours, opt)
    saved = opt.state_dict()
    damage(saved["state"][0])
    before = snapshot(ours, opt)
    with pytest.raises(ValueError, match=message):
        opt.load_state_dict(saved)
    assert same(snapshot(ours, opt), before)


# ---- hyperparameters (item 9) ----

@pytest.mark.parametrize("kwargs, error, message", [
    ({"eps": -1e-8}, ValueError, r"Invalid epsilon value: -1e-08"),
    ({"weight_decay": -0.1}, ValueError, r"Invalid weight_decay value: -0.1"),
    ({"betas": (0.9,)}, ValueError, r"Invalid beta parameters: \(0.9,\)"),
    ({"betas": (0.9, 1.0)}, ValueError, r"Invalid beta parameter at index 1: 1.0"),
    ({"lr": "0.001"}, TypeError, r"learning rate must be a number, got '0.001'"),
    ({"lr": float("nan")}, ValueError, r"learning rate value: nan \(must be finite\)"),
    ({"lr": -1.0}, ValueError, r"Invalid learning rate: -1.0"),
    ({"eps": None}, TypeError, r"epsilon must be a number, got None"),
])
def test_bad_hyperparameters_say_what_was_given(kwargs, error, message):
    with pytest.raises(error, match=message):
        tt.AdamW(two_layers().parameters(), **kwargs)


def test_a_hyperparameter_changed_to_a_bad_value_fails_the_step_before_it_changes_anything():
    ours = two_layers()
    opt = tt.AdamW(ours.parameters())
    train_step(ours, opt)
    opt.param_groups[0]["lr"] = "fast"
    opt.zero_grad()
    ours(torch.randn(5, 8, device=DEVICE)).square().mean().backward()
    before = snapshot(ours, opt)
    with pytest.raises(TypeError, match="learning rate must be a number, got 'fast'"):
        opt.step()
    after = snapshot(ours, opt)
    assert all(torch.equal(x, y) for x, y in zip(before[0], after[0]))
    assert before[1].keys() == after[1].keys()
    opt.param_groups[0]["lr"] = 1e-3
    opt.step()  # the same gradients, now with a good learning rate


# ---- the library and the knobs (item 9) ----

def run_python(repo, code, **env):
    full = dict(os.environ, PYTHONPATH=str(repo / "python"), **env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("which, message", [
    ("text", "cannot be loaded"),
    ("other library", "is not libtide.so (it has no tide_version)"),
])
def test_tide_library_at_a_wrong_file_is_a_tide_error_naming_it(repo, build_dir, which,
                                                                message):
    library = "/etc/hostname" if which == "text" else str(
        build_dir / "lib" / "libtide_standin_cuda.so")
    code = ("import tide\ntry:\n    tide.version()\nexcept tide.TideError as e:\n"
            "    print('TideError:', e)\n")
    result = run_python(repo, code, TIDE_LIBRARY=library)
    assert result.returncode == 0, result.stderr
    assert f"TideError: tide: TIDE_LIBRARY {library} {message}" in result.stdout


def test_a_pinned_arena_knob_out_of_range_is_reported_under_its_name(repo):
    code = ("import torch, tide.torch as tt\n"
            f"try:\n    tt.AdamW([torch.nn.Parameter(torch.zeros(4, device={DEVICE!r}))])\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    result = run_python(repo, code, TIDE_PINNED_CHUNK="1MiB")
    assert 'TIDE_PINNED_CHUNK="1MiB" is not valid: TIDE_PINNED_CHUNK accepts a size from 4MiB ' \
           'to 1TiB' in result.stdout, result.stdout + result.stderr


@pytest.mark.skipif(DEVICE != "cpu", reason="host-resident parameters in CPU mode")
@pytest.mark.parametrize("dtype, kwargs, message", [
    (torch.float32, {"host_params": "yes"}, "host_params='yes'"),
    (torch.bfloat16, {"host_params": True}, "float32"),
    (torch.float32, {"host_params": True, "state_dtype": "q8"}, "moments of float32 or bfloat16"),
])
def test_host_params_it_cannot_honour_are_refused(dtype, kwargs, message):
    """host_params=True steps fp32 parameters in place as their own master weights: a bf16
    parameter is not one, nor do 8-bit moments fit; a value other than None/True/False is not an
    answer. (Automatic, such parameters keep tide's fp32 masters in CPU mode.)"""
    params = [torch.nn.Parameter(torch.ones(4, dtype=dtype))]
    with pytest.raises(ValueError, match=message):
        tt.AdamW(params, **kwargs)
    tt.AdamW(params, state_dtype=kwargs.get("state_dtype"))  # automatic: fine


def test_state_larger_than_the_host_can_give_is_refused_when_the_optimizer_is_made(repo):
    """Host memory is a budget (issue 27): optimizer state beyond what TIDE_HOST_MEMORY_LIMIT, the
    cgroup's limit and MemAvailable leave is refused at construction, saying how much is needed
    and how much there is, instead of the OOM killer ending the job later. Within it, it works."""
    # 2^20 fp32 parameters: 12 MiB of fp32 state at least.
    code = ("import torch, tide.torch as tt\n"
            f"p = torch.nn.Parameter(torch.zeros(1 << 20, device={DEVICE!r}))\n"
            "try:\n    tt.AdamW([p])\n    print('made')\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    refused = run_python(repo, code, TIDE_HOST_MEMORY_LIMIT="8MiB")
    assert refused.returncode == 0, refused.stderr
    out = refused.stdout
    assert "made" not in out, out
    assert "of host memory, and this process can take 8.00 MiB" in out, out
    assert "TIDE_HOST_MEMORY_LIMIT=8.00 MiB" in out and "needs 1" in out, out
    made = run_python(repo, code, TIDE_HOST_MEMORY_LIMIT="1GiB")
    assert made.stdout.strip().endswith("made"), made.stdout + made.stderr

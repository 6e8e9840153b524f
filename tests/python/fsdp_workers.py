"""What each rank runs in test_fsdp: 2 processes over gloo (CPU mode, the stand-in driver), an
FSDP2 model with odd dimensions. Each worker writes what it found to `out/rank{r}.pt` for the test
to check; the test, not the worker, asserts.

The model: Linear(7, 5) (uneven shards: 3 and 2 rows), Linear(5, 3) (2 and 1), Linear(3, 1) (its
[1, 3] weight and [1] bias are empty on rank 1), each its own FSDP unit, and `gain`, a plain
parameter of the root module that FSDP2 does not shard (its gradient is averaged by hand, as DDP
would). scenario_ddp and scenario_ddp_hook_cases train the same model under
DistributedDataParallel instead (test_ddp).
"""

from __future__ import annotations

import ast
import contextlib
import datetime
import multiprocessing
import os
import signal
import socket
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

STEPS = 4
FAULTY = 1  # the rank whose stand-in fails in scenario_fault
KILLED = 1  # the rank SIGKILLed in scenario_killed_*
_kept: list = []
MAX_NORM = 0.5


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a = torch.nn.Linear(7, 5)
        self.b = torch.nn.Linear(5, 3)
        self.head = torch.nn.Linear(3, 1)
        self.gain = torch.nn.Parameter(torch.ones(3))
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)

    def forward(self, x):
        return self.head(torch.tanh(self.b(torch.tanh(self.a(x)))) * self.gain)


def batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's part of step `step`'s global batch (8 rows per rank)."""
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(8 * 2, 7, generator=g), torch.randn(8 * 2, 1, generator=g)
    rows = slice(rank * 8 * 2 // world, (rank + 1) * 8 * 2 // world)
    return x[rows], y[rows]


def sharded(regime: str, *, root: bool = False) -> Net:
    """The model under fully_shard; with `root`, the root module too (then `gain` is sharded:
    GradScaler cannot check plain and DTensor gradients together)."""
    model = Net()
    if regime == "bf16":
        model = model.to(torch.bfloat16)  # bf16 parameters (and shards)
    kwargs = {}
    if regime == "offload":
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=False)  # pinned needs CUDA
    if regime == "mixed":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                   reduce_dtype=torch.float32)
    for unit in (model.a, model.b, model.head) + ((model,) if root else ()):
        fully_shard(unit, **kwargs)
    return model


def groups(model: Net) -> list[dict]:
    decay = [model.a.weight, model.b.weight, model.head.weight]
    return [{"params": decay, "weight_decay": 0.1},
            {"params": [model.a.bias, model.b.bias, model.head.bias, model.gain],
             "weight_decay": 0.0}]


def make_opt(kind: str, model: Net, **tide_options):
    if kind == "torch":
        return torch.optim.AdamW(groups(model), lr=2e-2, foreach=False)
    import tide.torch as tt
    return tt.AdamW(groups(model), lr=2e-2, **tide_options)


def average_plain_grads(model: Net) -> None:
    """The unsharded parameter's gradient, averaged over ranks (FSDP2 leaves it alone)."""
    plain = not isinstance(model.gain, torch.distributed.tensor.DTensor)
    if plain and model.gain.grad is not None and dist.is_initialized():
        dist.all_reduce(model.gain.grad, op=dist.ReduceOp.AVG)


def reference_clip(model: Net, max_norm: float) -> float:
    """torch.nn.utils.clip_grad_norm_'s rule with the global norm over sharded and plain
    gradients (torch's own cannot mix DTensor and plain gradients)."""
    sharded_sq = torch.zeros(1, dtype=torch.float64)
    plain_sq = 0.0
    for p in model.parameters():
        if p.grad is None:
            continue
        if isinstance(p.grad, torch.distributed.tensor.DTensor):
            sharded_sq += p.grad.to_local().double().pow(2).sum()
        else:
            plain_sq += float(p.grad.double().pow(2).sum())
    dist.all_reduce(sharded_sq)
    norm = (float(sharded_sq) + plain_sq) ** 0.5
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0:
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.mul_(coef)
    return norm


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, torch.distributed.tensor.DTensor) else t


def full(model: Net) -> list[torch.Tensor]:
    return [(p.full_tensor() if isinstance(p, torch.distributed.tensor.DTensor) else p)
            .detach().float().clone() for p in model.parameters()]


def train(model: Net, opt, steps: range, rank: int, world: int, *, clip: str = "reference",
          scheduler=None) -> list[float]:
    """Steps `steps` of training; clip "reference" (global norm by hand), "tide"
    (opt.clip_grad_norm_) or "torch" (torch.nn.utils.clip_grad_norm_ on the sharded gradients).
    Returns the norms the clipping saw."""
    norms = []
    for step in steps:
        opt.zero_grad()
        x, y = batch(step, rank, world)
        torch.nn.functional.mse_loss(model(x.to(model.gain.dtype)).float(), y).backward()
        average_plain_grads(model)
        if clip == "tide":
            norms.append(opt.clip_grad_norm_(MAX_NORM))
        elif clip == "torch":
            sharded_params = [p for p in model.parameters() if p is not model.gain]
            norms.append(float(torch.nn.utils.clip_grad_norm_(sharded_params, MAX_NORM)))
        else:
            norms.append(reference_clip(model, MAX_NORM))
        opt.step()
        if scheduler is not None:
            scheduler.step()
    return norms


def scheduled(opt):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))


def init(rank: int, world: int, port: int, timeout_s: float = 60.0) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


def run_example(name: str, out) -> str:
    """examples/NAME.py under torchrun on 2 ranks: a tiny model for 2 steps, its memory
    timeline to `out`; its stdout (it must exit 0)."""
    import subprocess
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         f"{repo}/examples/{name}.py", "--steps", "2", "--layers", "1", "--d-model", "32",
         "--heads", "2", "--seq-len", "16", "--batch", "4", "--out", str(out)],
        cwd=repo, capture_output=True, text=True, timeout=180, check=False,
        env={**os.environ, "PYTHONPATH": f"{repo}/python"})
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(scenario: str, out, world: int = 2, timeout_s: float = 120.0,
           killed: int | None = None) -> list[dict]:
    """Runs `scenario` on `world` processes; returns each rank's result (None for rank `killed`,
    which must die of SIGKILL). Processes still alive after `timeout_s` are killed and the test
    fails."""
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=run, args=(r, world, port, scenario, str(out)))
             for r in range(world)]
    for p in procs:
        p.start()
    hung = []
    for rank, p in enumerate(procs):
        p.join(timeout_s)
        if p.is_alive():
            hung.append(rank)
            p.kill()
            p.join()
    assert not hung, f"ranks {hung} of {scenario!r} still ran after {timeout_s} s"
    if killed is not None:
        assert procs[killed].exitcode == -9, procs[killed].exitcode
    for rank, p in enumerate(procs):
        if rank != killed:
            assert (out / f"rank{rank}.pt").exists(), f"rank {rank} died (exit code {p.exitcode})"
    return [None if r == killed else torch.load(out / f"rank{r}.pt", weights_only=False)
            for r in range(world)]


def run(rank: int, world: int, port: int, scenario: str, out: str) -> None:
    """Process entry: runs `scenario` and saves what it found (or the error it raised)."""
    result: dict = {}
    start = time.monotonic()
    try:
        init(rank, world, port, 5.0 if scenario == "fault" or scenario.startswith("killed") else 60.0)
        globals()[f"scenario_{scenario}"](rank, world, out, result)
    except BaseException as error:  # noqa: BLE001 (reported to the test)
        result["error"] = f"{type(error).__name__}: {error}"
        result["traceback"] = traceback.format_exc()
        result["seconds_to_error"] = time.monotonic() - start
        result["error_at"] = time.monotonic()
        if scenario == "fault" and rank == FAULTY:
            # The failed rank stays (its process group open, as a rank stuck elsewhere would)
            # until the others gave up on it: they must, by the process group's timeout.
            others = [os.path.join(out, f"rank{r}.pt") for r in range(world) if r != rank]
            deadline = time.monotonic() + 60.0
            while not all(map(os.path.exists, others)) and time.monotonic() < deadline:
                time.sleep(0.1)
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    if "error" in result:
        # Not through the process group's teardown, which may wait on the collectives a failed
        # peer never joined.
        os._exit(1)
    dist.destroy_process_group()


def scenario_train(rank: int, world: int, out: str, result: dict) -> None:
    """tide and torch.optim.AdamW (foreach=False) under the same FSDP2 setup, per regime; the
    gradient scale against a single-process computation; clipping both ways."""
    # Under CPUOffloadPolicy tide steps the shards where they are (host-resident): also with its
    # GPU subgroups (the stand-in's), and, for the pinned bytes, with its own masters instead.
    offload_kinds = {"tide_gpu": {"placement": "gpu"},
                     "tide_auto": {"placement": "auto", "subgroup_size": 4},
                     "tide_own_masters": {"host_params": False}}
    for regime in ("gpu", "offload", "mixed"):
        runs = {}
        extra = tuple(offload_kinds) if regime == "offload" else ()
        for kind in ("torch", "tide", "tide_backward") + extra:
            model = sharded(regime)
            if kind == "tide_backward":
                opt = make_opt("tide", model, sharded_gradients="backward")
            elif kind in offload_kinds:
                opt = make_opt("tide", model, **offload_kinds[kind])
            else:
                opt = make_opt(kind, model)
            norms = train(model, opt, range(STEPS), rank, world,
                          clip="reference" if kind == "torch" else "tide",
                          scheduler=scheduled(opt))
            runs[kind] = {"weights": full(model), "norms": norms,
                          "local_shapes": {
                              name: tuple(getattr(p, "to_local", lambda p=p: p)().shape)
                              for name, p in model.named_parameters()}}
            if kind.startswith("tide"):
                runs[kind]["plan"] = opt.last_plan
                runs[kind]["devices"] = sorted({str(local(p).device) for p in model.parameters()})
                runs[kind]["hooked"] = sorted(
                    name for name, p in model.named_parameters()
                    if getattr(p, "_post_accumulate_grad_hooks", None))
            if kind == "tide":
                runs[kind]["summary"] = opt.node_summary()
        result[regime] = runs
    # bf16 master weights need bf16 parameters; CPUOffloadPolicy's fp32 shards are their own
    # masters: asking for both is a clear error, at construction.
    try:
        make_opt("tide", sharded("offload"), master_dtype=torch.bfloat16)
        result["offload_bf16_master"] = None
    except ValueError as error:
        result["offload_bf16_master"] = str(error)
    # torch's own clipping on the sharded gradients, with tide stepping.
    for kind in ("torch", "tide"):
        model = sharded("gpu")
        opt = make_opt(kind, model)
        norms = train(model, opt, range(STEPS), rank, world, clip="torch")
        result[f"torch_clip_{kind}"] = {"weights": full(model), "norms": norms}
    # bf16 sharded parameters: fp32 master weights in tide's state, the shards their rounding.
    model = Net().to(torch.bfloat16)
    for unit in (model.a, model.b, model.head):
        fully_shard(unit)
    opt = make_opt("tide", model)
    start = full(model)
    train(model, opt, range(2), rank, world)
    masters = opt.state_dict()["state"]
    name_of = {id(p): name for name, p in model.named_parameters()}
    params = [p for group in opt.param_groups for p in group["params"]]  # state_dict's order
    result["bf16"] = {
        "moved": not any(torch.equal(a, b) for a, b in zip(start, full(model))),
        "master_types": {name_of[id(params[k])]: type(v["master_param"]).__name__
                         for k, v in masters.items()},
        "rounded": all(torch.equal(local(v["master_param"]).to(torch.bfloat16),
                                   local(params[k]).detach()) for k, v in masters.items())}
    # What tide does not step: a clear error.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh1, mesh2 = init_device_mesh("cpu", (world,)), init_device_mesh("cpu", (world, 1))
    errors = []
    for mesh, placements in ((mesh1, [Replicate()]), (mesh1, [Shard(1)]),
                             (mesh2, [Shard(0), Replicate()])):
        p = torch.nn.Parameter(distribute_tensor(torch.ones(4, 4), mesh, placements))
        try:
            make_opt("tide", model)  # a working one first: the failing one must not disturb it
            import tide.torch as tt
            tt.AdamW([p])
            errors.append(None)
        except ValueError as error:
            errors.append(str(error))
    result["unsupported"] = errors
    # The gradient FSDP2 hands the optimizer, against one process's on the global batch.
    model = sharded("gpu")
    x, y = batch(0, rank, world)
    torch.nn.functional.mse_loss(model(x), y).backward()
    result["grads"] = [p.grad.full_tensor() for p in model.parameters() if p is not model.gain]


def scenario_checkpoint(rank: int, world: int, out: str, result: dict) -> None:
    """DCP: tide saves at step 2 and goes on to step 4; a fresh tide loads it and goes on; stock
    AdamW loads it; tide loads what stock AdamW saved."""
    for kind in ("tide", "torch"):
        model = sharded("gpu")
        opt = make_opt(kind, model)
        train(model, opt, range(2), rank, world)
        dcp.save({"model": get_model_state_dict(model),
                  "optim": get_optimizer_state_dict(model, opt)},
                 checkpoint_id=os.path.join(out, f"ckpt_{kind}"))
        result[f"saved_{kind}"] = full(model)
        train(model, opt, range(2, STEPS), rank, world)
        result[f"continued_{kind}"] = full(model)
    for saver, loader in (("tide", "tide"), ("tide", "torch"), ("torch", "tide")):
        model = sharded("gpu")
        opt = make_opt(loader, model)
        before = full(model)
        model_sd = get_model_state_dict(model)
        optim_sd = get_optimizer_state_dict(model, opt)  # a zero-gradient step at lr 0 first
        result[f"lr0_unchanged_{loader}_{saver}"] = all(
            torch.equal(a, b) for a, b in zip(before, full(model)))
        dcp.load({"model": model_sd, "optim": optim_sd},
                 checkpoint_id=os.path.join(out, f"ckpt_{saver}"))
        set_model_state_dict(model, model_sd)
        set_optimizer_state_dict(model, opt, optim_sd)
        if loader == "tide":
            entry = opt.state[model.a.weight]
            result[f"state_type_{saver}"] = (type(entry["exp_avg"]).__name__,
                                             tuple(entry["exp_avg"].placements))
            result[f"keys_{saver}"] = sorted(optim_sd["state"]["a.weight"].keys())
            result[f"groups_{saver}"] = sorted(optim_sd["param_groups"][0].keys())
        train(model, opt, range(2, STEPS), rank, world)
        result[f"resumed_{loader}_from_{saver}"] = full(model)
    # Full (unsharded) state dicts through the same API: tide's gathers and loads back.
    options = StateDictOptions(full_state_dict=True)
    model = sharded("gpu")
    opt = make_opt("tide", model)
    train(model, opt, range(2), rank, world)
    saved = get_optimizer_state_dict(model, opt, options=options)
    other = sharded("gpu")
    other_opt = make_opt("tide", other)
    set_model_state_dict(other, get_model_state_dict(model))
    set_optimizer_state_dict(other, other_opt, saved, options=options)
    train(model, opt, range(2, STEPS), rank, world)
    train(other, other_opt, range(2, STEPS), rank, world)
    result["full_state_dict_shapes"] = {k: tuple(v["exp_avg"].shape)
                                        for k, v in saved["state"].items()}
    result["full_state_dict_resumed_exactly"] = all(
        torch.equal(a, b) for a, b in zip(full(model), full(other)))


def scenario_inf(rank: int, world: int, out: str, result: dict) -> None:
    """An inf in rank 1's shard of one gradient, under GradScaler: every rank skips the step.
    Then found_inf set on rank 1 only (GradScaler's contract with an optimizer that unscales
    itself), as a scaler that checks only what this rank holds would: tide still skips
    everywhere."""
    model = sharded("gpu", root=True)
    opt = make_opt("tide", model)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for step in range(2):
        opt.zero_grad()
        x, y = batch(step, rank, world)
        scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
        average_plain_grads(model)
        before = full(model)
        if step == 1 and rank == 1:
            model.a.weight.grad.to_local()[0, 0] = float("inf")
        scaler.step(opt)
        scaler.update()
        result[f"changed_{step}"] = not all(torch.equal(a, b) for a, b in zip(before, full(model)))
        result[f"skipped_{step}"] = opt.last_plan["skipped"]
        result[f"scale_{step}"] = float(scaler.get_scale())
    opt.zero_grad()
    x, y = batch(2, rank, world)
    torch.nn.functional.mse_loss(model(x), y).backward()
    before = full(model)
    opt.grad_scale, opt.found_inf = torch.tensor(1.0), torch.tensor(float(rank == 1))
    opt.step()
    del opt.grad_scale, opt.found_inf
    result["changed_local_inf"] = not all(torch.equal(a, b) for a, b in zip(before, full(model)))
    opt.step()  # the same gradients, nothing skipped: the step happens on both ranks
    result["changed_after"] = not all(torch.equal(a, b) for a, b in zip(before, full(model)))


def scenario_fault(rank: int, world: int, out: str, result: dict) -> None:
    """Rank 1's stand-in loses its device as the step reads the gradients: rank 1 raises (the
    step did not happen); rank 0 goes on to the next step's collectives and must fail by the
    process group's timeout (5 s), not hang."""
    model = sharded("gpu")
    opt = make_opt("tide", model, placement="gpu")
    _kept.append((model, opt))  # the failed rank's mesh and process groups stay open
    train(model, opt, range(1), rank, world)
    if rank == FAULTY:
        import ctypes
        standin = ctypes.CDLL(os.environ["TIDE_CUDA_DRIVER"])
        standin.tide_standin_device_lost.argtypes = [ctypes.c_uint64]
        standin.tide_standin_device_lost(1)
    train(model, opt, range(1, 3), rank, world)


def _checkpointed_at_step_2(rank: int, world: int, out: str, result: dict):
    """Two steps, then a complete DCP checkpoint ("ckpt_done"): what a killed rank's job resumes
    from."""
    model = sharded("gpu")
    opt = make_opt("tide", model)
    _kept.append((model, opt))  # nothing of it is torn down while the peer is dying
    train(model, opt, range(2), rank, world)
    dcp.save({"model": get_model_state_dict(model),
              "optim": get_optimizer_state_dict(model, opt)},
             checkpoint_id=os.path.join(out, "ckpt_done"))
    result["saved"] = full(model)
    result["seconds_at_save"] = time.monotonic()
    return model, opt


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def scenario_killed_step(rank: int, world: int, out: str, result: dict) -> None:
    """Rank 1 is SIGKILLed in its third step, after backward (after the checkpoint of step 2):
    rank 0, in the optimizer's gradient-norm all-reduce, must raise by the process group's
    timeout (5 s), not hang, saying that nothing of the optimizer changed."""
    model, opt = _checkpointed_at_step_2(rank, world, out, result)
    for step in range(2, STEPS):
        opt.zero_grad()
        x, y = batch(step, rank, world)
        torch.nn.functional.mse_loss(model(x), y).backward()
        average_plain_grads(model)
        if rank == KILLED:
            _die()
        opt.clip_grad_norm_(MAX_NORM)
        opt.step()


class _DieAfterPlanning(dcp.DefaultSavePlanner):
    """Rank 1 dies inside a DCP save, once the plan is agreed and before anything is written."""

    def finish_plan(self, new_plan):
        _die()
        return super().finish_plan(new_plan)


def scenario_killed_save(rank: int, world: int, out: str, result: dict) -> None:
    """Rank 1 is SIGKILLed inside the DCP save after step 3 ("ckpt_partial"): rank 0 must raise,
    not hang, and leave no checkpoint that looks complete."""
    model, opt = _checkpointed_at_step_2(rank, world, out, result)
    train(model, opt, range(2, 3), rank, world)
    planner = _DieAfterPlanning() if rank == KILLED else dcp.DefaultSavePlanner()
    dcp.save({"model": get_model_state_dict(model),
              "optim": get_optimizer_state_dict(model, opt)},
             checkpoint_id=os.path.join(out, "ckpt_partial"), planner=planner)


def _device_memory() -> tuple[int, int]:
    """The stand-in's device memory in use and its peak since the last reset."""
    import ctypes
    standin = ctypes.CDLL(os.environ["TIDE_CUDA_DRIVER"])
    used, peak = ctypes.c_uint64(), ctypes.c_uint64()
    assert standin.tide_standin_device_memory(0, ctypes.byref(used), ctypes.byref(peak),
                                              None) == 0
    return used.value, peak.value


def _reset_device_peak() -> None:
    import ctypes
    ctypes.CDLL(os.environ["TIDE_CUDA_DRIVER"]).tide_standin_reset_stats()


def scenario_resume(rank: int, world: int, out: str, result: dict) -> None:
    """A fresh job at 2 ranks from "ckpt_done": the state saved, and training goes on; the DCP
    load needs no device memory, the first step after it no more than its update phase's."""
    model = sharded("gpu")
    opt = make_opt("tide", model)
    model_sd = get_model_state_dict(model)
    optim_sd = get_optimizer_state_dict(model, opt)
    _reset_device_peak()
    result["device_before"], _ = _device_memory()
    dcp.load({"model": model_sd, "optim": optim_sd},
             checkpoint_id=os.path.join(out, "ckpt_done"))
    set_model_state_dict(model, model_sd)
    set_optimizer_state_dict(model, opt, optim_sd)
    _, result["device_load_peak"] = _device_memory()
    result["loaded"] = full(model)
    result["step"] = float(opt.state[model.a.weight]["step"])
    _reset_device_peak()
    train(model, opt, range(2, 3), rank, world)
    _, result["device_step_peak"] = _device_memory()
    result["buffer_bytes"] = opt.stats[-1]["buffer_bytes"]
    train(model, opt, range(3, STEPS), rank, world)
    result["continued"] = full(model)


def scenario_q8(rank: int, world: int, out: str, result: dict) -> None:
    """8-bit moments on FSDP2 shards: trained next to fp32 moments; saved through DCP (fp32
    moments as DTensors, no exact keys: DCP reshards what it saves, not tide's flat codes) and
    loaded into a fresh 8-bit optimizer, which goes on."""
    runs = {}
    for state_dtype in ("float32", "q8"):
        model = sharded("gpu")
        opt = make_opt("tide", model, **({"state_dtype": "q8"} if state_dtype == "q8" else {}))
        train(model, opt, range(2), rank, world)
        if state_dtype == "q8":
            optim_sd = get_optimizer_state_dict(model, opt)
            result["q8_keys"] = sorted(optim_sd["state"]["a.weight"].keys())
            result["q8_state_type"] = type(optim_sd["state"]["a.weight"]["exp_avg"]).__name__
            dcp.save({"model": get_model_state_dict(model), "optim": optim_sd},
                     checkpoint_id=os.path.join(out, "ckpt_q8"))
        train(model, opt, range(2, STEPS), rank, world)
        runs[state_dtype] = full(model)
    result["q8_trained"] = runs
    model = sharded("gpu")
    opt = make_opt("tide", model, state_dtype="q8")
    model_sd = get_model_state_dict(model)
    optim_sd = get_optimizer_state_dict(model, opt)
    dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=os.path.join(out, "ckpt_q8"))
    set_model_state_dict(model, model_sd)
    set_optimizer_state_dict(model, opt, optim_sd)
    train(model, opt, range(2, STEPS), rank, world)
    result["q8_resumed"] = full(model)


def scenario_bf16_master(rank: int, world: int, out: str, result: dict) -> None:
    """bf16 master weights on bf16 FSDP2 shards: trained next to an fp32 master on the same bf16
    model; saved through DCP (torch's keys and "master_comp" as DTensors) and loaded into a fresh
    bf16-master optimizer, which goes on as the saving one did."""
    runs = {}
    for master in ("float32", "bfloat16"):
        model = sharded("bf16")
        opt = make_opt("tide", model, master_dtype=getattr(torch, master))
        train(model, opt, range(2), rank, world)
        if master == "bfloat16":
            optim_sd = get_optimizer_state_dict(model, opt)
            entry = optim_sd["state"]["a.weight"]
            result["keys"] = sorted(entry.keys())
            result["comp_type"] = (type(entry["master_comp"]).__name__,
                                   str(entry["master_comp"].dtype))
            dcp.save({"model": get_model_state_dict(model), "optim": optim_sd},
                     checkpoint_id=os.path.join(out, "ckpt_bf16_master"))
        train(model, opt, range(2, STEPS), rank, world)
        runs[master] = full(model)
    result["trained"] = runs
    model = sharded("bf16")
    opt = make_opt("tide", model, master_dtype=torch.bfloat16)
    model_sd = get_model_state_dict(model)
    optim_sd = get_optimizer_state_dict(model, opt)
    dcp.load({"model": model_sd, "optim": optim_sd},
             checkpoint_id=os.path.join(out, "ckpt_bf16_master"))
    set_model_state_dict(model, model_sd)
    set_optimizer_state_dict(model, opt, optim_sd)
    train(model, opt, range(2, STEPS), rank, world)
    result["resumed"] = full(model)


def modify(path: str, model: Net, opt) -> None:
    """Writes the sharded gradients in place after backward, one way per `path`."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    with torch.no_grad():
        if path == "mul":
            for g in grads:
                g.mul_(0.5)
        elif path == "div":
            for g in grads:
                g.div_(3.0)
        elif path == "copy":
            for g in grads:
                g.copy_(g * -1.0)
        elif path == "zero":
            model.a.weight.grad.zero_()
        elif path == "clip_loop":
            torch.nn.utils.clip_grad_norm_(list(model.parameters()), 0.05, foreach=False)
        elif path in ("clip_foreach", "clip_foreach_unsignalled"):
            torch.nn.utils.clip_grad_norm_(list(model.parameters()), 0.05, foreach=True)
            if path == "clip_foreach" and hasattr(opt, "gradients_changed"):
                opt.gradients_changed()


MODIFIED_PATHS = ("none", "mul", "div", "copy", "zero", "clip_loop", "clip_foreach",
                  "clip_foreach_unsignalled", "unscale")


def scenario_modified(rank: int, world: int, out: str, result: dict) -> None:
    """tide with sharded_gradients="backward" (gradients offloaded in their hooks) and torch's
    AdamW, the sharded gradients written in place after backward, one way per path."""
    for path in MODIFIED_PATHS:
        runs = {}
        for kind in ("torch", "tide"):
            model = sharded("gpu", root=True)
            opt = (make_opt(kind, model, sharded_gradients="backward") if kind == "tide"
                   else make_opt(kind, model))
            scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
            counts = []
            for step in range(2):
                opt.zero_grad()
                x, y = batch(step, rank, world)
                loss = torch.nn.functional.mse_loss(model(x), y)
                if path == "unscale":
                    scaler.scale(loss).backward()
                    scaler.unscale_(opt)
                    scaler.step(opt)
                    scaler.update()
                else:
                    loss.backward()
                    modify(path, model, opt)
                    opt.step()
                if kind == "tide":
                    counts.append((opt.last_plan["gradients_offloaded_in_backward"],
                                   opt.last_plan["gradients_offloaded_at_step"]))
            runs[kind] = {"weights": full(model), "counts": counts}
        runs["elements"] = [p.to_local().numel() for p in model.parameters()]
        result[path] = runs


DDP_STEPS = 5


def _ddp_train(rank: int, world: int, kind: str, module: torch.nn.Module, *, view: bool,
               micro_batches: int, offload: dict | None = None, clip: str | None = None,
               compiled: bool = False, sync_every: bool = False, **ddp: Any) -> dict:
    """DDP_STEPS steps of `kind` ("torch": torch.optim.AdamW, foreach=False; "tide": tide's
    AdamW, placement 2) on `module` under DistributedDataParallel (several buckets), each after
    `micro_batches` backward passes (all but the last under no_sync()); with `offload`, tide's DDP
    hook (register_ddp_offload's keywords); with `clip`, a clip to norm 0.05 before each step
    (torch.nn.utils.clip_grad_norm_, or with "tide" tide's own opt.clip_grad_norm_); with
    `compiled`, the DDP model under torch.compile (aot_eager; DDP's default buckets, as Dynamo's
    DDP graph splitting wants the first no larger than the others); with `sync_every`, no
    micro-batch under no_sync() (each all-reduces). The trained weights, and
    tide's (in backward, deferred, at step) gradient copies per step."""
    import tide.torch as tt
    model = torch.nn.parallel.DistributedDataParallel(
        module, gradient_as_bucket_view=view, **({} if compiled else {"bucket_cap_mb": 1e-4}),
        **ddp)
    opt = (tt.AdamW(model.parameters(), lr=1e-2, placement=2) if kind == "tide"
           else torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False))
    if kind == "tide" and offload is not None:
        tt.register_ddp_offload(model, opt, **offload)
    forward = torch.compile(model, backend="aot_eager") if compiled else model
    counts = []
    for step in range(DDP_STEPS):
        for micro in range(micro_batches):
            x, y = batch(step * micro_batches + micro, rank, world)
            sync = sync_every or micro == micro_batches - 1
            with contextlib.nullcontext() if sync else model.no_sync():
                (torch.nn.functional.mse_loss(forward(x), y) / micro_batches).backward()
        if clip == "tide" and kind == "tide":
            opt.clip_grad_norm_(0.05)  # read from the copies, applied in the update
        elif clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        opt.step()
        opt.zero_grad()
        if kind == "tide":
            plan = opt.last_plan
            counts.append((plan["gradients_offloaded_in_backward"],
                           plan["gradient_offloads_deferred"],
                           plan["gradients_offloaded_at_step"]))
    return {"weights": [p.detach().clone() for p in module.parameters()], "counts": counts}


def scenario_ddp(rank: int, world: int, out: str, result: dict) -> None:
    """tide and torch.optim.AdamW on the same DistributedDataParallel model (each rank its own
    batch), tide with its DDP hook (register_ddp_offload) and without, with the gradients as
    DDP's bucket views and without, one micro-batch a step and two."""
    for hooked in (False, True):
        for view in (False, True):
            for micro_batches in (1, 2):
                result[(hooked, view, micro_batches)] = {
                    kind: _ddp_train(rank, world, kind, Net(), view=view,
                                     micro_batches=micro_batches,
                                     offload={} if hooked else None)
                    for kind in ("torch", "tide")}


class UnevenNet(Net):
    """Net with a branch that rank 1 alone uses and one that no rank uses."""

    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank
        self.extra = torch.nn.Linear(7, 1)
        self.unused = torch.nn.Linear(7, 1)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in (*self.extra.parameters(), *self.unused.parameters()):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)

    def forward(self, x):
        out = super().forward(x)
        return out + self.extra(x) if self.rank == 1 else out


def _average_into_new_tensor(group, bucket):
    """A DDP hook whose result is a tensor of its own (DDP then copies it into the gradients)."""
    tensor = bucket.buffer() / torch.distributed.get_world_size(group)
    work = torch.distributed.all_reduce(tensor, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def scenario_ddp_hook_cases(rank: int, world: int, out: str, result: dict) -> None:
    """tide's DDP hook where its copies cannot all be trusted, against torch.optim.AdamW: gradients
    clipped after backward (and clipped by tide, which changes none), a reducing hook whose result is a new tensor, parameters used by one
    rank only or by none (find_unused_parameters); a compiled DDP model; DDP's static_graph;
    micro-batches that each all-reduce (no no_sync())."""
    cases = {"clipped": ({}, {"clip": "torch"}, Net),
             "clipped_by_tide": ({}, {"clip": "tide"}, Net),
             "new_tensor": ({"hook": _average_into_new_tensor, "state": None}, {}, Net),
             "uneven": ({}, {"find_unused_parameters": True}, lambda: UnevenNet(rank)),
             "compiled": ({}, {"compiled": True}, Net),
             "static_graph": ({}, {"static_graph": True}, Net),
             "synced_micro_batches": ({}, {"sync_every": True, "micro_batches": 3}, Net)}
    for name, (offload, extra, make) in cases.items():
        for view in (False, True):
            result[(name, view)] = {
                kind: _ddp_train(rank, world, kind, make(), view=view,
                                 offload=offload, **{"micro_batches": 1, **extra})
                for kind in ("torch", "tide")}
    result["api"] = _ddp_hook_api(rank, world)


def scenario_ddp_average(rank: int, world: int, out: str, result: dict) -> None:
    """One backward of a DDP model in fp32 and bf16 (this rank's own batch), with DDP's own
    reduction and with tide's DDP hook: the averaged gradients."""
    import tide.torch as tt
    for hooked in (False, True):
        for dtype in (torch.float32, torch.bfloat16):
            module = Net().to(dtype)
            model = torch.nn.parallel.DistributedDataParallel(module, bucket_cap_mb=1e-4)
            if hooked:
                tt.register_ddp_offload(model, tt.AdamW(model.parameters(), placement="cpu"))
            x, y = batch(0, rank, world)
            torch.nn.functional.mse_loss(model(x.to(dtype)).float(), y).backward()
            result[(hooked, str(dtype))] = [p.grad.clone() for p in module.parameters()]


def _ddp_hook_api(rank: int, world: int) -> dict:
    """register_ddp_offload's errors; a second tide optimizer on the model takes the copies over
    (trained against torch.optim.AdamW); with its optimizer gone, the hook still reduces."""
    import gc

    import tide.torch as tt
    found: dict = {"errors": {}}
    model = torch.nn.parallel.DistributedDataParallel(Net(), bucket_cap_mb=1e-4)
    for name, call in {
            "torch_optimizer": lambda: tt.register_ddp_offload(
                model, torch.optim.AdamW(model.parameters())),
            "bad_hook": lambda: tt.register_ddp_offload(model, first, hook=3)}.items():
        first = tt.AdamW(model.parameters(), lr=1e-2, placement=2)
        try:
            call()
        except (TypeError, ValueError) as error:
            found["errors"][name] = f"{type(error).__name__}: {error}"
    hooked = torch.nn.parallel.DistributedDataParallel(Net(), bucket_cap_mb=1e-4)
    hooked.register_comm_hook(None, _average_into_new_tensor)
    try:
        tt.register_ddp_offload(hooked, tt.AdamW(hooked.parameters(), placement=2))
    except RuntimeError as error:
        found["errors"]["hook_of_yours_first"] = f"RuntimeError: {error}"
    first = tt.AdamW(model.parameters(), lr=1e-2, placement=2)
    tt.register_ddp_offload(model, first)
    try:
        tt.register_ddp_offload(model, first, hook=_average_into_new_tensor, state=None)
    except ValueError as error:
        found["errors"]["another_hook"] = f"ValueError: {error}"
    second = tt.AdamW(model.parameters(), lr=1e-2, placement=2)
    tt.register_ddp_offload(model, second)
    found["first_reduced"] = len(first._gradients.reduced)
    counts = []
    for step in range(DDP_STEPS):
        x, y = batch(step, rank, world)
        torch.nn.functional.mse_loss(model(x), y).backward()
        second.step()
        second.zero_grad()
        counts.append((second.last_plan["gradients_offloaded_in_backward"],
                       second.last_plan["gradients_offloaded_at_step"]))
    found["counts"] = counts
    found["weights"] = [p.detach().clone() for p in model.module.parameters()]
    reference = _ddp_train(rank, world, "torch", Net(), view=False, micro_batches=1)
    found["torch_weights"] = reference["weights"]
    del first, second
    gc.collect()
    x, y = batch(DDP_STEPS, rank, world)
    torch.nn.functional.mse_loss(model(x), y).backward()
    found["grads_after_optimizer_gone"] = [p.grad.clone() for p in model.module.parameters()]
    return found


class SoakNet:
    """The sharded model (CPUOffloadPolicy: host-resident fp32 shards) as the soak's loop
    (soak_run) takes a model: its parameters and a loss per step, on this rank's batch. `gain`'s
    gradient is not averaged over ranks: each rank's check is of its own shards and replays its
    own gradients, and an all-reduce outside backward would only be one more collective to keep
    in step."""

    def __init__(self, rank: int, world: int):
        self.module = sharded("offload")
        self.rank, self.world = rank, world

    def parameters(self):
        # In the optimizer's order (its param groups'), which its state dict's indices follow.
        return iter([p for group in groups(self.module) for p in group["params"]])

    def loss(self, step: int) -> torch.Tensor:
        x, y = batch(step, self.rank, self.world)
        return torch.nn.functional.mse_loss(self.module(x), y)


def scenario_soak(rank: int, world: int, out: str, result: dict) -> None:
    """The fault soak's FSDP2 configuration (test_soak.test_soak_fsdp2; SOAK_RUN says which
    configuration, its placement and subgroup size, the seed, attempts and where, as a literal):
    both ranks draw the same schedule, so that events that make a fresh model (a lost device)
    come on both, and backward's collectives stay in step."""
    import soak_run
    import tide.torch as tt
    from standin_faults import Standin

    name, placement, subgroup, seed, steps, where = ast.literal_eval(os.environ["SOAK_RUN"])
    # host: what FSDP2's CPUOffloadPolicy makes of the shards, which tide finds by itself.
    config = soak_run.Config(name, placement, host=True, model="fsdp2", subgroup=subgroup)

    def make(config, weights=None, state=None):
        model = SoakNet(rank, world)
        if weights is not None:
            with torch.no_grad():
                for p, w in zip(model.parameters(), weights):
                    local(p).copy_(local(w))
        opt = tt.AdamW(groups(model.module), lr=1e-2, subgroup_size=config.subgroup,
                       placement=config.placement)
        if state is not None:
            opt.load_state_dict(state)
        # What the soak steps: the shards in host memory, where FSDP2 keeps them.
        result["host_resident_elements"] = sum(sum(b.sizes) for b in opt._buckets if b.host)
        return model, opt

    make(config)  # loads tide over the stand-in (CPU mode)
    standin = Standin()
    standin.disarm()
    result["counts"] = soak_run.soak(config, make, standin, seed, steps, f"{where}, rank {rank}")

"""One rank of tests/python/test_deepspeed.py: a small model trained under DeepSpeed ZeRO on the CPU
(DS_ACCELERATOR=cpu, gloo) with torch.optim.AdamW and with tide.torch.AdamW as the client
optimizer, under each config named on the command line ("3:offload": ZeRO-3 with
offload_optimizer on the CPU; "2:none": ZeRO-2 without), one after the other in this process.
Run with DeepSpeed on PYTHONPATH (it is not in .venv) and RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT set; rank 0 prints one JSON line per config, with "config" and:

  spread:      how far correct implementations land from torch's for-loop AdamW here (torch's
               fused AdamW, and the for-loop one from weights nudged by +-1e-7), the largest
               relative difference of any parameter (torch_reference.py's measure);
  bound:       max(1e-5, FACTOR x spread), torch_reference's bound for fp32 training;
  tide:        tide's difference from torch's for-loop AdamW (default, and host_params=True);
  resumed:     how far a run saved by engine.save_checkpoint half way and loaded into a fresh
               engine and optimizer ends from the uninterrupted run (0: bit for bit), with tide
               and with torch; torch_checkpoint_continued_by_tide: torch's checkpoint continued
               with tide, against torch's uninterrupted run;
  losses:      the reference's and tide's losses per step.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepspeed  # noqa: E402
from torch_reference import FACTOR, REFERENCE, VARIANTS  # noqa: E402

import tide.torch as tt  # noqa: E402

STEPS = 6
RANK = int(os.environ["RANK"])
STAGE, OFFLOAD = 0, False  # the config being run


def config() -> dict:
    zero = {"stage": STAGE}
    if OFFLOAD:
        zero["offload_optimizer"] = {"device": "cpu"}
    if STAGE == 3:
        # two sub-groups per param group: ZeRO-3 lists one at a time in the client's groups
        zero["sub_group_size"] = 400
    return {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
            "zero_optimization": zero, "zero_force_ds_cpu_optimizer": False,
            "zero_allow_untested_optimizer": True, "gradient_clipping": 0.5,
            "scheduler": {"type": "WarmupLR",
                          "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-2,
                                     "warmup_num_steps": 3}},
            "steps_per_print": 1000, "wall_clock_breakdown": False}


def make_model(nudge: float = 0.0) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(13, 29), torch.nn.Tanh(), torch.nn.Linear(29, 17),
                                torch.nn.Tanh(), torch.nn.Linear(17, 5))
    if nudge:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.0 + nudge)
    return model


def groups(model: torch.nn.Module) -> list[dict]:
    return [{"params": [p for p in model.parameters() if p.ndim > 1], "weight_decay": 0.1},
            {"params": [p for p in model.parameters() if p.ndim == 1], "weight_decay": 0.0}]


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + RANK)  # each rank its own data
    return torch.randn(4, 13, generator=g), torch.randn(4, 5, generator=g)


def weights(engine) -> list[torch.Tensor]:
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, enabled=STAGE == 3):
        return [p.detach().clone().float() for p in params]


def engine_for(make_optimizer, nudge: float = 0.0):
    model = make_model(nudge)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=make_optimizer(groups(model)),
                                           config=config())
    return engine


def train(engine, first: int, last: int) -> list[float]:
    losses = []
    for step in range(first, last):
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def run(make_optimizer, nudge: float = 0.0) -> tuple[list[torch.Tensor], list[float]]:
    engine = engine_for(make_optimizer, nudge)
    losses = train(engine, 0, STEPS)
    return weights(engine), losses


def resume(make_optimizer, uninterrupted: list[torch.Tensor], make_next=None) -> float:
    """Trains half the steps, saves a checkpoint, loads it into a fresh engine and optimizer
    (make_next's, else make_optimizer's) and trains the rest: how far that lands from the
    uninterrupted run (relative; 0: bit for bit)."""
    half = STEPS // 2
    engine = engine_for(make_optimizer)
    train(engine, 0, half)
    directory = tempfile.mkdtemp(prefix="tide-ds-") if RANK == 0 else None
    if torch.distributed.get_world_size() > 1:
        shared = [directory]
        torch.distributed.broadcast_object_list(shared, src=0)
        directory = shared[0]
    engine.save_checkpoint(directory, tag="half")
    engine = engine_for(make_next or make_optimizer)
    engine.load_checkpoint(directory, tag="half")
    train(engine, half, STEPS)
    return max_rel_diff(weights(engine), uninterrupted)


def max_rel_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(((x - y).abs().max() / (y.abs().max() or 1.0)).item() for x, y in zip(a, b))


def main() -> None:
    global STAGE, OFFLOAD
    for name in sys.argv[1:]:
        stage, offload = name.split(":")
        STAGE, OFFLOAD = int(stage), offload == "offload"
        compare(name)
    # Gloo's worker threads must stop while the interpreter is alive: a process that exits with
    # its process group open may die in teardown ("terminate called without an active
    # exception", SIGABRT; pytorch/pytorch#190489), as rank 1 did once in CI. Only after success:
    # after an error a peer may still wait in a collective this rank never joins.
    torch.distributed.destroy_process_group()


def compare(name: str) -> None:
    reference, reference_losses = run(lambda g: torch.optim.AdamW(g, lr=1e-2, **REFERENCE))
    spread = 0.0
    for options, nudge in VARIANTS.values():
        got, _ = run(lambda g, o=options: torch.optim.AdamW(g, lr=1e-2, **o), nudge)
        spread = max(spread, max_rel_diff(got, reference))
    tide_weights, tide_losses = run(lambda g: tt.AdamW(g, lr=1e-2))
    host_weights, _ = run(lambda g: tt.AdamW(g, lr=1e-2, host_params=True))

    # a checkpoint half way, loaded into a fresh engine and optimizer: with tide, and with torch
    make_torch = lambda g: torch.optim.AdamW(g, lr=1e-2, **REFERENCE)  # noqa: E731
    resumed = {"tide": resume(lambda g: tt.AdamW(g, lr=1e-2), tide_weights),
               "torch": resume(make_torch, reference)}
    # torch's checkpoint continued by tide: as far from torch's uninterrupted run as tide's
    cross = resume(make_torch, reference, lambda g: tt.AdamW(g, lr=1e-2))

    if RANK == 0:
        print(json.dumps({
            "config": name, "spread": spread, "bound": max(1e-5, FACTOR * spread),
            "tide": max_rel_diff(tide_weights, reference),
            "tide_host_params": max_rel_diff(host_weights, reference),
            "resumed": resumed, "torch_checkpoint_continued_by_tide": cross,
            "losses": {"torch": reference_losses, "tide": tide_losses}}), flush=True)


if __name__ == "__main__":
    main()

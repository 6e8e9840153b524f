#!/usr/bin/env python3
"""Trains the small GPT of train_gpt.py under DistributedDataParallel, with tide's AdamW on every
rank and tide's DDP communication hook, which copies each bucket's averaged gradients to pinned
memory during backward, as soon as its all-reduce is done.

    torchrun --standalone --nproc-per-node 2 examples/train_gpt_ddp.py
    torchrun --standalone --nproc-per-node 2 examples/train_gpt_ddp.py --steps 20 --layers 2

Each rank trains on its rows of every step's batch and keeps the whole optimizer state in its own
pinned memory (to shard it instead: train_gpt_fsdp.py). Every rank prints its plan per iteration
and where its gradients were copied ("[rank r] step ... copied in backward N, at step M": with
the hook, M is 0); rank 0 writes its memory timeline to --out at the end. Without a GPU the ranks
use gloo and CPU tensors, and tide runs over its host stand-in driver. The options are
train_gpt.py's (--compare excepted).
"""

from __future__ import annotations

import pathlib
import sys

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import train_gpt  # noqa: E402  (also finds tide.torch in a source checkout)
import train_gpt_fsdp  # noqa: E402  (the torchrun set-up both examples share)

import tide.torch  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args = train_gpt.parse_args(argv)
    started = train_gpt_fsdp.start(args, "train_gpt_ddp")
    if started is None:
        return 2
    device, rank, world, batches = started
    model = DistributedDataParallel(train_gpt.make_model(args, device),
                                    device_ids=[device.index] if device.type == "cuda" else None)
    opt = train_gpt.tide_optimizer(args, model)
    tide.torch.register_ddp_offload(model, opt)  # before the first backward
    if rank == 0:
        n_params = sum(p.numel() for p in model.parameters())
        tensors = len(list(model.parameters()))
        print(f"train_gpt_ddp: {world} ranks ({dist.get_backend()}), {args.layers} layers, "
              f"d_model {args.d_model}: {n_params / 1e6:.2f}M parameters in {tensors} "
              f"parameter tensors on every rank, "
              f"{args.dtype} on {device.type}; tide AdamW lr {args.lr:g}, placement "
              f"{args.placement}, {args.steps} steps", flush=True)

    def report(step, times):
        plan = opt.last_plan
        train_gpt_fsdp.say(
            f"[rank {rank}] " + train_gpt.iteration_line(step, args.steps, times, plan) +
            f"  gradients copied in backward {plan['gradients_offloaded_in_backward']}, "
            f"at step {plan['gradients_offloaded_at_step']}")

    history = train_gpt.train(model, opt, batches, device, report=report)
    train_gpt_fsdp.finish(args, rank, history, opt)
    del model, opt
    train_gpt_fsdp.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

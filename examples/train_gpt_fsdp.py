#!/usr/bin/env python3
"""Trains the small GPT of train_gpt.py under FSDP2 (fully_shard), with tide's AdamW on every rank.

    torchrun --standalone --nproc-per-node 2 examples/train_gpt_fsdp.py
    torchrun --standalone --nproc-per-node 2 examples/train_gpt_fsdp.py --steps 20 --layers 2

Each block and the whole model are fully_shard units; each rank trains on its rows of every
step's batch and steps its shards of the parameters with tide. Every rank prints its own plan per
iteration ("[rank r] step ..."); rank 0 prints the node summary (every rank's plan, gathered once
per step: opt.node_summary()) and, at the end, writes the memory timeline of rank 0 to --out.
Without a GPU the ranks use gloo and CPU tensors, and tide runs over its host stand-in driver. The
options are train_gpt.py's (--compare excepted).
"""

from __future__ import annotations

import gc
import os
import pathlib
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import train_gpt  # noqa: E402  (also finds tide.torch in a source checkout)

import tide.torch  # noqa: E402


def node_line(step: int, summary: dict) -> str:
    lines = []
    for node in summary["nodes"]:
        lines.append(
            f"node {node['host']} step {step}: ranks {node['ranks']}  subgroups gpu "
            f"{node['gpu_subgroups']} cpu {node['cpu_subgroups']}  optimizer state "
            f"{train_gpt.human_bytes(node['pinned_bytes'])} pinned, {node['elements']} "
            f"elements  slowest update {node['seconds'] * 1e3:.1f} ms "
            f"({node['elements_per_second'] / 1e6:.1f} M elements/s)")
    return "\n".join(lines)


def start(args, name: str) -> tuple[torch.device, int, int, list] | None:
    """What every torchrun rank of these examples does first: tide's allocator and the device,
    the process group (NCCL, or gloo on CPU tensors), and this rank's rows of every step's batch.
    None, having said why, when it cannot run (--compare, not under torchrun, a batch that does
    not split into the ranks)."""
    if args.compare:
        print(f"{name}: --compare is train_gpt.py's only", file=sys.stderr)
        return None
    if "RANK" not in os.environ:
        print(f"{name}: run it with torchrun, e.g. torchrun --standalone --nproc-per-node 2 "
              f"examples/{name}.py", file=sys.stderr)
        return None
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        tide.torch.use_allocator()  # first: before anything initialises CUDA
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        if rank == 0:
            print(f"{name}: --batch {args.batch} does not split into {world} ranks",
                  file=sys.stderr)
        dist.destroy_process_group()
        return None
    # Every rank draws the same global batches and keeps its rows.
    rows = slice(rank * args.batch // world, (rank + 1) * args.batch // world)
    batches = [(x[rows], y[rows]) for x, y in train_gpt.make_batches(args, device)]
    return device, rank, world, batches


def say(line: str) -> None:
    """One write per line: the ranks share torchrun's stdout, which may be unbuffered, and
    print() writes the text and its newline apart (lines of two ranks would mix)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def finish(args, rank: int, history: list[dict], opt) -> None:
    """Rank 0's loss, update time and memory timeline (written to --out)."""
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        png = tide.torch.memory_timeline(args.out / "tide_memory_rank0.png", optimizer=opt)
        print(f"[rank 0] loss {history[0]['loss']:.4f} -> {history[-1]['loss']:.4f}; mean ms per "
              f"iteration: update {train_gpt.mean_ms(history, 'update'):.1f}")
        print(f"memory timeline (rank 0): {png}", flush=True)


def close() -> None:
    """Destroys the process group, after the caller dropped what holds it (the model, the
    optimizer), so that gloo's worker threads are joined here. Left to the interpreter's
    shutdown, a worker may still free a finished collective's tensors then and PyTorch aborts
    ("terminate called without an active exception": a third of 2-rank gloo runs of plain FSDP2
    on a loaded machine, without tide too)."""
    gc.collect()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = train_gpt.parse_args(argv)
    started = start(args, "train_gpt_fsdp")
    if started is None:
        return 2
    device, rank, world, batches = started
    model = train_gpt.make_model(args, device)
    n_params = sum(p.numel() for p in model.parameters())
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = train_gpt.tide_optimizer(args, model)
    if rank == 0:
        print(f"train_gpt_fsdp: {world} ranks ({dist.get_backend()}), {args.layers} layers, "
              f"d_model {args.d_model}: {n_params / 1e6:.2f}M parameters sharded with "
              f"fully_shard, {args.dtype} on {device.type}; tide AdamW lr {args.lr:g}, "
              f"placement {args.placement}, {args.steps} steps", flush=True)

    def report(step, times):
        say(f"[rank {rank}] " + train_gpt.iteration_line(step, args.steps, times, opt.last_plan))
        summary = opt.node_summary()  # every rank: one all_gather_object
        if rank == 0:
            say(node_line(step, summary))

    history = train_gpt.train(model, opt, batches, device, report=report)
    finish(args, rank, history, opt)
    del model, opt
    close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

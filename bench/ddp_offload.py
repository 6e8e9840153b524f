"""Where DistributedDataParallel's gradients are copied to pinned memory: tide's DDP hook
(tide.torch.register_ddp_offload: in backward, as each bucket's all-reduce is done) against
tide without it (every gradient at step(), after DDP wrote the averages), and
torch.optim.AdamW (state on the device: no copies) as the floor, on the same DDP model.

`make bench BENCH=ddp_offload` runs it: `--world` processes over gloo on CPU tensors (tide over
its host stand-in driver where there is no GPU), or over NCCL with a GPU each where there are
enough. The model is `--layers` Linear(width, width) layers; each timed step (after 3 warm-up
steps, round-robin over the implementations) is a forward and backward, timed, and step(),
timed. One JSON line per implementation (rank 0's medians): backward, step and their sum;
tide's lines add how many gradients step() copied. The hook's line adds its ratio to tide
without it, and the copy it takes out of step() against the hardware limit: the gradients'
bytes at this machine's copy bandwidth into pinned memory (measured here, the same way), and
the largest difference between the two tide models' weights after the run (the same steps on the
same batches: 0). It exits 1 if they differ, or if step() copied gradients the hook should have.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import socket
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))

IMPLS = ("torch", "tide", "tide_hook")
HYPER = {"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2, help="processes (default 2)")
    p.add_argument("--layers", type=int, default=8, help="Linear layers (default 8)")
    p.add_argument("--width", type=int, default=1024, help="their width (default 1024)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per implementation")
    args = p.parse_args(argv)
    for name, low, high in (("world", 1, 64), ("layers", 1, 1000), ("width", 1, 65536),
                            ("steps", 1, 100_000)):
        if not low <= getattr(args, name) <= high:
            p.error(f"--{name}: {low} to {high}, not {getattr(args, name)}")
    return args


def copy_seconds(torch, device, elements: int, dtype) -> float:
    """The median time to copy `elements` gradients of `dtype` into pinned host memory."""
    source = torch.ones(elements, dtype=dtype, device=device)
    target = torch.empty(elements, dtype=dtype, pin_memory=device.type == "cuda")
    times = []
    for _ in range(7):
        start = time.perf_counter()
        target.copy_(source, non_blocking=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:])


def worker(rank: int, args: argparse.Namespace, port: int, queue) -> None:
    import torch
    import torch.distributed as dist

    import tide.torch as tt

    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= args.world
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    if cuda:
        torch.cuda.set_device(device)
    else:  # the ranks share this machine's cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.world))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=args.world)
    runs = {}
    for name in IMPLS:
        torch.manual_seed(0)
        module = torch.nn.Sequential(*(torch.nn.Linear(args.width, args.width)
                                       for _ in range(args.layers))).to(device, dtype)
        model = torch.nn.parallel.DistributedDataParallel(module)
        if name == "torch":
            opt = torch.optim.AdamW(model.parameters(), **HYPER)
        else:
            opt = tt.AdamW(model.parameters(), placement="cpu", **HYPER)
            if name == "tide_hook":
                tt.register_ddp_offload(model, opt)
        runs[name] = (model, opt, {"backward": [], "step": [], "copied": []})
    x = torch.randn(64, args.width, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for step in range(args.steps + 3):
        for name, (model, opt, times) in runs.items():
            opt.zero_grad(set_to_none=True)
            sync()
            start = time.perf_counter()
            model(x).float().square().mean().backward()
            sync()
            backward = time.perf_counter() - start
            start = time.perf_counter()
            opt.step()
            sync()
            elapsed = time.perf_counter() - start
            if step >= 3:
                times["backward"].append(backward)
                times["step"].append(elapsed)
                if name != "torch":
                    times["copied"].append(opt.last_plan["gradients_offloaded_at_step"])
    if rank == 0:
        elements = sum(p.numel() for p in runs["tide"][0].parameters())
        # The same model, batches and steps: the hook changes where copies run, not the numbers.
        diff = max((a - b).abs().max().item() for a, b in
                   zip(runs["tide"][0].parameters(), runs["tide_hook"][0].parameters()))
        queue.put({"weights_max_abs_diff": diff, "device": str(device),
                   "dtype": str(dtype).removeprefix("torch."), "elements": elements,
                   "copy_seconds": copy_seconds(torch, device, elements, dtype),
                   "runs": {name: medians(times) for name, (_, _, times) in runs.items()}})
    # What holds the process group goes first, so that destroying it joins gloo's threads here
    # (test_process_groups_closed).
    del runs
    gc.collect()
    dist.destroy_process_group()


def medians(times: dict) -> dict:
    """One implementation's medians (small: they go through a pipe)."""
    out = {"backward_seconds": statistics.median(times["backward"]),
           "step_seconds": statistics.median(times["step"]),
           "backward_and_step_seconds": statistics.median(
               a + b for a, b in zip(times["backward"], times["step"]))}
    if times["copied"]:
        out["gradients_copied_at_step"] = statistics.median(times["copied"])
    return out


def lines(args: argparse.Namespace, found: dict) -> list[dict]:
    out = {name: {"impl": name, "world": args.world, "layers": args.layers, "width": args.width,
                  "elements": found["elements"], "dtype": found["dtype"],
                  "device": found["device"], "timed_steps": args.steps, **figures}
           for name, figures in found["runs"].items()}
    hook, plain = out["tide_hook"], out["tide"]
    hook.update(
        over_tide_without_hook=round(hook["backward_and_step_seconds"]
                                     / plain["backward_and_step_seconds"], 3),
        step_seconds_saved=plain["step_seconds"] - hook["step_seconds"],
        weights_max_abs_diff_to_tide=found["weights_max_abs_diff"],
        copy_seconds_at_host_bandwidth=found["copy_seconds"],
        over_torch_on_device=round(hook["backward_and_step_seconds"]
                                   / out["torch"]["backward_and_step_seconds"], 3))
    return list(out.values())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = mp.start_processes(worker, args=(args, port, queue), nprocs=args.world, join=False,
                               start_method="spawn")
    while not procs.join():  # raises if a rank failed
        pass
    found = queue.get()  # rank 0's medians, put before it ended
    machine = {"machine": platform.machine(), "cpus": os.cpu_count(),
               "torch": torch.__version__, "python": platform.python_version()}
    out = lines(args, found)
    for line in out:
        print(json.dumps({"bench": "ddp_offload", **line, **machine}), flush=True)
    hook = out[-1]
    if hook["weights_max_abs_diff_to_tide"] != 0 or hook["gradients_copied_at_step"] != 0:
        print("ddp_offload: tide's DDP hook changed the weights, or left copies to step()",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

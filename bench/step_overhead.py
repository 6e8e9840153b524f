"""What a step costs per parameter tensor beyond the update itself, and what tide's gradient hooks
add to the backward passes: tide.torch.AdamW against torch.optim.AdamW on many tiny tensors.

`make bench BENCH=step_overhead` runs it (CPU tensors; tide over its host stand-in driver where
there is no GPU, as tide.torch runs there). The tensors are small (256 elements) so that the
arithmetic is negligible and what is measured is the work per tensor around it: for tide,
opt.state's entries, the gradients' bookkeeping, the checks and the C call; for torch, its
optimizer's loop over the tensors (foreach, and fused where torch has it on the CPU).

One JSON line per implementation and tensor count (after a warm-up, `--rounds` steps each,
round-robin over the implementations, each step after `--micro-batches` backward passes that
give every tensor a gradient, accumulated, and with `--clip` torch.nn.utils.clip_grad_norm_,
untimed): the median step() seconds, per tensor in µs, and for
tide the median of the update phase's own seconds (opt.last_plan["seconds"], the C++ executor's)
and of the rest, per tensor; the median seconds of the step's backward passes. tide's lines add
the fastest peer's per-tensor time and tide's ratio to it, and what its hooks added to the
backward passes per tensor (against the fastest peer's backward passes, which run none: their
optimizers have no hooks). The hardware limit here is no work at all: the per-tensor figures are
the cost.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))

ELEMENTS = 256
HYPER = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tensors", default="48,300,1000",
                   help="comma-separated parameter tensor counts (default 48,300,1000)")
    p.add_argument("--rounds", type=int, default=60, help="timed steps per implementation")
    p.add_argument("--micro-batches", type=int, default=4,
                   help="backward passes per step, accumulated (default 4)")
    p.add_argument("--clip", action="store_true",
                   help="torch.nn.utils.clip_grad_norm_ before each step (every implementation)")
    args = p.parse_args(argv)
    try:
        args.counts = [int(t) for t in args.tensors.split(",") if t]
    except ValueError:
        p.error(f"--tensors takes integers, not {args.tensors!r}")
    if not args.counts or any(not 1 <= n <= 100_000 for n in args.counts):
        p.error(f"--tensors: counts from 1 to 100000, not {args.tensors!r}")
    if not 1 <= args.rounds <= 100_000:
        p.error(f"--rounds: 1 to 100000, not {args.rounds}")
    if not 1 <= args.micro_batches <= 64:
        p.error(f"--micro-batches: 1 to 64, not {args.micro_batches}")
    return args


def implementations(torch, tt, count: int) -> dict:
    """Each implementation's parameters (the same values) and optimizer."""
    torch.manual_seed(0)
    values = [torch.randn(ELEMENTS) for _ in range(count)]
    out = {}
    for name in ("tide", "torch_foreach", "torch_fused"):
        params = [torch.nn.Parameter(v.clone()) for v in values]
        if name == "tide":
            opt = tt.AdamW(params, placement="cpu", **HYPER)
        elif name == "torch_foreach":
            opt = torch.optim.AdamW(params, foreach=True, **HYPER)
        else:
            try:
                opt = torch.optim.AdamW(params, fused=True, **HYPER)
            except (RuntimeError, ValueError):  # a torch without the CPU fused kernel
                continue
        out[name] = (params, opt)
    return out


def measure(torch, tt, count: int, rounds: int, micro_batches: int, clip: bool) -> list[dict]:
    impls = implementations(torch, tt, count)
    times: dict[str, list[float]] = {name: [] for name in impls}
    backwards: dict[str, list[float]] = {name: [] for name in impls}
    phases: list[float] = []
    for r in range(rounds + 3):
        for name, (params, opt) in impls.items():
            opt.zero_grad(set_to_none=True)
            losses = [sum((p * p).sum() for p in params) for _ in range(micro_batches)]
            start = time.perf_counter()
            for loss in losses:
                loss.backward()
            backward = time.perf_counter() - start
            if clip:  # untimed: the same for every implementation
                torch.nn.utils.clip_grad_norm_(params, 1.0)
            start = time.perf_counter()
            opt.step()
            elapsed = time.perf_counter() - start
            # Three warm-up steps: entries made, caches filled, tide's hooks know the pattern.
            if r >= 3:
                times[name].append(elapsed)
                backwards[name].append(backward)
                if name == "tide":
                    phases.append(opt.last_plan["seconds"])
    lines = []
    for name, t in times.items():
        seconds = statistics.median(t)
        line = {"impl": name, "tensors": count, "elements_per_tensor": ELEMENTS,
                "rounds": rounds, "micro_batches": micro_batches, "clip": clip,
                "step_seconds": seconds,
                "step_us_per_tensor": round(seconds / count * 1e6, 3),
                "backward_seconds": statistics.median(backwards[name])}
        if name == "tide":
            outside = statistics.median(a - b for a, b in zip(t, phases))
            line.update(phase_seconds=statistics.median(phases), outside_phase_seconds=outside,
                        outside_phase_us_per_tensor=round(outside / count * 1e6, 3))
        lines.append(line)
    peers = [line for line in lines if line["impl"] != "tide"]
    best = min(peers, key=lambda line: line["step_seconds"])
    bare = min(line["backward_seconds"] for line in peers)  # backward passes without hooks
    for line in lines:
        if line["impl"] == "tide":
            line.update(fastest_peer=best["impl"],
                        fastest_peer_us_per_tensor=best["step_us_per_tensor"],
                        tide_over_fastest_peer=round(line["step_seconds"] / best["step_seconds"],
                                                     3),
                        hooks_us_per_tensor=round((line["backward_seconds"] - bare) / count
                                                  * 1e6, 3))
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    import tide.torch as tt

    machine = {"machine": platform.machine(), "cpus": os.cpu_count(),
               "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
               "python": platform.python_version()}
    for count in args.counts:
        for line in measure(torch, tt, count, args.rounds, args.micro_batches, args.clip):
            print(json.dumps({"bench": "step_overhead", **line, **machine}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Host-resident parameters (FSDP2's CPUOffloadPolicy regime): tide.torch.AdamW stepping fp32 CPU
parameters in place as their own master weights (host_params=True), against tide keeping its own
fp32 masters and gradient buffers for the same parameters (host_params=False: the gradients are
copied into tide's pinned buffers at step() and the new weights copied back into the parameters),
and against torch.optim.AdamW (foreach) on the same parameters.

`make bench BENCH=host_params` runs it (CPU mode over the stand-in when there is no GPU, where the
"GPU" subgroups are host copies and the host twin of the kernel: only placement "cpu" says
something about speed there). One JSON line per case: the best and median step() time over
interleaved rounds (A B C A B C ...: background load hits every case alike), the paired ratio to
the host-resident step (median over rounds of case time / host-resident time in the same round),
and the pinned bytes per parameter of tide's state. Environment: N (parameters, default 8e6),
ROUNDS (default 9), PLACEMENT (default cpu).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import tide.torch as tt  # noqa: E402

N = int(float(os.environ.get("N", "8e6")))
ROUNDS = int(os.environ.get("ROUNDS", "9"))
PLACEMENT = os.environ.get("PLACEMENT", "cpu")
PIECES = 4


def params() -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(N // PIECES, generator=g)) for _ in range(PIECES)]


def make(case: str):
    ps = params()
    if case == "torch_adamw_foreach":
        return ps, torch.optim.AdamW(ps, lr=1e-3, foreach=True)
    return ps, tt.AdamW(ps, lr=1e-3, placement=PLACEMENT, subgroup_size=max(N // 8, 1),
                        host_params=case == "tide_host_resident")


def main() -> None:
    cases = ["tide_host_resident", "tide_own_masters", "torch_adamw_foreach"]
    runs = {c: make(c) for c in cases}
    times: dict[str, list[float]] = {c: [] for c in cases}
    for r in range(ROUNDS + 1):  # round 0 warms up
        grads = [torch.randn(N // PIECES, generator=torch.Generator().manual_seed(r))
                 for _ in range(PIECES)]
        for c in cases:
            ps, opt = runs[c]
            for p, g in zip(ps, grads):
                p.grad = g.clone()
            start = time.perf_counter()
            opt.step()
            elapsed = time.perf_counter() - start
            opt.zero_grad()
            if r > 0:
                times[c].append(elapsed)
    base = times["tide_host_resident"]
    machine = {"machine": platform.machine(), "cpus": os.cpu_count(),
               "torch_threads": torch.get_num_threads()}
    for c in cases:
        _, opt = runs[c]
        line = {"bench": "host_params", "case": c, "placement": PLACEMENT, "params": N,
                "rounds": ROUNDS, "best_seconds": min(times[c]),
                "median_seconds": statistics.median(times[c]),
                "paired_ratio_to_host_resident": statistics.median(
                    t / b for t, b in zip(times[c], base)), **machine}
        if c.startswith("tide"):
            plan = opt.last_plan
            line.update(pinned_bytes_per_param=plan["pinned_state_bytes"] / N,
                        gpu_subgroups=plan["gpu_subgroups"],
                        host_resident_elements=plan["host_resident_elements"])
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()

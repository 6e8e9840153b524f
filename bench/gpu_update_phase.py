"""The update phase on a real GPU, with real copies and kernels (`make gpu-check`, or
`make bench BENCH=gpu_update_phase`).

A stack of bf16 linear layers (24 of 4096 x 4096: 4.0e8 parameters; --layers N), one
forward/backward per step, then the timed optimizer step (torch.cuda.synchronize around it):

  - tide.torch.AdamW with tide's allocator, placement "cpu" (every subgroup on the CPU), "gpu"
    (every subgroup through the GPU: copy in, fused kernel, copy out), 2 (one GPU subgroup in two)
    and "auto" (tide's plan within the headroom);
  - torch.optim.AdamW(fused=True) with fp32 weights and state on the GPU: no offload at all, what
    an offloading optimizer can at best approach;
  - the pinned copy bandwidth each way (1 GiB, measured in the same run), and from it the copy
    bound of the all-GPU placement: 14 bytes per parameter each way (fp32 weight and moments, and
    the bf16 gradient in or weight out), the directions overlapping.

JSON lines: one per case ("seconds" is the median step over --steps after a warm-up step, with
params_per_s), then a summary with the ratios: tide auto over tide cpu (what interleaving gains),
tide gpu over the copy bound (how close the GPU path comes to the link), torch fused over tide
auto (how far offloading is from no offload). Without a GPU it prints one line saying so
("skipped") and exits 0.
"""

from __future__ import annotations

import argparse
import gc
import json
import pathlib
import statistics
import sys
import time
import traceback

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

BYTES_EACH_WAY = 14


def emit(line: dict) -> None:
    print(json.dumps({"bench": "gpu_update_phase", **line}), flush=True)


def copy_gbps(torch) -> tuple[float, float]:
    n = 1 << 30
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(n, dtype=torch.uint8, device="cuda")
    rates = []
    for dst, src in ((device, host), (host, device)):
        best = float("inf")
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        rates.append(n / best / 1e9)
    del host, device
    return rates[0], rates[1]


def model(torch, layers: int, width: int, dtype):
    return torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)]
                               ).to(device="cuda", dtype=dtype)


def time_steps(torch, net, opt, steps: int, width: int, dtype) -> tuple[float, dict]:
    times, plan = [], {}
    for i in range(steps + 1):
        x = torch.randn(8, width, device="cuda", dtype=dtype)
        net(x).float().square().mean().backward()
        torch.cuda.synchronize()
        start = time.perf_counter()
        opt.step()
        torch.cuda.synchronize()
        if i > 0:
            times.append(time.perf_counter() - start)
        opt.zero_grad(set_to_none=True)
        plan = getattr(opt, "last_plan", None) or {}
    return statistics.median(times), plan


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        emit({"skipped": "no GPU"})
        return 0
    import tide.torch as tt

    tt.use_allocator()  # before CUDA starts: tide's headroom forecast needs its allocator
    params = args.layers * args.width * args.width
    emit({"case": "machine", "gpu": torch.cuda.get_device_name(0), "params": params})
    failed = False
    h2d = d2h = None
    try:
        h2d, d2h = copy_gbps(torch)
        emit({"case": "copy_bandwidth", "h2d_gbps": round(h2d, 2), "d2h_gbps": round(d2h, 2)})
    except Exception as e:  # noqa: BLE001 - reported, and the other cases still run
        failed = True
        emit({"case": "copy_bandwidth", "error": repr(e), "traceback": traceback.format_exc()})

    seconds = {}
    for placement in ("cpu", "gpu", 2, "auto"):
        name = f"tide_{placement}"
        try:
            net = model(torch, args.layers, args.width, torch.bfloat16)
            opt = tt.AdamW(net.parameters(), lr=1e-4, placement=placement)
            s, plan = time_steps(torch, net, opt, args.steps, args.width, torch.bfloat16)
            seconds[name] = s
            emit({"case": "step", "impl": "tide", "placement": placement, "params": params,
                  "seconds": round(s, 4), "params_per_s": round(params / s),
                  "gpu_subgroups": plan.get("gpu_subgroups"),
                  "cpu_subgroups": plan.get("cpu_subgroups")})
            del net, opt
        except Exception as e:  # noqa: BLE001
            failed = True
            emit({"case": "step", "impl": "tide", "placement": placement, "error": repr(e),
                  "traceback": traceback.format_exc()})
        gc.collect()
        torch.cuda.synchronize()
        tt.empty_cache()

    try:
        net = model(torch, args.layers, args.width, torch.float32)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=True)
        s, _ = time_steps(torch, net, opt, args.steps, args.width, torch.float32)
        seconds["torch_fused_gpu"] = s
        emit({"case": "step", "impl": "torch_fused_gpu", "params": params, "seconds": round(s, 4),
              "params_per_s": round(params / s)})
        del net, opt
    except Exception as e:  # noqa: BLE001
        failed = True
        emit({"case": "step", "impl": "torch_fused_gpu", "error": repr(e),
              "traceback": traceback.format_exc()})

    summary = {"case": "summary", "bytes_each_way_per_param": BYTES_EACH_WAY}
    if h2d and d2h:
        bound = params * BYTES_EACH_WAY / (min(h2d, d2h) * 1e9)
        summary["copy_bound_seconds"] = round(bound, 4)
        if "tide_gpu" in seconds:
            summary["tide_gpu_over_copy_bound"] = round(seconds["tide_gpu"] / bound, 3)
    if "tide_auto" in seconds and "tide_cpu" in seconds:
        summary["tide_cpu_over_tide_auto"] = round(seconds["tide_cpu"] / seconds["tide_auto"], 3)
    if "tide_auto" in seconds and "torch_fused_gpu" in seconds:
        summary["tide_auto_over_torch_fused_gpu"] = round(
            seconds["tide_auto"] / seconds["torch_fused_gpu"], 3)
    emit(summary)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

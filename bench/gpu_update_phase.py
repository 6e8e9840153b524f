"""The update phase on a real GPU, with real copies and kernels (`make gpu-check`, or
`make bench BENCH=gpu_update_phase`).

A stack of bf16 linear layers (24 of 4096 x 4096: 4.0e8 parameters; --layers N), one
forward/backward per step, then the timed optimizer step (torch.cuda.synchronize around it):

  - tide.torch.AdamW with tide's allocator, placement "cpu" (every subgroup on the CPU), "gpu"
    (every subgroup through the GPU: copy in, fused kernel, copy out), 2 (one GPU subgroup in two)
    and "auto" (tide's plan within the headroom);
  - torch.optim.AdamW(fused=True) with fp32 weights and state on the GPU: no offload at all, what
    an offloading optimizer can at best approach;
  - the pinned copy bandwidth (measured in the same run): each direction alone (1 GiB
    pinned -> device, then 1 GiB device -> pinned, best of 3), and both directions at once (1 GiB
    each way on two streams started together, separate buffers, best of 3: each direction's rate
    while the other runs, and the aggregate). Both DMA directions go through host DRAM, so where
    the host's memory bandwidth is below twice the link's (an H200 box: 55 GB/s each way, about
    96 GB/s of host memory) the directions slow each other down, and only the concurrent figures
    show it.

The copy bound of the all-GPU placement: it moves BYTES_EACH_WAY = 14 bytes per parameter in and
14 out (the fp32 weight and two moments, 12 B, plus the bf16 gradient in, or the bf16 weight out,
2 B). It cannot beat the slowest of: the bytes in at the h2d rate alone, the bytes out at the d2h
rate alone, and both directions' bytes at the rates measured while both run (copy_bound(); the
summary's copy_bound_by says which term it was). The older figure, with each direction measured
alone and the two overlapping freely, is kept as copy_bound_each_alone_seconds.

JSON lines: one per case ("seconds" is the median step over --steps after a warm-up step, with
params_per_s), then a summary with the ratios: tide cpu over tide auto (what interleaving gains),
tide gpu over the copy bound (how close the GPU path comes to the hardware's limit; target
<= 1.10) and over the each-alone bound, tide auto over torch fused (how far offloading is from no
offload). Without a GPU it prints one line saying so ("skipped") and exits 0.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import statistics
import sys
import time
import traceback

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

# Bytes per parameter the all-GPU placement copies each way: in, the fp32 weight and moments (12 B)
# and the bf16 gradient (2 B); out, the fp32 weight and moments (12 B) and the bf16 weight (2 B).
BYTES_EACH_WAY = 14
COPY_BYTES = 1 << 30  # per direction, per measurement
GPU_OVER_COPY_BOUND_TARGET = 1.10
WHOLE_SUBGROUPS = "1G"  # TIDE_GPU_CHUNK past any subgroup: the pipeline without chunks


def emit(line: dict) -> None:
    print(json.dumps({"bench": "gpu_update_phase", **line}), flush=True)


def copy_gbps(torch) -> tuple[float, float]:
    """Pinned host -> device and device -> pinned host, each direction alone: (h2d, d2h) GB/s,
    1 GiB, best of 3."""
    n = COPY_BYTES
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


def concurrent_copy_gbps(torch) -> tuple[float, float, float]:
    """Both directions at once: 1 GiB pinned -> device on one stream and 1 GiB device -> pinned
    on another (separate buffers), both released by one event. Returns (h2d, d2h, aggregate)
    GB/s of the best of 3 tries (the shortest until both are done): each direction's bytes over
    its own time from the common start, and both directions' bytes over the time until the
    later one ends."""
    n = COPY_BYTES
    host_in = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    host_out = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    device_in = torch.empty(n, dtype=torch.uint8, device="cuda")
    device_out = torch.empty(n, dtype=torch.uint8, device="cuda")
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    torch.cuda.synchronize()  # the buffers exist before either stream touches them
    best = None
    for _ in range(3):
        start = torch.cuda.Event(enable_timing=True)
        ends = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        start.record()
        for stream, end, (dst, src) in zip(streams, ends,
                                           ((device_in, host_in), (host_out, device_out))):
            stream.wait_event(start)
            with torch.cuda.stream(stream):
                dst.copy_(src, non_blocking=True)
                end.record()
        for end in ends:
            end.synchronize()
        t_in, t_out = (start.elapsed_time(end) / 1e3 for end in ends)
        if best is None or max(t_in, t_out) < max(best):
            best = (t_in, t_out)
    torch.cuda.synchronize()
    del host_in, host_out, device_in, device_out
    t_in, t_out = best
    return n / t_in / 1e9, n / t_out / 1e9, 2 * n / max(t_in, t_out) / 1e9


def copy_bound(params: float, h2d: float, d2h: float, both_h2d: float,
               both_d2h: float) -> tuple[float, str]:
    """The least seconds the all-GPU placement's copies can take for `params` parameters
    (BYTES_EACH_WAY in and as many out), from rates in GB/s: h2d and d2h each measured alone,
    both_h2d and both_d2h while both directions run at once. It is the largest of the bytes in
    at h2d, the bytes out at d2h, and both directions' bytes at the concurrent rates
    (max(in / both_h2d, out / both_d2h)). Returns (seconds, which term: "h2d", "d2h" or
    "both_directions"); a tie goes to the single direction."""
    if min(h2d, d2h, both_h2d, both_d2h) <= 0:
        raise ValueError(f"copy rates must be positive: h2d {h2d}, d2h {d2h}, "
                         f"both_h2d {both_h2d}, both_d2h {both_d2h}")
    moved = params * BYTES_EACH_WAY
    terms = [(moved / (h2d * 1e9), "h2d"), (moved / (d2h * 1e9), "d2h"),
             (max(moved / (both_h2d * 1e9), moved / (both_d2h * 1e9)), "both_directions")]
    seconds, by = terms[0]
    for t, name in terms[1:]:
        if t > seconds:
            seconds, by = t, name
    return seconds, by


def copy_bound_each_alone(params: float, h2d: float, d2h: float) -> float:
    """The older bound: each direction at its rate measured alone, the two overlapping freely
    (params * BYTES_EACH_WAY / min(h2d, d2h) GB/s). Not the hardware's limit where both
    directions together exceed what host memory gives."""
    return params * BYTES_EACH_WAY / (min(h2d, d2h) * 1e9)


def summarize(params: float, seconds: dict, rates: dict) -> dict:
    """The summary line from the cases' seconds ("tide_cpu", "tide_gpu",
    "tide_gpu_whole_subgroups", "tide_auto", "torch_fused_gpu"; those that ran) and the copy rates in GB/s ("h2d", "d2h", "both_h2d",
    "both_d2h"; those measured)."""
    summary = {"case": "summary", "bytes_each_way_per_param": BYTES_EACH_WAY}
    gpu = seconds.get("tide_gpu")
    if rates.get("h2d") and rates.get("d2h"):
        alone = copy_bound_each_alone(params, rates["h2d"], rates["d2h"])
        if rates.get("both_h2d") and rates.get("both_d2h"):
            bound, by = copy_bound(params, rates["h2d"], rates["d2h"], rates["both_h2d"],
                                   rates["both_d2h"])
            summary.update({"copy_bound_seconds": round(bound, 4), "copy_bound_by": by})
            if gpu:
                ratio = round(gpu / bound, 3)
                summary.update({
                    "tide_gpu_over_copy_bound": ratio,
                    "tide_gpu_over_copy_bound_target": f"<= {GPU_OVER_COPY_BOUND_TARGET:.2f}",
                    "tide_gpu_over_copy_bound_met": ratio <= GPU_OVER_COPY_BOUND_TARGET})
            whole = seconds.get("tide_gpu_whole_subgroups")
            if whole:
                summary["tide_gpu_whole_subgroups_over_copy_bound"] = round(whole / bound, 3)
        summary["copy_bound_each_alone_seconds"] = round(alone, 4)
        if gpu:
            summary["tide_gpu_over_copy_bound_each_alone"] = round(gpu / alone, 3)
    if "tide_auto" in seconds and "tide_cpu" in seconds:
        summary["tide_cpu_over_tide_auto"] = round(seconds["tide_cpu"] / seconds["tide_auto"], 3)
    if "tide_auto" in seconds and "torch_fused_gpu" in seconds:
        summary["tide_auto_over_torch_fused_gpu"] = round(
            seconds["tide_auto"] / seconds["torch_fused_gpu"], 3)
    return summary


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
    rates: dict = {}
    try:
        rates["h2d"], rates["d2h"] = copy_gbps(torch)
        rates["both_h2d"], rates["both_d2h"], rates["both"] = concurrent_copy_gbps(torch)
        emit({"case": "copy_bandwidth", **{f"{k}_gbps": round(v, 2) for k, v in rates.items()}})
    except Exception as e:  # noqa: BLE001 - reported, and the other cases still run
        failed = True
        emit({"case": "copy_bandwidth", **{f"{k}_gbps": round(v, 2) for k, v in rates.items()},
              "error": repr(e), "traceback": traceback.format_exc()})
    gc.collect()
    torch.cuda.synchronize()
    tt.empty_cache()

    seconds = {}
    # "gpu" once more with whole subgroups (TIDE_GPU_CHUNK past any subgroup): what the chunked
    # pipeline gains, in the same run.
    for placement, chunk in (("cpu", None), ("gpu", None), ("gpu", WHOLE_SUBGROUPS), (2, None),
                             ("auto", None)):
        name = f"tide_{placement}" + ("_whole_subgroups" if chunk else "")
        try:
            net = model(torch, args.layers, args.width, torch.bfloat16)
            if chunk:
                os.environ["TIDE_GPU_CHUNK"] = chunk
            try:
                opt = tt.AdamW(net.parameters(), lr=1e-4, placement=placement)
            finally:
                os.environ.pop("TIDE_GPU_CHUNK", None)
            s, plan = time_steps(torch, net, opt, args.steps, args.width, torch.bfloat16)
            seconds[name] = s
            emit({"case": "step", "impl": "tide", "placement": placement, "params": params,
                  "gpu_chunk": chunk or "default",
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

    summary = summarize(params, seconds, rates)
    emit(summary)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU Adam benchmark: tide against PyTorch (foreach, fused) and DeepSpeed's DeepSpeedCPUAdam.

`make bench BENCH=cpu_adam` runs it. It prints one JSON line per case, size and implementation,
after one line with the host memory bandwidth measured in the same run (build/bin/tide_membw,
same thread count: the best of its copy, triad, in-place update and Adam-access-pattern kernels,
bytes read plus written):

  {"bench":"cpu_adam","impl":"bandwidth","threads":2,"gbps":44.1,...}
  {"bench":"cpu_adam","case":"offload_step","impl":"tide","params":100000000,"threads":2,
   "seconds":0.067,"params_per_s":1.49e9,"bytes_per_param":28,"fraction_of_bandwidth":0.95,...}

Cases:
  adam_fp32     fp32 gradients, fp32 weights and moments; no low-precision copy.
  offload_step  what an offloaded step does: bf16 gradients in, fp32 state updated, bf16 weights
                out. PyTorch and DeepSpeed take fp32 gradients and give fp32 weights, so their
                time includes the casts (into preallocated buffers): bf16 → fp32 gradients before
                the step, fp32 → bf16 weights after.
  adam_bf16_state  offload_step with bf16 moments (tide.torch's state_dtype=torch.bfloat16): 20
                bytes per parameter instead of 28. Compared with tide's fp32-state offload step
                ("tide_fp32_state", run in the same round-robin: its speed-up is the bf16 state's
                over fp32 state) and with the bandwidth bound in the bytes it moves. No peer runs
                bf16 moments on the CPU here: PyTorch's AdamW keeps its moments in the parameter's
                dtype, and DeepSpeed's CPU Adam in fp32.
  adam_8bit_state  offload_step with 8-bit block-wise moments (state_dtype="q8"; kernels/quant8.h):
                16 bytes per parameter (and 8 bytes of scales per 256), against tide's fp32-state
                offload step in the same round-robin and the bandwidth bound, as adam_bf16_state.
                bitsandbytes' 8-bit AdamW and torchao's low-bit AdamW need CUDA: not run here.
  adam_bf16_state_sr  adam_bf16_state with stochastically rounded moments (state_rounding=
                "stochastic"; kernels/stochastic_round.h): the same 20 bytes, plus a hash per
                element. Against tide's bf16-state step with nearest rounding ("tide_bf16_nearest",
                same round-robin): speedup_vs_bf16_nearest is the rounding's cost (below 1).

The bandwidth line comes first; its "gbps" is the best of the measurements taken before, between
and after the sizes ("measurements_gbps").

Every implementation runs on the same buffers (PyTorch's and DeepSpeed's optimizer state is set
to tide's moment tensors). `seconds` is the best of the timed repetitions (after a warm-up one),
`median_seconds` their median. tide's lines add the fastest peer, tide's speed-up over it (best
time over best time) and the paired speed-up: the median over repetitions of the peer's time over
tide's in the same repetition, which load that comes and goes over the run hardly touches.

Repetitions go round-robin over the implementations, so that background load hits all of them
alike, and each starts with the caches flushed (a buffer of twice the last-level cache read
first, then 10 ms of sleep for the flush's threads to go idle): no implementation finds the
previous one's data in cache or another's threads still spinning.

`bytes_per_param` is the traffic the case needs at least (28 bytes: adam_fp32 reads 4 B of
gradient and reads and writes 8 B each of weight, first and second moment; offload_step reads 2 B
of gradient, reads and writes the 24 B of fp32 state and writes 2 B of copy; adam_bf16_state 20:
the same with 2 B moments, 16 B of state read and written; adam_8bit_state 16: 1 B moments, 12 B of
state read and written, the scales left out);
`fraction_of_bandwidth` is params × bytes_per_param / seconds over the measured bandwidth, for
every implementation alike (the peers move more bytes than that).

DeepSpeed is installed from PyPI into this Python environment if missing, and builds its CPU Adam
op on first use (cached by torch in ~/.cache/torch_extensions: a few minutes, once); where that
fails, its lines carry "error" with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
import traceback

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

import torch  # noqa: E402

from tide import kernels  # noqa: E402

BYTES_PER_PARAM = {"adam_fp32": 28, "offload_step": 28, "adam_bf16_state": 20,
                   "adam_8bit_state": 16, "adam_bf16_state_sr": 20}
STATE_CASES = ("adam_bf16_state", "adam_8bit_state")  # tide against its own fp32 state
SR_CASE = "adam_bf16_state_sr"  # tide against its own bf16 state rounded to nearest
LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.999), 1e-8, 0.01


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def log(message: str) -> None:
    print(f"cpu_adam: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def stdout_to_stderr():
    """Sends file descriptor 1 to stderr for a while: DeepSpeed prints from Python loggers bound
    to stdout and from C++; stdout carries the JSON lines only."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def measure_bandwidth(build_dir: pathlib.Path, threads: int) -> dict:
    membw = build_dir / "bin" / "tide_membw"
    if not membw.is_file():
        raise SystemExit(f"cpu_adam: {membw} not found: build it (cmake --build build)")
    out = subprocess.run([str(membw), "--threads", str(threads)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def ensure_deepspeed():
    """DeepSpeedCPUAdam, installed and built if need be; raises with the reason otherwise."""
    try:
        with stdout_to_stderr():
            import deepspeed  # noqa: F401
    except ImportError:
        log("installing deepspeed from PyPI into this environment")
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "deepspeed"],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError("pip install deepspeed failed: " + done.stderr.strip()[-300:])
    with stdout_to_stderr():
        import logging

        from deepspeed.ops.adam import DeepSpeedCPUAdam
        from deepspeed.utils import logger

        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler):
                handler.setStream(sys.stderr)
        log("building DeepSpeed's CPU Adam op if not cached (minutes, once)")
        probe = torch.nn.Parameter(torch.zeros(16))
        probe.grad = torch.ones(16)
        DeepSpeedCPUAdam([probe], lr=LR).step()
    return DeepSpeedCPUAdam


def flush_bytes() -> int:
    """Twice the largest CPU cache (sysfs), at least 512 MiB."""
    largest = 0
    for path in pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        largest = max(largest, int(text.rstrip("KMG")) * scale)
    return max(2 * largest, 512 << 20)


class Buffers:
    """One size's buffers, shared by every implementation."""

    def __init__(self, n: int):
        generator = torch.Generator().manual_seed(0)
        self.n = n
        self.param = torch.randn(n, generator=generator)
        self.exp_avg = torch.zeros(n)
        self.exp_avg_sq = torch.zeros(n)
        self.grad32 = torch.randn(n, generator=generator)
        self.grad16 = self.grad32.to(torch.bfloat16)
        self.copy16 = torch.empty(n, dtype=torch.bfloat16)
        self.exp_avg16 = torch.zeros(n, dtype=torch.bfloat16)  # adam_bf16_state's moments
        self.exp_avg_sq16 = torch.zeros(n, dtype=torch.bfloat16)
        # adam_8bit_state's codes (at 256-byte boundaries) and block scales.
        self.codes = torch.zeros(2 * n + 1024, dtype=torch.uint8)
        skip = -self.codes.data_ptr() % 256
        self.exp_avg8 = self.codes[skip:skip + n]
        self.exp_avg_sq8 = self.codes[skip + n + (-n % 256):][:n]
        self.scales = torch.zeros(2, -(-n // 256))
        self.parameter = torch.nn.Parameter(self.param, requires_grad=True)  # same storage
        self.parameter.grad = self.grad32


def make_tide(buffers: Buffers, case: str, threads: int):
    step = [0]
    offload = case in ("offload_step", SR_CASE) + STATE_CASES
    rounding = ({"state_rounding": "stochastic", "rounding_seed": 1} if case == SR_CASE else {})
    moments = {"adam_bf16_state": (buffers.exp_avg16, buffers.exp_avg_sq16),
               SR_CASE: (buffers.exp_avg16, buffers.exp_avg_sq16),
               "adam_8bit_state": (buffers.exp_avg8, buffers.exp_avg_sq8)}.get(
                   case, (buffers.exp_avg, buffers.exp_avg_sq))
    scales = ({"exp_avg_scale": buffers.scales[0], "exp_avg_sq_scale": buffers.scales[1]}
              if case == "adam_8bit_state" else {})

    def run():
        step[0] += 1
        kernels.cpu_adam_step(
            buffers.param,
            buffers.grad16 if offload else buffers.grad32,
            *moments,
            step=step[0], lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
            param_copy=buffers.copy16 if offload else None, threads=threads, **scales,
            **rounding)

    return run


def with_casts(buffers: Buffers, case: str, step):
    if case != "offload_step":
        return step

    def run():
        buffers.grad32.copy_(buffers.grad16)  # bf16 gradients as the peers need them
        step()
        buffers.copy16.copy_(buffers.param)  # the bf16 weights that go back to the GPU

    return run


def make_torch(buffers: Buffers, case: str, options: dict):
    optimizer = torch.optim.AdamW([buffers.parameter], lr=LR, betas=BETAS, eps=EPS,
                                  weight_decay=WEIGHT_DECAY, **options)
    # Its state is tide's moments: the same buffers.
    optimizer.state[buffers.parameter] = {
        "step": torch.tensor(0.0),
        "exp_avg": buffers.exp_avg,
        "exp_avg_sq": buffers.exp_avg_sq,
    }
    return with_casts(buffers, case, optimizer.step)


def make_deepspeed(buffers: Buffers, case: str, cpu_adam_class):
    with stdout_to_stderr():
        optimizer = cpu_adam_class([buffers.parameter], lr=LR, betas=BETAS, eps=EPS,
                                   weight_decay=WEIGHT_DECAY, adamw_mode=True)
    optimizer.state[buffers.parameter] = {
        "step": 0,
        "exp_avg": buffers.exp_avg,
        "exp_avg_sq": buffers.exp_avg_sq,
    }
    return with_casts(buffers, case, optimizer.step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build-dir", type=pathlib.Path, default=REPO / "build")
    parser.add_argument("--sizes", default="1e7,1e8", help="parameter counts, comma-separated")
    parser.add_argument("--reps", type=int, default=0,
                        help="timed repetitions (default: 15 below 5e7 parameters, 8 above)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--skip-deepspeed", action="store_true")
    args = parser.parse_args()
    threads = args.threads
    torch.set_num_threads(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))  # DeepSpeed's OpenMP loops

    # The bandwidth is measured before, between and after the sizes, and the best counts: on a
    # machine shared with other work, one measurement may fall in a busy moment. Lines are
    # printed at the end, once it is known.
    bandwidths = [measure_bandwidth(args.build_dir, threads)]
    records = []

    deepspeed_error = None
    cpu_adam_class = None
    if args.skip_deepspeed:
        deepspeed_error = "skipped (--skip-deepspeed)"
    else:
        try:
            cpu_adam_class = ensure_deepspeed()
        except Exception as e:  # noqa: BLE001 - any failure is reported on its lines
            deepspeed_error = f"{type(e).__name__}: {e}".strip()[:500]
            log(traceback.format_exc())

    # Read before every timed run: twice the last-level cache, so that the 1e7 case (280 MB)
    # starts from memory as the 1e8 case does, whatever ran before it.
    flush = torch.ones(flush_bytes() // 4)
    for size in (int(float(s)) for s in args.sizes.split(",")):
        reps = args.reps or (15 if size < 5e7 else 8)
        buffers = Buffers(size)
        for case in ("adam_fp32", "offload_step") + STATE_CASES + (SR_CASE,):
            if case == SR_CASE:
                impls = {"tide": lambda: make_tide(buffers, case, threads),
                         "tide_bf16_nearest": lambda: make_tide(buffers, "adam_bf16_state",
                                                                threads)}
            elif case in STATE_CASES:
                impls = {"tide": lambda: make_tide(buffers, case, threads),
                         "tide_fp32_state": lambda: make_tide(buffers, "offload_step", threads)}
            else:
                impls = {
                    "tide": lambda: make_tide(buffers, case, threads),
                    "torch_foreach": lambda: make_torch(buffers, case, {"foreach": True}),
                    "torch_fused": lambda: make_torch(buffers, case, {"fused": True}),
                }
                if cpu_adam_class is not None:
                    impls["deepspeed"] = lambda: make_deepspeed(buffers, case, cpu_adam_class)
            runs, times, errors = {}, {}, {}
            for name, make in impls.items():
                try:
                    runs[name] = make()
                    runs[name]()  # warm-up: first-touch, lazy state, thread start
                    times[name] = []
                except Exception as e:  # noqa: BLE001
                    errors[name] = f"{type(e).__name__}: {e}"[:500]
                    runs.pop(name, None)
            for _ in range(reps):
                for name, run in runs.items():
                    # No implementation finds the previous one's data in cache. A read: a
                    # written buffer would leave the cache full of dirty lines whose write-back
                    # the next implementation would pay for.
                    flush.sum()
                    # PyTorch's OpenMP threads spin for a while after the flush: let them sleep,
                    # so that every implementation starts with idle threads (ones still spinning
                    # would favour those that reuse them, and slow the others down).
                    time.sleep(0.01)
                    start = time.perf_counter()
                    run()
                    times[name].append(time.perf_counter() - start)
            base = {"bench": "cpu_adam", "case": case, "params": size, "threads": threads,
                    "bytes_per_param": BYTES_PER_PARAM[case]}
            for name in impls if case in STATE_CASES + (SR_CASE,) else (
                    "tide", "torch_foreach", "torch_fused", "deepspeed"):
                if name == "tide_fp32_state":
                    base = {**base, "bytes_per_param": BYTES_PER_PARAM["offload_step"]}
                if name in times:
                    records.append({**base, "impl": name, "seconds": min(times[name]),
                                    "median_seconds": statistics.median(times[name]),
                                    "reps": reps, "times": times[name]})
                else:
                    records.append({**base, "impl": name,
                                    "error": errors.get(name, deepspeed_error or "not run")})
        del buffers
        bandwidths.append(measure_bandwidth(args.build_dir, threads))

    best = max(bandwidths, key=lambda b: b["gbps"])
    gbps = best["gbps"]
    info = kernels.cpu_info()
    emit({"bench": "cpu_adam", "impl": "bandwidth", "threads": threads, "gbps": gbps,
          "copy_gbps": best["copy_gbps"], "triad_gbps": best["triad_gbps"],
          "update_gbps": best["update_gbps"], "adam_gbps": best["adam_gbps"],
          "adam_burst_gbps": best["adam_burst_gbps"],
          "measurements_gbps": [b["gbps"] for b in bandwidths], "tide_isa": info["isa"],
          "loadavg_1m": os.getloadavg()[0]})
    for record in records:
        if record["impl"] == "tide" and "seconds" in record:
            peers = [r for r in records if r["impl"] != "tide" and "seconds" in r
                     and (r["case"], r["params"]) == (record["case"], record["params"])]
            if peers:
                fastest = min(peers, key=lambda r: r["seconds"])
                record["fastest_peer"] = fastest["impl"]
                record["speedup_vs_fastest_peer"] = fastest["seconds"] / record["seconds"]
                # The same, paired: repetition r of both ran back to back, so their ratio is
                # hardly touched by load that comes and goes over the run.
                record["paired_speedup_vs_fastest_peer"] = statistics.median(
                    peer / mine for peer, mine in zip(fastest["times"], record["times"]))
                if record["case"] == SR_CASE:  # its one "peer": nearest rounding
                    record["speedup_vs_bf16_nearest"] = record["speedup_vs_fastest_peer"]
                    record["paired_speedup_vs_bf16_nearest"] = record[
                        "paired_speedup_vs_fastest_peer"]
                if record["case"] in STATE_CASES:  # its one "peer": fp32 state
                    record["speedup_vs_fp32_state"] = record["speedup_vs_fastest_peer"]
                    record["paired_speedup_vs_fp32_state"] = record[
                        "paired_speedup_vs_fastest_peer"]
    for record in records:
        record.pop("times", None)
        if "seconds" in record:
            size, seconds = record["params"], record["seconds"]
            record["params_per_s"] = size / seconds
            record["fraction_of_bandwidth"] = (size * record["bytes_per_param"] / seconds
                                               / (gbps * 1e9))
        emit(record)


if __name__ == "__main__":
    main()

"""DeepSpeed ZeRO-2 with offload_optimizer on the CPU (DS_ACCELERATOR=cpu, one process): the time
of engine.step() (DeepSpeed's clipping, the client optimizer's step of the flat fp32 partition,
the copy back into the model) with each client optimizer: tide.torch.AdamW with host_params=True
and without, torch.optim.AdamW's default on CPU tensors (the for-loop) and fused.

DeepSpeed is not in .venv: run it with the copy tests/python/test_deepspeed.py installs,
    DS_ACCELERATOR=cpu PYTHONPATH=.deps/deepspeed/site .venv/bin/python bench/deepspeed_step.py
One JSON line per case: best and median step time over interleaved rounds (A B C D A B C D ...:
background load hits every case alike) and the paired ratio to tide with host_params=True (median
over rounds of case time / that time in the same round). Environment: N (parameters, default 8e6),
ROUNDS (default 9).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time

for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_SIZE": "1",
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29561"}.items():
    os.environ.setdefault(key, value)

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import deepspeed  # noqa: E402

import tide.torch as tt  # noqa: E402

N = int(float(os.environ.get("N", "8e6")))
ROUNDS = int(os.environ.get("ROUNDS", "9"))
WIDTH = 1000

CASES = {
    "tide_host_params": lambda p: tt.AdamW(p, lr=1e-3, host_params=True),
    "tide": lambda p: tt.AdamW(p, lr=1e-3, host_params=False),
    "torch_default": lambda p: torch.optim.AdamW(p, lr=1e-3),
    "torch_fused": lambda p: torch.optim.AdamW(p, lr=1e-3, fused=True),
}


def engine(make_optimizer):
    torch.manual_seed(0)
    layers = max(1, N // (WIDTH * WIDTH))
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH, bias=False)
                                  for _ in range(layers)])
    config = {"train_micro_batch_size_per_gpu": 2,
              "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
              "zero_force_ds_cpu_optimizer": False, "zero_allow_untested_optimizer": True,
              "gradient_clipping": 1.0, "steps_per_print": 10**9}
    ds, _, _, _ = deepspeed.initialize(model=model, optimizer=make_optimizer(
        list(model.parameters())), config=config)
    return ds


def step_seconds(ds) -> float:
    ds.backward(ds(torch.randn(2, WIDTH)).square().mean())
    start = time.perf_counter()
    ds.step()
    return time.perf_counter() - start


def main() -> None:
    engines = {name: engine(make) for name, make in CASES.items()}
    for ds in engines.values():
        step_seconds(ds)  # first steps build state
    times: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(ROUNDS):
        for name, ds in engines.items():
            times[name].append(step_seconds(ds))
    base = times["tide_host_params"]
    for name, t in times.items():
        print(json.dumps({
            "bench": "deepspeed_step", "case": name, "params": N,
            "best_s": min(t), "median_s": statistics.median(t),
            "paired_vs_tide_host_params": statistics.median(a / b for a, b in zip(t, base)),
            "threads": torch.get_num_threads(), "machine": platform.machine(),
            "cpus": os.cpu_count()}), flush=True)
    torch.distributed.destroy_process_group()  # deepspeed.initialize opened it (gloo)


if __name__ == "__main__":
    main()
    # As tests/python/deepspeed_worker.py: without the interpreter's teardown, where gloo's
    # worker threads can still free tensors and abort the process (std::terminate).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

"""Allocator replay on a real GPU: the same allocation trace through tide's caching allocator and
through PyTorch's native one (`make gpu-check`, or `make bench BENCH=gpu_allocator_replay`).

For each transformer-shaped trace (`tide replay --synthetic SHAPE --save`: gpt2-medium, gpt-1.3b,
20 iterations), `tide replay` runs it through tide's allocator on the GPU and prints its line;
then a fresh Python process replays the saved trace through PyTorch's native allocator
(torch.cuda.caching_allocator_alloc / _delete on the trace's streams, empty_cache where the trace
empties). JSON lines, one per trace and allocator, then one comparing them:

  {"bench":"gpu_allocator_replay","trace":"gpt-1.3b","impl":"tide","peak_reserved_bytes":...,
   "peak_reserved_over_live":...,"driver_allocs":...,"seconds":...}
  {"bench":"gpu_allocator_replay","trace":"gpt-1.3b","impl":"torch_native",...}
  {"bench":"gpu_allocator_replay","trace":"gpt-1.3b","case":"ratio",
   "peak_reserved_tide_over_torch":...,"seconds_tide_over_torch":...}

Without a GPU it prints one line saying so ("skipped") and exits 0.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
TRACES = ("gpt2-medium", "gpt-1.3b")

# Replays TRACE (argv[1]) through PyTorch's native allocator; prints one JSON line.
NATIVE = r"""
import json, sys, time, torch
events = []
for line in open(sys.argv[1]):
    f = line.split()
    if not f or f[0].startswith("#") or not f[0].isdigit():
        continue
    events.append(f[1:])
torch.cuda.init()
streams = {0: torch.cuda.default_stream(0)}
live, sizes, peak_live, records = {}, {}, 0, 0
current = 0
torch.cuda.synchronize()
start = time.perf_counter()
for e in events:
    if e[0] == "alloc":
        sid = int(e[3])
        if sid not in streams:
            streams[sid] = torch.cuda.Stream(0)
        nbytes = int(e[2])
        live[e[1]] = torch.cuda.caching_allocator_alloc(nbytes, 0, streams[sid])
        sizes[e[1]] = nbytes
        current += nbytes
        peak_live = max(peak_live, current)
    elif e[0] == "free":
        torch.cuda.caching_allocator_delete(live.pop(e[1]))
        current -= sizes.pop(e[1])
    elif e[0] == "record":
        records += 1
    elif e[0] == "empty":
        torch.cuda.empty_cache()
torch.cuda.synchronize()
seconds = time.perf_counter() - start
s = torch.cuda.memory_stats(0)
print(json.dumps({"impl": "torch_native", "events": len(events), "peak_live_bytes": peak_live,
                  "peak_reserved_bytes": s["reserved_bytes.all.peak"],
                  "peak_reserved_over_live": round(s["reserved_bytes.all.peak"] / max(peak_live, 1), 4),
                  "driver_allocs": s["segment.all.allocated"], "num_alloc_retries": s["num_alloc_retries"],
                  "num_ooms": s["num_ooms"], "record_stream_events_ignored": records,
                  "seconds": round(seconds, 4)}))
"""


def emit(line: dict) -> None:
    print(json.dumps({"bench": "gpu_allocator_replay", **line}), flush=True)


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        emit({"skipped": "no GPU"})
        return 0
    tide = REPO / "build" / "bin" / "tide"
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for shape in TRACES:
            trace = pathlib.Path(tmp) / f"{shape}.trace"
            try:
                p = subprocess.run([str(tide), "replay", "--synthetic", shape, "--iterations", "20",
                                    "--save", str(trace)], capture_output=True, text=True,
                                   timeout=1200, check=True)
                ours = json.loads(p.stdout.strip().splitlines()[-1])
                emit({"trace": shape, "impl": "tide", **ours})
                p = subprocess.run([sys.executable, "-c", NATIVE, str(trace)], capture_output=True,
                                   text=True, timeout=1200, check=True,
                                   env={k: v for k, v in os.environ.items()
                                        if k != "PYTORCH_CUDA_ALLOC_CONF"})
                theirs = json.loads(p.stdout.strip().splitlines()[-1])
                emit({"trace": shape, **theirs})
                emit({"trace": shape, "case": "ratio",
                      "peak_reserved_tide_over_torch":
                          round(ours["peak_reserved_bytes"] / theirs["peak_reserved_bytes"], 4),
                      "seconds_tide_over_torch":
                          round(ours["seconds"] / max(theirs["seconds"], 1e-9), 3),
                      "driver_allocs": {"tide": ours["driver_allocs"],
                                        "torch_native": theirs["driver_allocs"]}})
            except (subprocess.SubprocessError, OSError, ValueError, KeyError, IndexError) as e:
                failed = True
                detail = getattr(e, "stderr", "") or ""
                emit({"trace": shape, "error": f"{type(e).__name__}: {e}", "stderr": detail[-2000:]})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

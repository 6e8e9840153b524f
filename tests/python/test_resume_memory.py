"""Resume without a spike (issue 27): loading a state dict needs no device memory, and the first
step after it no more than one update phase's buffers, for every placement and moment format.
(Reported against other offloading systems in 2026: a resume that moves the whole optimizer state
through the GPU runs out of memory.) Measured on the stand-in, whose device memory peak counts
every byte any party allocated there."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pathlib

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(
    "libtide_standin_cuda" not in os.environ.get("TIDE_CUDA_DRIVER", ""),
    reason="reads the stand-in driver's device memory peak")

CASES = [(placement, state_dtype) for placement in ["cpu", "gpu", 2, "auto"]
         for state_dtype in ["float32", "bfloat16", "q8"]]

# One process for every case: each saves a trained optimizer's state dict through bytes (as a
# checkpoint on disk would: nothing of the first optimizer is left), loads it into a fresh one,
# and steps once, reading the stand-in's device memory around each.
PROGRAM = r"""
import ctypes, gc, io, json, os, sys
import torch, tide.torch as tt

standin = ctypes.CDLL(os.environ["TIDE_CUDA_DRIVER"])
def used_and_peak():
    used, peak = ctypes.c_uint64(), ctypes.c_uint64()
    assert standin.tide_standin_device_memory(0, ctypes.byref(used), ctypes.byref(peak), None) == 0
    return used.value, peak.value

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)])  # 1.05M params

def train(m, opt):
    opt.zero_grad()
    m(torch.randn(8, 512)).square().mean().backward()
    opt.step()

out = []
for placement, state_dtype in json.loads(sys.argv[1]):
    dtype = "q8" if state_dtype == "q8" else getattr(torch, state_dtype)
    kwargs = dict(placement=placement, state_dtype=dtype, subgroup_size=1 << 16)
    m = model()
    opt = tt.AdamW(m.parameters(), **kwargs)
    for _ in range(2):
        train(m, opt)
    saved = io.BytesIO()
    torch.save(opt.state_dict(), saved)
    del opt, m
    gc.collect()
    saved.seek(0)
    state = torch.load(saved)

    m = model()
    opt = tt.AdamW(m.parameters(), **kwargs)
    standin.tide_standin_reset_stats()  # the peak restarts from now
    before, _ = used_and_peak()
    opt.load_state_dict(state)
    _, load_peak = used_and_peak()
    standin.tide_standin_reset_stats()
    train(m, opt)
    _, step_peak = used_and_peak()
    out.append({"placement": placement, "state_dtype": state_dtype, "before": before,
                "load_peak": load_peak, "step_peak": step_peak,
                "buffer_bytes": opt.stats[-1]["buffer_bytes"],
                "state_bytes": opt.pinned_state_bytes()})
    del opt, m, state
    gc.collect()
print(json.dumps(out))
"""


REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def measured():
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    result = subprocess.run([sys.executable, "-c", PROGRAM, json.dumps(CASES)], env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    return {(r["placement"], r["state_dtype"]): r
            for r in json.loads(result.stdout.strip().splitlines()[-1])}


@pytest.mark.parametrize("placement, state_dtype", CASES)
def test_a_resume_needs_no_more_device_memory_than_one_update_phase(measured, placement,
                                                                   state_dtype):
    r = measured[(placement, state_dtype)]
    # The state is larger than the bound below, so moving it through the device would show.
    assert r["state_bytes"] > r["buffer_bytes"] + 2 * (2 << 20), r
    # Loading puts the state in pinned host memory: nothing on the device.
    assert r["load_peak"] <= r["before"], r
    # The first step after it: the update phase's buffers (tide's allocator rounds its segments
    # to 2 MiB), nothing for the loaded state.
    assert r["step_peak"] - r["before"] <= r["buffer_bytes"] + (2 << 20), r
    if placement == "cpu":
        assert r["buffer_bytes"] == 0 and r["step_peak"] <= r["before"], r

"""bench/gpu_iteration.py (whole training iterations on a real GPU) where no GPU is needed: its
answer without a GPU, its argument checks, the model's size, the summary's ratios and the loss
agreement computed from records, and the whole flow rehearsed on the CPU over the stand-in
(--device cpu: the figures mean nothing there, the plumbing is what is checked)."""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest
from conftest import load_script

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu_iteration.py"


@pytest.fixture(scope="module")
def bench():
    return load_script(SCRIPT)


def run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def test_without_a_gpu_it_prints_one_skipped_line_and_exits_0():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = run("--smoke")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1, r.stdout
    line = json.loads(lines[0])
    assert line["bench"] == "gpu_iteration" and "no GPU" in line["skipped"]


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "--steps must be at least 1"),
    (["--blocks", "0"], "--blocks must be at least 1"),
    (["--warmup", "-1"], "--warmup must be 0 or more"),
    (["--capped-warmup", "-2"], "--capped-warmup must be 0 or more"),
    (["--d-model", "100"], "--d-model must be a multiple of 64"),
    (["--memory-fraction", "0"], "--memory-fraction must be in (0, 1]"),
    (["--memory-fraction", "1.5"], "--memory-fraction must be in (0, 1]"),
    (["--time-cap", "-3"], "--time-cap must be positive"),
    (["--loss-rtol", "0"], "--loss-rtol must be positive"),
    (["--cases", "tide_auto,tide_3"], "--cases: no case named tide_3 (the cases: torch_gpu,"),
])
def test_bad_arguments_are_refused_with_the_value(bench, capsys, args, message):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(args)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_sizes_and_their_overrides(bench):
    args = bench.parse_args([])
    assert (args.blocks, args.d_model, args.seq, args.batch) == (8, 2048, 1024, 8)
    args = bench.parse_args(["--smoke", "--blocks", "3"])
    assert (args.blocks, args.d_model) == (3, bench.SIZES["smoke"]["d_model"])
    assert bench.parse_args(["--memory-fraction", "0.25"]).memory_fraction == 0.25


def test_the_default_model_has_about_4e8_parameters(bench):
    import torch

    args = bench.parse_args([])
    count = bench.param_count(args.blocks, args.d_model, args.seq, args.vocab)
    assert abs(count - 4.0e8) / 4.0e8 < 0.05, count
    # The formula is the model's own count (built on the meta device: no memory).
    for argv in ([], ["--smoke"]):
        a = bench.parse_args(argv)
        model = bench.make_model(torch, a, "meta")
        assert sum(p.numel() for p in model.parameters()) == \
            bench.param_count(a.blocks, a.d_model, a.seq, a.vocab)
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())


def record(case, seconds, update=None, losses=(5.0, 4.0, 3.0), **extra):
    return {"case": case, "iteration_s": seconds, "update_s": update or seconds / 2,
            "losses": list(losses), **extra}


def test_the_summary_ratios(bench):
    records = [record("torch_gpu", 0.10), record("torch_offload", 0.60),
               record("tide_auto", 0.12), record("tide_cpu", 0.30),
               record("capped_tide_auto", 0.21), record("capped_tide_cpu", 0.30),
               record("capped_tide_2", 0.20), record("capped_tide_auto_host_gradients", 0.22),
               {"case": "capped_tide_gpu", "error": "OutOfMemoryError()", "oom": True},
               {"case": "tide_auto_residency_off", "not_run": "no knob"}]
    s = bench.summarize(records, 0.02)
    assert s["capped_auto_host_gradients_over_best_fixed"] == 1.1
    assert s["tide_auto_speedup_over_torch_offload"] == 5.0
    assert s["tide_auto_over_floor"] == 1.2
    assert s["capped_best_fixed"] == "capped_tide_2"
    assert s["capped_auto_over_best_fixed"] == 1.05
    assert (s["tide_auto_speedup_over_torch_offload_met"], s["tide_auto_over_floor_met"],
            s["capped_auto_over_best_fixed_met"]) == (True, True, False)
    assert s["tide_auto_speedup_over_torch_offload_target"] == ">= 2.5"
    assert s["not_run"] == ["tide_auto_residency_off"]
    assert s["failed"] == []  # a capped placement that does not fit is a finding, not a failure
    assert "tide_auto_residency_off_over_floor" not in s
    # Cases missing: their ratios are None, never a guess.
    s = bench.summarize([record("tide_auto", 0.1)], 0.02)
    assert s["tide_auto_speedup_over_torch_offload"] is None and s["tide_auto_over_floor"] is None
    assert s["tide_auto_over_floor_met"] is None and s["capped_auto_over_best_fixed"] is None
    # With residency's knob, the off case gets its own ratios.
    s = bench.summarize([record("torch_gpu", 0.1), record("torch_offload", 0.5),
                         record("tide_auto", 0.1), record("tide_auto_residency_off", 0.2)], 0.02)
    assert s["tide_auto_residency_off_over_floor"] == 2.0
    assert s["tide_auto_residency_off_speedup_over_torch_offload"] == 2.5


def test_the_update_phases_over_the_device_memory_bound(bench):
    """The floor's and all-resident tide auto's update phases over their bytes per parameter at
    the device memory's bandwidth; None where tide auto copied or sent anything to the CPU, a case
    did not run, or the bandwidth is unknown."""
    params = 10**9
    resident = {"gpu_subgroups": 25, "cpu_subgroups": 0, "resident_subgroups": 25}
    records = [record("torch_gpu", 0.1, update=0.02, params=params),
               record("tide_auto", 0.1, update=0.014, params=params, plan=resident)]
    b = bench.device_memory_bounds(records, 4000.0)
    assert b["update_bytes_per_param"] == {"tide_auto": 28, "torch_gpu": 40}
    # 40 GB at 4000 GB/s: 10 ms; 28 GB: 7 ms.
    assert b["torch_gpu_update_over_device_memory_bound"] == 2.0
    assert b["tide_auto_update_over_device_memory_bound"] == 2.0
    copied = {**resident, "resident_subgroups": 24}
    on_cpu = {**resident, "cpu_subgroups": 1}
    for plan in (copied, on_cpu):
        b = bench.device_memory_bounds(
            [record("tide_auto", 0.1, update=0.014, params=params, plan=plan)], 4000.0)
        assert b["tide_auto_update_over_device_memory_bound"] is None
    assert bench.device_memory_bounds(records, None)["torch_gpu_update_over_device_memory_bound"] \
        is None
    b = bench.device_memory_bounds([{"case": "torch_gpu", "error": "x"}], 4000.0)
    assert b["torch_gpu_update_over_device_memory_bound"] is None


def test_the_loss_agreement(bench):
    same = [record("torch_gpu", 1), record("tide_auto", 1, losses=(5.0, 4.0, 3.03))]
    a = bench.loss_agreement(same, 0.02)
    assert a["loss_reference"] == "torch_gpu" and a["losses_agree"] is True
    assert math.isclose(a["max_rel_loss_diff"], 0.01) and a["max_rel_loss_diff_case"] == "tide_auto"
    a = bench.loss_agreement(same, 0.005)
    assert a["losses_agree"] is False
    nan = [record("torch_gpu", 1), record("tide_2", 1, losses=(5.0, float("nan"), 3.0))]
    assert bench.loss_agreement(nan, 0.02)["losses_agree"] is False
    # Without the floor, the first case with losses is the reference.
    a = bench.loss_agreement([record("tide_cpu", 1), record("tide_gpu", 1)], 0.02)
    assert a["loss_reference"] == "tide_cpu" and a["max_rel_loss_diff"] == 0.0
    assert bench.loss_agreement([], 0.02)["losses_agree"] is None
    # The summary fails the run on disagreement (main's exit status reads losses_agree).
    s = bench.summarize(nan, 0.02)
    assert s["losses_agree"] is False


def test_the_default_cap_leaves_room_for_half_the_state(bench):
    records = [{"case": "tide_cpu", "iteration_s": 1.0, "params": 1000,
                "peak_device_bytes": 12000}]
    assert bench.default_fraction(records, 40000) == (12000 + 8 * 1000) / 40000
    assert bench.default_fraction([], 40000) is None
    assert bench.default_fraction(records, None) is None


def test_the_residency_cases_follow_the_knob(bench, tmp_path):
    names = [c["case"] for g in bench.groups(None) for c in g["cases"]]
    assert names == ["torch_gpu", "torch_offload", "tide_auto", "tide_cpu", "tide_gpu", "tide_2",
                     "capped_tide_auto", "capped_tide_cpu", "capped_tide_gpu", "capped_tide_2",
                     "capped_tide_auto_host_gradients",
                     "tide_auto_residency_off", "capped_tide_auto_residency_off"]
    off = [g for g in bench.groups("no knob") if g["env"].get("TIDE_RESIDENCY") == "off"]
    assert len(off) == 2 and all(g["not_run"] == "no knob" for g in off)
    assert all(g.get("not_run") is None for g in bench.groups(None))
    # Detected from `tide env`'s listing.
    fake = tmp_path / "tide"
    fake.write_text("#!/bin/sh\necho 'TIDE_PLACEMENT=(unset)'\necho 'TIDE_RESIDENCY=(unset)'\n")
    fake.chmod(0o755)
    assert bench.residency_reason(str(fake)) is None
    fake.write_text("#!/bin/sh\necho 'TIDE_PLACEMENT=(unset)'\n")
    assert "no TIDE_RESIDENCY" in bench.residency_reason(str(fake))


def test_the_flow_rehearsed_on_the_cpu():
    """Subprocesses, records, bandwidth and summary lines, the losses' agreement: on CPU tensors
    over the stand-in, a tiny model, three configurations. On a GPU machine the check runs the
    benchmark itself (bench-gpu_iteration), so this is left to machines without one."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: make gpu-check runs the benchmark itself")
    r = run("--device", "cpu", "--smoke", "--steps", "1", "--warmup", "1",
            "--cases", "torch_gpu,torch_offload,tide_auto,capped_tide_auto")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [json.loads(l) for l in r.stdout.splitlines()]
    assert all(l["bench"] == "gpu_iteration" and l["machine"]["commit"] for l in lines)
    by = {l["case"]: l for l in lines}
    assert list(by) == ["bandwidth", "torch_gpu", "torch_offload", "tide_auto",
                        "capped_tide_auto", "summary"]
    assert by["bandwidth"]["host_memory_gbps"] > 0
    # tide_membw's in-place pass and Adam's pattern beside the copy.
    assert by["bandwidth"]["host_memory_update_gbps"] > 0
    assert by["bandwidth"]["host_memory_adam_gbps"] > 0
    for case in ("torch_gpu", "torch_offload", "tide_auto"):
        assert by[case]["iteration_s"] > 0 and len(by[case]["losses"]) == 2
        # Each step's parts, the warm-up step marked, and (tide) what was resident after it.
        warm, step = by[case]["steps"]
        assert warm["warmup"] is True and "warmup" not in step
        assert by[case]["warmup_steps"] == 1 and by[case]["timed_steps"] == 1
        assert step["forward_backward_ms"] > step["forward_ms"] > 0 and step["update_ms"] > 0
        tide = case == "tide_auto"
        assert ("resident_subgroups" in step) == tide
        # tide's refined rates after the run, one dict per bucket.
        assert ("rates" in by[case]) == tide
        if tide:
            assert by[case]["rates"][0]["cpu_update"] > 0
        assert ("gradients_offloaded_in_backward" in step) == tide
        if tide:  # the tiny model's gradients go to the host in backward or at step()
            assert step["gradients_offloaded_at_step"] + step["gradients_offloaded_in_backward"] > 0
            # The pressure on resident state before the step, the eviction time in ms.
            assert step["evicted_subgroups"] == 0 and step["evict_ms"] == 0
            assert step["cache_releases"] == 0 and step["headroom_bytes"] >= 0
            assert "evict_seconds" not in step
            assert step["gpu_busy_ms"] >= 0 and step["cpu_busy_ms"] >= 0
            assert step["h2d_busy_ms"] >= 0 and step["d2h_busy_ms"] >= 0
            assert step["gpu_busy_ms"] + step["cpu_busy_ms"] > 0
            # tide's update phase alone, inside the step's update time; the plan and the
            # model's prediction for it.
            assert 0 < step["phase_ms"] <= step["update_ms"]
            assert step["predicted_ms"] > 0 and "predicted_seconds" not in step
            assert step["gpu_subgroups"] + step["cpu_subgroups"] > 0
        else:
            assert "evicted_subgroups" not in step and "phase_ms" not in step
        # CPU tensors: no device allocator to read
        assert not {"alloc_retries", "driver_allocs", "peak_live_gib"} & step.keys()
    assert "no device memory to cap" in by["capped_tide_auto"]["not_run"]
    s = by["summary"]
    assert s["losses_agree"] is True and s["max_rel_loss_diff"] <= s["loss_rtol"]
    assert s["tide_auto_speedup_over_torch_offload"] > 0 and s["tide_auto_over_floor"] > 0
    assert s["not_run"] == ["capped_tide_auto"] and s["failed"] == []
    # No device memory bandwidth on CPU tensors: no bound, and no guess.
    assert s["tide_auto_update_over_device_memory_bound"] is None
    assert s["torch_gpu_update_over_device_memory_bound"] is None


def test_a_capped_case_warms_up_longer_and_shows_its_warm_up_steps(bench):
    """Under a cap, residency backs off in the first steps: a capped case's timed steps come after
    --capped-warmup steps, not --warmup, and every step is listed, the warm-up ones marked. (Run
    in this process on CPU tensors: the cap itself needs a GPU.)"""
    import torch

    import tide.torch as tt
    if not tt.cpu_mode():
        # Failed on an H200 (gpu-check): with a GPU, tide takes CUDA parameters only. There the
        # check's own bench-gpu_iteration step runs the capped cases with their warm-up.
        pytest.skip("CPU tensors in this process need tide's CPU mode (no GPU)")

    args = bench.parse_args(["--device", "cpu", "--smoke", "--steps", "2", "--warmup", "0",
                             "--capped-warmup", "3"])
    [case] = [c for g in bench.groups(None) for c in g["cases"] if c["case"] == "capped_tide_2"]
    r = bench.run_case(torch, tt, case, args, "cpu")
    assert r["warmup_steps"] == 3 and r["timed_steps"] == 2 and len(r["losses"]) == 5
    assert [s.get("warmup", False) for s in r["steps"]] == [True, True, True, False, False]
    [case] = [c for g in bench.groups(None) for c in g["cases"] if c["case"] == "tide_2"]
    r = bench.run_case(torch, tt, case, args, "cpu")
    assert r["warmup_steps"] == 0 and [s.get("warmup", False) for s in r["steps"]] == [False] * 2


def test_a_spent_time_cap_runs_nothing_and_says_so():
    """Under 5 s left, no group starts: every case is reported as not run, the summary too, and
    that is not a failure (gpu-check's step passes with what fitted)."""
    r = run("--device", "cpu", "--smoke", "--time-cap", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [json.loads(l) for l in r.stdout.splitlines()]
    cases = [l for l in lines if l["case"] not in ("bandwidth", "summary")]
    assert len(cases) == 13 and all(l["not_run"] for l in cases)
    # (The residency-off cases may say first that this build lacks the knob.)
    assert {l["not_run"] for l in cases if not l["capped"] and l.get("residency") != "off"} == \
        {"time cap"}
    summary = lines[-1]
    assert summary["case"] == "summary" and len(summary["not_run"]) == 13
    assert summary["failed"] == [] and summary["losses_agree"] is None


def test_the_allocator_telemetry_of_a_tide_case(bench):
    """What a tide case records of tide's allocator after its steps (forecast, the last
    iteration's live and reserved peaks by phase, the last out-of-memory), in GiB; nothing
    without tide's allocator."""
    import types

    gib = 2**30
    calls = {}

    def iteration_stats(max_iterations):
        calls["max_iterations"] = max_iterations
        return [{"phases": {"forward": {"peak_live_bytes": 5 * gib, "peak_reserved_bytes": 6 * gib},
                            "update": {"peak_live_bytes": 3 * gib,
                                       "peak_reserved_bytes": 7 * gib}}}]

    alloc = types.SimpleNamespace(
        is_using_allocator=lambda: True, iteration_stats=iteration_stats,
        headroom=lambda: {"headroom_bytes": gib, "held_headroom_bytes": gib // 2,
                          "iterations": 5, "detected": False},
        last_oom=lambda: None)
    t = bench.allocator_telemetry(types.SimpleNamespace(allocator=alloc))
    assert t == {"forecast_gib": {"headroom_bytes": 1.0, "held_headroom_bytes": 0.5},
                 "last_iteration_peak_gib": {"forward": {"live": 5.0, "reserved": 6.0},
                                             "update": {"live": 3.0, "reserved": 7.0}},
                 "last_oom": None}
    assert calls["max_iterations"] >= 1
    alloc.is_using_allocator = lambda: False
    assert bench.allocator_telemetry(types.SimpleNamespace(allocator=alloc)) == {}

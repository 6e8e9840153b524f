"""bench/gpu_update_phase.py where no GPU is needed: the copy bound of the all-GPU placement and
the summary computed from made-up rates and seconds (the measurements themselves need a GPU:
make gpu-check runs the benchmark), and its one line without a GPU."""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys

import pytest
from conftest import load_script

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu_update_phase.py"


@pytest.fixture(scope="module")
def bench():
    return load_script(SCRIPT)


def test_the_bytes_each_way(bench):
    # fp32 weight and two moments (12 B) plus the bf16 gradient in, or the bf16 weight out (2 B).
    assert bench.BYTES_EACH_WAY == 4 * 3 + 2


def test_the_concurrent_term_binds_when_host_memory_is_short(bench):
    """The H200 box's shape: 55 GB/s each way alone, but about 96 GB/s of host memory for both
    directions' DMA, so each direction gets about 48 GB/s while the other runs."""
    params = 4e8  # 5.6e9 bytes each way
    seconds, by = bench.copy_bound(params, 55, 55, 48, 48)
    assert by == "both_directions"
    assert math.isclose(seconds, 5.6e9 / 48e9)
    # The older figure, each direction alone, is lower: that is why it was not the limit.
    alone = bench.copy_bound_each_alone(params, 55, 55)
    assert math.isclose(alone, 5.6e9 / 55e9) and alone < seconds
    # The slower concurrent direction is the one that counts.
    seconds, by = bench.copy_bound(params, 55, 55, 50, 40)
    assert by == "both_directions" and math.isclose(seconds, 5.6e9 / 40e9)


def test_a_single_direction_binds_when_the_directions_do_not_contend(bench):
    params = 1e9  # 14e9 bytes each way
    # h2d alone is the slowest; running both at once costs nothing.
    seconds, by = bench.copy_bound(params, 20, 28, 20, 28)
    assert (by, seconds) == ("h2d", pytest.approx(0.7))
    # d2h alone is the slowest, and slower than either direction while both run.
    seconds, by = bench.copy_bound(params, 28, 14, 25, 20)
    assert (by, seconds) == ("d2h", pytest.approx(1.0))
    # Equal rates everywhere: a tie goes to a single direction.
    seconds, by = bench.copy_bound(params, 14, 14, 14, 14)
    assert (by, seconds) == ("h2d", pytest.approx(1.0))
    # Without contention the new bound is the old one.
    assert math.isclose(bench.copy_bound(params, 20, 28, 20, 28)[0],
                        bench.copy_bound_each_alone(params, 20, 28))


def test_rates_must_be_positive(bench):
    with pytest.raises(ValueError, match="both_d2h 0"):
        bench.copy_bound(1e9, 20, 20, 20, 0)


def test_the_summary_carries_both_bounds_and_both_ratios(bench):
    params = 4e8
    rates = {"h2d": 55.0, "d2h": 55.0, "both_h2d": 48.0, "both_d2h": 48.0, "both": 96.0}
    seconds = {"tide_cpu": 0.118, "tide_gpu": 0.125, "tide_2": 0.1, "tide_auto": 0.097,
               "torch_fused_gpu": 0.02}
    s = bench.summarize(params, seconds, rates)
    bound, alone = 5.6e9 / 48e9, 5.6e9 / 55e9
    assert s["case"] == "summary" and s["bytes_each_way_per_param"] == 14
    assert s["copy_bound_seconds"] == round(bound, 4) and s["copy_bound_by"] == "both_directions"
    assert s["copy_bound_each_alone_seconds"] == round(alone, 4)
    assert s["tide_gpu_over_copy_bound"] == round(0.125 / bound, 3)  # 1.071
    assert s["tide_gpu_over_copy_bound_each_alone"] == round(0.125 / alone, 3)  # 1.228
    assert s["tide_gpu_over_copy_bound_target"] == "<= 1.10"
    assert s["tide_gpu_over_copy_bound_met"] is True
    assert s["tide_cpu_over_tide_auto"] == round(0.118 / 0.097, 3)
    assert s["tide_auto_over_torch_fused_gpu"] == round(0.097 / 0.02, 3)
    assert "tide_gpu_whole_subgroups_over_copy_bound" not in s  # that case did not run
    # Slower than 1.10x the bound: reported as not met.
    s = bench.summarize(params, {**seconds, "tide_gpu": 0.2}, rates)
    assert s["tide_gpu_over_copy_bound_met"] is False
    # The same placement without chunks, beside it.
    s = bench.summarize(params, {**seconds, "tide_gpu_whole_subgroups": 0.15}, rates)
    assert s["tide_gpu_whole_subgroups_over_copy_bound"] == round(0.15 / bound, 3)


def test_the_summary_without_some_measurements(bench):
    # The concurrent measurement failed: only the each-alone figures, never a guess.
    s = bench.summarize(4e8, {"tide_gpu": 0.125}, {"h2d": 55.0, "d2h": 55.0})
    assert "copy_bound_seconds" not in s and "tide_gpu_over_copy_bound" not in s
    assert "copy_bound_by" not in s
    assert s["tide_gpu_over_copy_bound_each_alone"] == round(0.125 / (5.6e9 / 55e9), 3)
    # No copy rates at all, and no tide gpu case: no bound, no ratio.
    s = bench.summarize(4e8, {}, {})
    assert set(s) == {"case", "bytes_each_way_per_param"}
    s = bench.summarize(4e8, {"tide_cpu": 0.1}, {"h2d": 55.0, "d2h": 55.0, "both_h2d": 48.0,
                                                 "both_d2h": 48.0})
    assert s["copy_bound_by"] == "both_directions" and "tide_gpu_over_copy_bound" not in s


def test_without_a_gpu_it_prints_one_skipped_line_and_exits_0():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: make gpu-check runs the benchmark itself")
    r = subprocess.run([sys.executable, str(SCRIPT), "--steps", "1"], capture_output=True,
                       text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1, r.stdout
    line = json.loads(lines[0])
    assert line == {"bench": "gpu_update_phase", "skipped": "no GPU"}

"""`tide plan --held-memory`: the subgroups placement auto keeps resident in the memory free
through a whole iteration (planner/residency.h), and the plan around them
(planner/resident_plan.h), taken only where the model predicts it no slower.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

# 10 subgroups of 4e7 parameters; fp32 state (12 B/param) and bf16 gradients and weights.
PARAMS, SUBGROUP = 4e8, 4e7
SLOT = int(SUBGROUP * 12)
COST = SLOT + int(SUBGROUP * 2)           # a resident subgroup: its slot and its kept gradient
LANE = SLOT + int(SUBGROUP * (2 + 2))     # held while one is updated
RATES = ["--cpu-update", "1e9", "--cpu-update-contended", "1e9", "--h2d-gbps", "10",
         "--d2h-gbps", "10", "--h2d-duplex-gbps", "10", "--d2h-duplex-gbps", "10",
         "--gpu-update", "1e11", "--host-memory-gbps", "10000",
         "--host-memory-contended-gbps", "10000"]


@pytest.fixture
def plan(build_dir, tmp_path):
    def run(*args, ok=True):
        env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "no-cache"), TIDE_CALIBRATION_FILE="")
        r = subprocess.run([str(build_dir / "bin" / "tide"), "plan", "--params", str(PARAMS),
                            "--subgroup-params", str(SUBGROUP), *RATES, *args],
                           env=env, capture_output=True, text=True, timeout=60)
        if ok:
            assert r.returncode == 0, r.stderr
        return r
    return run


def held_for(subgroups: int) -> int:
    """Held memory in which `subgroups` join beside a lane (5% hysteresis), and no more."""
    return LANE + int(subgroups * COST / 0.95) + 1


def test_as_many_subgroups_as_the_held_memory_fits_are_resident(plan):
    out = json.loads(plan("--free-memory", "100GB", "--held-memory", str(held_for(3)),
                          "--json").stdout)
    r = out["residency"]
    assert out["workload"]["held_bytes"] == held_for(3)
    assert r["resident_subgroups"] == 3 and r["chosen"]
    assert r["resident_state_bytes"] == 3 * SLOT
    assert r["kept_gradient_bytes"] == 3 * int(SUBGROUP * 2)
    resident = [s["index"] for s in out["plan"]["subgroups"] if s.get("resident")]
    assert resident == [0, 1, 2]
    assert out["plan"]["gpu_order"][:3] == [0, 1, 2]
    assert out["plan"]["resident_state_bytes"] == 3 * SLOT
    assert out["plan"]["predicted"]["phase_s"] == r["steady_phase_s"]
    # One byte less: two fit.
    out = json.loads(plan("--free-memory", "100GB", "--held-memory", str(held_for(3) - 2),
                          "--json").stdout)
    assert out["residency"]["resident_subgroups"] == 2


def test_the_phase_they_join_in_copies_their_states_in(plan):
    # Room for all: every update is resident, and only the first phase copies anything.
    r = json.loads(plan("--free-memory", "100GB", "--held-memory", "100GB",
                        "--json").stdout)["residency"]
    assert r["resident_subgroups"] == 10 and r["chosen"]
    kernels = PARAMS / 1e11
    assert r["steady_phase_s"] == pytest.approx(kernels)
    assert r["first_phase_s"] == pytest.approx(kernels + 10 * SLOT / 10e9)
    assert r["steady_phase_s"] < r["without_phase_s"]


def test_residency_that_would_take_the_lanes_is_not_taken(plan):
    # The update phase has room for two lanes only, all of it held: one resident subgroup would
    # leave the other nine to the CPU (0.36 s), slower than copying some in beside it.
    free = str(2 * LANE)
    without = json.loads(plan("--free-memory", free, "--json").stdout)
    out = json.loads(plan("--free-memory", free, "--held-memory", free, "--json").stdout)
    r = out["residency"]
    assert r["resident_subgroups"] == 1 and not r["chosen"]
    assert r["steady_phase_s"] == pytest.approx(9 * SUBGROUP / 1e9)
    assert r["without_phase_s"] == without["plan"]["predicted"]["phase_s"] < r["steady_phase_s"]
    assert out["plan"] == without["plan"]
    table = plan("--free-memory", free, "--held-memory", free).stdout
    assert "not taken, the plan above has none" in table and "GPU*" not in table


def test_the_table_marks_resident_subgroups_and_their_memory(plan):
    table = plan("--free-memory", "100GB", "--held-memory", str(held_for(3))).stdout
    rows = [line for line in table.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    assert [line.split()[2] for line in rows[:4]] == ["GPU*", "GPU*", "GPU*", "GPU"]
    assert "(GPU*: resident, its state kept in device memory and updated in place)" in table
    assert "of resident state (3 subgroups)" in table
    assert "residency        3 subgroups resident" in table
    assert "the plan above keeps them" in table


def test_held_memory_that_fits_no_subgroup_says_so(plan):
    out = json.loads(plan("--free-memory", "100GB", "--held-memory", str(LANE), "--json").stdout)
    assert out["residency"]["resident_subgroups"] == 0 and not out["residency"]["chosen"]
    assert "steady_phase_s" not in out["residency"]
    table = plan("--free-memory", "100GB", "--held-memory", str(LANE)).stdout
    assert "fits no subgroup's state beside a lane" in table


def test_without_held_memory_nothing_is_resident(plan):
    out = json.loads(plan("--free-memory", "100GB", "--json").stdout)
    assert "residency" not in out and "held_bytes" not in out["workload"]
    assert not any(s.get("resident") for s in out["plan"]["subgroups"])


@pytest.mark.parametrize("args, message", [
    (["--free-memory", "1GB", "--held-memory", "2GB"],
     "--held-memory 2GB is more than --free-memory 1GB"),
    (["--free-memory", "1GB", "--held-memory", "50%"], "--held-memory 50% needs --gpu-memory"),
    (["--free-memory", "1GB", "--held-memory", "lots"], '--held-memory="lots" is not valid'),
])
def test_bad_held_memory_is_refused(plan, args, message):
    r = plan(*args, ok=False)
    assert r.returncode == 1 and message in r.stderr and not r.stdout


def test_held_memory_as_a_percentage_of_the_gpu(plan):
    out = json.loads(plan("--gpu-memory", "80GB", "--free-memory", "60%", "--held-memory", "50%",
                          "--json").stdout)
    assert out["workload"]["held_bytes"] == 40 * 10**9

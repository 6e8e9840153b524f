"""The `tide` command against inputs a careless or hostile user gives it: each is refused with a
message and a non-zero exit status, runs nothing it should not, and destroys nothing.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest


@pytest.fixture
def tide(build_dir):
    def run(*args, env=None, cwd=None, timeout=120):
        full = dict(os.environ, **(env or {}))
        return subprocess.run([str(build_dir / "bin" / "tide"), *args], env=full, cwd=cwd,
                              capture_output=True, text=True, timeout=timeout)
    return run


# ---- tide run ----

def test_tide_run_help_is_not_an_error(tide):
    r = tide("run", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: tide run")


def test_tide_run_report_needs_a_path_not_the_separator(tide, tmp_path):
    r = tide("run", "--report", "--", "true", cwd=tmp_path)
    assert r.returncode == 2
    assert "--report needs a path, not '--'" in r.stderr
    assert not (tmp_path / "--").exists()


@pytest.mark.parametrize("variable, value, accepts", [
    ("TIDE_MEMORY_LIMIT", "0", "a size greater than 0"),
    ("TIDE_ALLOC_MAX_BYTES", "0", "a size greater than 0"),
    ("TIDE_STACK_SAMPLE", "0", "an integer from 1 to 1000000000"),
    ("TIDE_PINNED_CHUNK", "1MiB", "a size from 4MiB to 1TiB"),
    ("TIDE_PLACEMENT", "k0", "auto, cpu, gpu, or an integer K >= 1"),
    ("TIDE_STATE_DTYPE", "bf16", "float32, bfloat16 or q8"),
    ("TIDE_MASTER_DTYPE", "bf16", "float32 or bfloat16"),
    ("TIDE_STATE_ROUNDING", "Stochastic", "nearest or stochastic"),
])
def test_tide_run_refuses_a_bad_knob_before_the_program_starts(tide, tmp_path, variable, value,
                                                              accepts):
    marker = tmp_path / "ran"
    r = tide("run", "--", "touch", str(marker), env={variable: value}, cwd=tmp_path)
    assert r.returncode == 2
    assert f'tide run: {variable}="{value}" is not valid' in r.stderr and accepts in r.stderr
    assert "nothing was run" in r.stderr
    assert not marker.exists()


def test_tide_run_limit_zero_is_refused(tide, tmp_path):
    r = tide("run", "--limit", "0", "--", "true", cwd=tmp_path)
    assert r.returncode == 2 and '--limit="0" is not valid' in r.stderr


def test_tide_env_marks_a_value_tide_refuses(tide):
    r = tide("env", env={"TIDE_PINNED_CHUNK": "1MiB", "TIDE_CPU_THREADS": "4"})
    assert r.returncode == 1
    assert "TIDE_PINNED_CHUNK=1MiB   <- invalid" in r.stdout
    assert "TIDE_CPU_THREADS=4\n" in r.stdout  # a good value is not marked
    assert "1 variable is set to a value tide refuses" in r.stderr


# ---- tide replay ----

def write_trace(path, *events):
    path.write_text("tide-trace 1\n" + "".join(e + "\n" for e in events))
    return str(path)


@pytest.mark.parametrize("events, message", [
    (["0 alloc 1 4096 4294967295"], "stream '4294967295' is not an integer from 0 to 256"),
    (["0 alloc 1 -4096 0"], "bytes '-4096' is not an integer"),
    (["-5 alloc 1 4096 0"], "expected a time in nanoseconds, found '-5'"),
    (["0 alloc 1 4096 0", "1 alloc 1 4096 0"], "id 1 allocated again"),
    (["0 alloc 1 4096 0", "1 free 1", "2 free 1"], "free of id 1, which was freed already"),
    (["0 free 9"], "free of id 9, which was never allocated"),
])
def test_tide_replay_refuses_a_hostile_trace_naming_its_line(tide, tmp_path, events, message):
    path = write_trace(tmp_path / "t.trace", *events)
    r = tide("replay", path)
    assert r.returncode == 1
    assert f"tide replay: {path}:{len(events) + 1}: {message}" in r.stderr


@pytest.mark.parametrize("args, message", [
    (["--iterations", "99999999999"], "--iterations accepts an integer from 1 to 100000"),
    (["--iterations", "-1"], "--iterations accepts an integer from 1 to 100000"),
    (["--jitter", "abc"], '--jitter="abc" is not valid'),
    (["--device", "-1"], '--device="-1" is not valid'),
])
def test_tide_replay_bounds_its_options(tide, args, message):
    r = tide("replay", "--synthetic", "gpt-tiny", *args)
    assert r.returncode == 1 and message in r.stderr


def test_tide_replay_prints_valid_json_whatever_the_trace_is_named(tide, tmp_path):
    # A file name may hold any byte but '/' and NUL: the JSON line quotes it as JSON does.
    path = write_trace(tmp_path / 'a "quoted"\ttab\\back\x01slash.trace', "0 alloc 1 4096 0")
    r = tide("replay", path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["trace"] == path


def test_tide_replay_says_why_it_exits_non_zero(tide, tmp_path):
    path = write_trace(tmp_path / "big.trace", "0 alloc 1 100000000000000 0")
    r = tide("replay", path)
    assert r.returncode == 1
    assert "tide replay: 1 of 1 allocations failed (out of device memory)" in r.stderr


# ---- tide calibrate ----

def test_tide_calibrate_refuses_paths_that_are_not_its_own_before_measuring(tide, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, reason in [("/dev/null", "is a device"), (str(fifo), "is a FIFO"),
                         (str(notes), "exists and is not a file tide wrote")]:
        r = tide("calibrate", "--output", path)
        assert r.returncode == 1, r.stdout
        assert f"tide calibrate: calibration {path}: {reason}" in r.stderr
        assert "tide calibrate:" not in r.stdout  # nothing was measured
    assert notes.read_text() == "mine\n" and fifo.is_fifo()
    r = tide("calibrate", env={"TIDE_CALIBRATION_FILE": "/dev/null"})
    assert r.returncode == 1 and "is a device" in r.stderr


def test_tide_calibrate_writes_through_a_symlink(tide, tmp_path):
    target = tmp_path / "real.json"
    link = tmp_path / "link.json"
    link.symlink_to(target.name)
    r = tide("calibrate", "--params", "65536", "--repeats", "1", "--output", str(link))
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and '"tide-calibration"' in target.read_text()


# The CPU update of each state format, measured against fp32 state's, goes into the calibration
# file; tide plan scales whatever fp32 CPU rate it has (here TIDE_RATE_CPU_UPDATE's) by the file's
# factor for the format asked for, and says so; a file without them falls back to the model.
FORMATS = [("bfloat16", "float32", "bf16_moments", "bf16 moments"),
           ("q8", "float32", "q8_moments", "8-bit moments"),
           ("float32", "bfloat16", "bf16_master", "bf16 master, fp32 moments"),
           ("bfloat16", "bfloat16", "bf16_master_bf16_moments", "bf16 master, bf16 moments")]


def plan_json(tide, calibration, state_dtype, master_dtype):
    r = tide("plan", "--params", "1e9", "--free-memory", "0", "--calibration", str(calibration),
             "--state-dtype", state_dtype, "--master-dtype", master_dtype, "--json",
             env={"TIDE_RATE_CPU_UPDATE": "1e8", "TIDE_RATE_H2D_GBPS": "1000"})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_tide_calibrate_measures_each_state_formats_cpu_update_for_tide_plan(tide, tmp_path):
    path = tmp_path / "calibration.json"
    r = tide("calibrate", "--params", "65536", "--repeats", "1", "--output", str(path))
    assert r.returncode == 0, r.stderr
    factors = json.loads(path.read_text())["cpu_update_factors"]
    assert sorted(factors) == sorted(key for _, _, key, _ in FORMATS)
    # The same while copies run: factors of the contended CPU update rate.
    contended = json.loads(path.read_text())["cpu_update_contended_factors"]
    assert sorted(contended) == sorted(factors)
    assert "the same while copies run" in r.stdout
    for _, _, key, description in FORMATS:
        assert 0.01 <= factors[key] <= 100
        assert 0.01 <= contended[key] <= 100
        assert f"  {description}" in r.stdout
    for state_dtype, master_dtype, key, _ in FORMATS:
        out = plan_json(tide, path, state_dtype, master_dtype)
        assert out["workload"]["cpu_update_scale"] == factors[key]
        assert out["workload"]["cpu_update_scale_source"] == "calibration file"
        assert out["workload"]["cpu_update_contended_scale"] == contended[key]
        assert out["rates"]["cpu_update_factors"][key] == {"factor": factors[key],
                                                           "source": "calibration file"}
        # All on the CPU (no headroom): 1e9 parameters at TIDE_RATE_CPU_UPDATE times the factor.
        assert out["plan"]["predicted"]["all_cpu_s"] == pytest.approx(10 / factors[key])
    table = tide("plan", "--params", "1e9", "--free-memory", "0", "--calibration", str(path),
                 "--state-dtype", "q8").stdout
    assert "(measured: the calibration file's)" in table
    assert "8-bit moments" in table and "calibration file (measured)" in table

    # A file without them (older ones): the model's factors, said to be the model's.
    old = json.loads(path.read_text())
    del old["cpu_update_factors"]
    del old["cpu_update_contended_factors"]
    path.write_text(json.dumps(old))
    model = {"bf16_moments": 28 / 20, "q8_moments": 0.35, "bf16_master": 28 / 26,
             "bf16_master_bf16_moments": 28 / 18}
    for state_dtype, master_dtype, key, _ in FORMATS:
        out = plan_json(tide, path, state_dtype, master_dtype)
        assert out["workload"]["cpu_update_scale"] == pytest.approx(model[key])
        assert out["workload"]["cpu_update_scale_source"] == "model"
        assert out["workload"]["cpu_update_contended_scale"] == pytest.approx(model[key])
        assert out["plan"]["predicted"]["all_cpu_s"] == pytest.approx(10 / model[key])


def test_tide_calibrate_ranks_measures_the_formats_with_all_ranks_at_once(tide, tmp_path):
    path = tmp_path / "calibration.json"
    r = tide("calibrate", "--ranks", "2", "--params", "65536", "--repeats", "1",
             "--output", str(path))
    assert r.returncode == 0, r.stderr
    assert "(the slowest rank's over the slowest rank's)" in r.stdout
    saved = json.loads(path.read_text())
    assert len(saved["ranks"]) == 2
    assert sorted(saved["cpu_update_factors"]) == sorted(key for _, _, key, _ in FORMATS)
    # The ranks run no copies while they measure the formats: no contended factors (the planner
    # applies the free ones to both rates).
    assert "cpu_update_contended_factors" not in saved

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
    ("TIDE_STATE_DTYPE", "bf16", "float32 bfloat16 q8"),
    ("TIDE_MASTER_DTYPE", "bf16", "float32 bfloat16"),
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

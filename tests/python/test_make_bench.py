"""`make bench` prints the benchmarks' JSON lines on stdout and nothing else, so that its output
can be piped into a JSON-lines reader (the build's own output goes to stderr)."""

import json
import os
import subprocess

from conftest import REPO


def test_make_bench_stdout_is_json_lines_only():
    # bench_interpose: the quickest benchmark (well under a second); the build is up to date
    # when the tests run, so `make` only checks it (ninja still prints on that path).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    out = subprocess.run(["make", "--no-print-directory", "bench", "BENCH=interpose"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=600, check=True)
    lines = out.stdout.splitlines()
    assert lines, out.stderr
    for line in lines:
        record = json.loads(line)  # a build line here is a JSONDecodeError naming it
        assert isinstance(record, dict) and "bench" in record, line


def test_a_benchmark_without_a_driver_says_why_instead_of_aborting():
    env = {**os.environ, "TIDE_CUDA_DRIVER": "/nonexistent/libcuda.so.1"}
    out = subprocess.run([str(REPO / "build" / "bin" / "bench_allocator")], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, (out.returncode, out.stderr)  # an abort: -6
    assert out.stderr.startswith("bench_allocator: tide: no CUDA driver"), out.stderr

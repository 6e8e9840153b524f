"""The offline GPU check's parts (make gpu-bundle, GPU_BUNDLE=... make gpu-check), kept from rotting
between the rare days a GPU is lent: the C++ tests' manifest and its runner
(scripts/ctest_manifest.py), the labels that say which C++ tests run on the real driver, the
crash-resume pytest driver (scripts/pytest_resume.py), and gpu_check.sh's answers without a GPU.
The whole flow is rehearsed by `GPU_CHECK_STANDIN=1` (docs/contributing/testing.md); that takes minutes.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import load_script

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"


def run(args: list, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120,
                          **kwargs)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> dict:
    build_dir = pathlib.Path(os.environ.get("TIDE_BUILD_DIR", REPO / "build"))  # as conftest.py
    if not (build_dir / "CMakeCache.txt").is_file() or shutil.which("ctest") is None:
        pytest.skip("no build tree with ctest (make build)")
    out = tmp_path_factory.mktemp("manifest") / "ctest-manifest.json"
    r = run([sys.executable, SCRIPTS / "ctest_manifest.py", "generate", build_dir, out])
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())


def test_the_manifest_names_no_path_of_this_tree(manifest):
    assert str(REPO) not in json.dumps(manifest)
    names = [t["name"] for t in manifest["tests"]]
    assert len(names) == len(set(names)) > 50
    driver_test = next(t for t in manifest["tests"] if t["name"] == "driver_test")
    assert driver_test["command"] == ["@BUILD@/bin/driver_test"]
    assert driver_test["working_directory"] == "@BUILD@/tests/driver"
    assert "TIDE_CUDA_DRIVER=@BUILD@/lib/libtide_standin_cuda.so" in driver_test["environment"]


def test_real_driver_tests_need_nothing_of_the_stand_in(manifest):
    """The label's promise, as far as the manifest shows it: no stand-in knob, no fake libcuda, no
    stand-in name expected, and not also a gpu test (tests/CMakeLists.txt)."""
    labelled = {t["name"]: t for t in manifest["tests"] if "real_driver" in t["labels"]}
    gpu = {t["name"] for t in manifest["tests"] if "gpu" in t["labels"]}
    assert {"driver_test", "executor_numerics_test", "allocator_capi_test"} <= set(labelled)
    assert gpu == {"kernels_adam_gpu_test", "pinned_gpu_test"}
    assert not gpu & set(labelled)
    for name, t in labelled.items():
        env = " ".join(t["environment"])
        assert "TIDE_STANDIN_" not in env and "fakecuda" not in env, name
        assert not any("stand-in" in r for r in t["pass_regular_expression"]), name
    for name in ("standin_test", "allocator_caching_test", "executor_overlap_test",
                 "driver_node_share_test", "tide_calibrate_roundtrip", "interpose_cudart_test"):
        assert name not in labelled


def test_the_runner_keeps_ctests_rules(tmp_path):
    """Pass expressions, the skip code, the time limit, a missing working directory, paths, the
    driver swap of --driver real, and a command put before each test's (--wrap: the sanitizer)."""
    build = tmp_path / "build"
    build.mkdir()

    def test(name, script, **extra):
        return {"name": name, "command": ["/bin/sh", "-c", script], "labels": ["x"],
                "environment": ["TIDE_CUDA_DRIVER=@BUILD@/lib/libtide_standin_cuda.so",
                                "WHERE=@BUILD@"],
                "working_directory": "@BUILD@/tests/made", "timeout": 600,
                "pass_regular_expression": [], "skip_return_code": None, **extra}

    manifest = {"version": 1, "tests": [
        test("plain", 'test "$(pwd -P)" = "$(cd "$WHERE" && pwd -P)/tests/made"'),
        test("regex", "echo status=3; exit 1", pass_regular_expression=["status=3\n"]),
        test("regex_missed", "echo status=4", pass_regular_expression=["status=3"]),
        test("skipped", "exit 77", skip_return_code=77),
        test("slow", "sleep 30", timeout=1),
        test("driver", 'echo "driver=$TIDE_CUDA_DRIVER"',
             pass_regular_expression=["driver=libcuda"]),
        {**test("other", 'test "$WRAPPED" = 1'), "labels": ["y"]},
    ]}
    path = build / "ctest-manifest.json"
    path.write_text(json.dumps(manifest))
    out = tmp_path / "results.json"
    r = run([sys.executable, SCRIPTS / "ctest_manifest.py", "run", path, "--label", "x",
             "--driver", "real", "-j", "4", "--json", out])
    assert r.returncode == 1, r.stdout + r.stderr
    status = {x["name"]: x["status"] for x in json.loads(out.read_text())["results"]}
    assert status == {"plain": "passed", "regex": "passed",
                      "regex_missed": "failed (output does not match)", "skipped": "skipped",
                      "slow": "failed (over 1 s)", "driver": "passed"}, r.stdout
    r = run([sys.executable, SCRIPTS / "ctest_manifest.py", "run", path, "--label", "y",
             "--wrap", "env WRAPPED=1"])
    assert r.returncode == 0 and "1 passed, 0 skipped, 0 failed out of 1" in r.stdout


SYNTHETIC = textwrap.dedent("""
    import ctypes, time

    def test_first():
        pass

    def test_second_segfaults():
        ctypes.string_at(0)

    def test_third_fails():
        assert False

    def test_fourth_hangs():
        time.sleep(60)

    def test_fifth():
        pass
""")


def test_a_crash_ends_one_test_and_the_run_goes_on_in_order(tmp_path):
    (tmp_path / "test_synthetic.py").write_text(SYNTHETIC)
    out = tmp_path / "summary.json"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    r = run([sys.executable, SCRIPTS / "pytest_resume.py", "--timeout", "3", "--json", out, "--",
             "-q", "-p", "no:cacheprovider", tmp_path / "test_synthetic.py"],
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": "", "TMPDIR": str(scratch)})
    assert r.returncode == 1, r.stdout + r.stderr
    # Its work folder (the rounds' progress files) went with it: every run made one in /tmp.
    assert list(scratch.iterdir()) == []
    s = json.loads(out.read_text())
    name = "test_synthetic.py::"
    # In the file's order, each test once: the run resumed after each crash.
    assert s["crashes"] == [{"test": name + "test_second_segfaults", "reason": "killed by SIGSEGV"},
                            {"test": name + "test_fourth_hangs",
                             "reason": "over the per-test time limit"}], r.stdout
    assert s["failures"] == [name + "test_third_fails"]
    # Why it failed, kept as it happened (a run cut at its deadline prints no summary).
    assert "assert False" in s["failure_messages"][name + "test_third_fails"]
    assert {k: s[k] for k in ("collected", "passed", "failed", "crashed", "not_run", "rounds")} == \
        {"collected": 5, "passed": 2, "failed": 1, "crashed": 2, "not_run": 0, "rounds": 3}


def test_a_run_cut_at_its_deadline_names_what_it_did_not_reach(tmp_path, monkeypatch):
    """The H200's suite needed more than the loan left: the summary names the tests not run and
    the failures' reasons, and gpu-check's report lists the files for the next run."""
    (tmp_path / "test_slow.py").write_text(
        "import time\n\ndef test_fails():\n    assert 1 == 2, 'the reason'\n\n"
        "def test_slow():\n    time.sleep(60)\n\ndef test_never():\n    pass\n")
    out = tmp_path / "summary.json"
    r = run([sys.executable, SCRIPTS / "pytest_resume.py", "--deadline", "8", "--json", out, "--",
             "-q", "-p", "no:cacheprovider", tmp_path / "test_slow.py"], cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    s = json.loads(out.read_text())
    assert s["status"].startswith("cut at the deadline")
    assert s["not_run_tests"] == ["test_slow.py::test_slow", "test_slow.py::test_never"]
    assert "the reason" in s["failure_messages"]["test_slow.py::test_fails"]

    gpu_check = load_script(SCRIPTS / "gpu_check.py")
    figures = gpu_check.pytest_figures(out, {})
    assert figures["not_run_files"] == {"test_slow.py": 2}
    report = {"machine": gpu_check.machine(), "bundle": None, "mode": "m", "archs": "", "passed": False,
              "seconds": 1, "budget_seconds": 1, "time_scale": 1,
              "steps": [{"step": "pytest", "status": "failed", "seconds": 1, "figures": figures}]}
    page = gpu_check.markdown(report)
    assert "- failed: `test_slow.py::test_fails`: `E       AssertionError: the reason`" in page
    assert "- not reached: `test_slow.py` (2 tests)" in page
    assert 'GPU_CHECK_PYTEST_ARGS="test_slow.py"' in page


def test_the_report_tabulates_each_steps_figures():
    """gpu_iteration's per-step records become a table per case in report.md (the capped cases'
    question: in which steps, and where, the time outside the update went)."""
    gpu_check = load_script(SCRIPTS / "gpu_check.py")
    line = {"bench": "gpu_iteration", "case": "capped_tide_auto",
            "steps": [{"warmup": True, "forward_ms": 20.5, "update_ms": 90.1, "evicted_subgroups": 3,
                       "evict_ms": 12.25},
                      {"forward_ms": 14.0, "update_ms": 92.0, "evicted_subgroups": 0,
                       "evict_ms": 0.0, "cache_releases": 1}]}
    report = {"machine": gpu_check.machine(), "bundle": None, "mode": "m", "archs": "",
              "passed": True, "seconds": 1, "budget_seconds": 1, "time_scale": 1,
              "steps": [{"step": "bench-gpu_iteration", "status": "passed", "seconds": 1,
                         "figures": {"lines": [line, {"case": "summary"}]}},
                        # Another benchmark's "steps" is a count, not records (the report
                        # raised on it in a rehearsal).
                        {"step": "bench-x", "status": "passed", "seconds": 1,
                         "figures": {"lines": [{"bench": "x", "steps": 5}]}}]}
    page = gpu_check.markdown(report)
    assert "`capped_tide_auto`, per step:" in page
    assert ("| step | forward_ms | update_ms | evicted_subgroups | evict_ms | cache_releases |"
            in page)
    assert "| 1 (warm-up) | 20.5 | 90.1 | 3 | 12.25 |  |" in page
    assert "| 2 | 14.0 | 92.0 | 0 | 0.0 | 1 |" in page
    assert page.count("per step:") == 1  # the summary has no steps


def test_a_clean_run_is_one_process(tmp_path):
    (tmp_path / "test_ok.py").write_text("def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    out = tmp_path / "summary.json"
    r = run([sys.executable, SCRIPTS / "pytest_resume.py", "--json", out, "--", "-q",
             "-p", "no:cacheprovider", tmp_path / "test_ok.py"], cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads(out.read_text())
    assert (s["passed"], s["rounds"], s["crashed"], s["status"]) == (2, 1, 0, "finished")


def test_gpu_check_without_a_gpu_says_so_in_one_line(tmp_path):
    if shutil.which("nvidia-smi") and "GPU " in run(["nvidia-smi", "-L"]).stdout:
        pytest.skip("this machine has a GPU")
    # Not the settings of a gpu-check this test may run under (the rehearsal's).
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_")}
    r = run([SCRIPTS / "gpu_check.sh"], env={**env, "GPU_BUNDLE": str(tmp_path / "none")})
    assert (r.returncode, r.stdout.count("\n")) == (0, 1) and "no GPU" in r.stdout, r.stdout
    r = run([SCRIPTS / "gpu_check.sh"], env={**env, "GPU_CHECK_STANDIN": "1"})
    assert r.returncode == 2 and "set GPU_BUNDLE" in r.stderr


def test_the_steps_fit_nine_and_a_half_minutes():
    gpu_check = load_script(SCRIPTS / "gpu_check.py")
    assert sum(gpu_check.STEPS.values()) <= gpu_check.BUDGET <= 9.5 * 60 - 15  # 15 s: the report
    assert list(gpu_check.STEPS)[-1] == gpu_check.ELASTIC == "pytest"
    steps = gpu_check.Steps({}, gpu_check.BUDGET, 1)
    # The Python suite, last, gets all that the steps before it left, the others their own limits...
    assert abs(steps.left("pytest") - gpu_check.BUDGET) < 1
    assert steps.left("example") == gpu_check.STEPS["example"]
    # ... and nothing runs past the budget.
    steps.deadline -= gpu_check.BUDGET - 20
    assert steps.left("pytest") <= 20 and steps.left("example") <= 20


def test_on_a_python_without_tide_the_check_makes_one_that_imports_it(tmp_path):
    """A lent machine's python3 has torch but no tide, and the tests run programs without
    PYTHONPATH (as a user's shell would): the check runs them with a virtual environment over
    that python which sees its packages and tide's source tree, changing nothing of it."""
    gpu_check = load_script(SCRIPTS / "gpu_check.py")
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    machine = tmp_path / "machine"  # the machine's python: one package of its own, no tide
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(machine)], check=True,
                   env=clean)
    purelib = subprocess.check_output(
        [machine / "bin" / "python", "-c",
         "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip()
    (pathlib.Path(purelib) / "machines_own.py").write_text("WHERE = 'machine'\n")
    probe = "import tide, machines_own; print(machines_own.WHERE, tide.__file__)"
    before = run([machine / "bin" / "python", "-c", probe], env=clean, cwd=tmp_path)
    assert before.returncode != 0 and "No module named 'tide'" in before.stderr

    python = gpu_check.python_that_imports_tide(str(machine / "bin" / "python"), tmp_path / "v")
    assert python == str(tmp_path / "v" / "bin" / "python")
    after = run([python, "-c", probe], env=clean, cwd=tmp_path)
    assert after.returncode == 0, after.stderr
    where, path = after.stdout.split()
    assert where == "machine" and pathlib.Path(path).is_relative_to(REPO / "python")
    assert sorted(p.name for p in pathlib.Path(purelib).iterdir()) == ["machines_own.py"]
    # A python that imports tide already (.venv's) is used as it is.
    assert gpu_check.python_that_imports_tide(sys.executable, tmp_path / "w") == sys.executable
    assert not (tmp_path / "w").exists()


def test_a_cuda_context_error_in_any_log_fails_its_step(tmp_path, monkeypatch):
    """The first real GPU's symptoms (issue 25) fail the check wherever they are printed, even in
    a step whose command exited 0 (a fault tide redid on the CPU still logged it)."""
    gpu_check = load_script(SCRIPTS / "gpu_check.py")
    monkeypatch.setattr(gpu_check, "REPO", tmp_path)
    (tmp_path / "clean.log").write_text("fine\nCUDA_ERROR_DEVICE_UNAVAILABLE: no context error\n")
    (tmp_path / "dirty.log").write_text(
        "step 1\n"
        "tide: cuEventRecord failed: CUDA_ERROR_CONTEXT_IS_DESTROYED (context is destroyed)\n"
        "RuntimeError: CUDA error: invalid device context\n")
    steps = [{"step": "clean", "status": "passed", "log": "clean.log", "figures": {}},
             {"step": "dirty", "status": "passed", "log": "dirty.log", "figures": {}},
             {"step": "gone", "status": "passed", "log": "missing.log", "figures": {}}]
    gpu_check.fail_on_context_errors(steps)
    assert [s["status"] for s in steps] == ["passed", "failed (CUDA context errors in its log)",
                                            "passed"]
    assert len(steps[1]["figures"]["context_errors"]) == 2


def test_the_check_runs_whole_iterations_within_their_step():
    """bench/gpu_iteration.py is a step of the check (the last before the Python suite), with fewer steps than its default
    and a time cap inside what is left of the step's limit when it starts, so that it prints its
    summary before the check would end it."""
    gpu_check = load_script(SCRIPTS / "gpu_check.py")
    assert list(gpu_check.STEPS)[-2] == "bench-gpu_iteration"
    source = (SCRIPTS / "gpu_check.py").read_text()
    assert '"gpu_iteration")' in source and (REPO / "bench" / "gpu_iteration.py").is_file()
    steps = gpu_check.Steps({}, gpu_check.BUDGET, 1)
    options = gpu_check.bench_options(steps, "gpu_iteration")
    assert options[:4] == ["--steps", "3", "--warmup", "1"]
    cap = float(options[options.index("--time-cap") + 1])
    assert 0 < cap <= gpu_check.STEPS["bench-gpu_iteration"] - gpu_check.GPU_ITERATION_MARGIN
    steps.deadline -= gpu_check.BUDGET - 30  # 30 s of the budget left: the cap follows it
    options = gpu_check.bench_options(steps, "gpu_iteration")
    assert float(options[options.index("--time-cap") + 1]) <= 30 - gpu_check.GPU_ITERATION_MARGIN
    # The options are the bench's own: it parses them.
    bench = load_script(REPO / "bench" / "gpu_iteration.py")
    parsed = bench.parse_args(options)
    assert (parsed.steps, parsed.warmup, parsed.time_cap) == (3, 1, float(options[-1]))

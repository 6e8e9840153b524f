"""`tide run` and the interposer seen from Python: the start-up hook of --optimizer chains to the
user's own sitecustomize, the exit status passes through, PyTorch imports and computes under the
preload as it does without it, and the report is JSON a standard parser reads."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

PRELOAD_NAME = "libtide_preload.so"


@pytest.fixture
def tide(build_dir) -> pathlib.Path:
    exe = build_dir / "bin" / "tide"
    assert exe.is_file(), f"{exe} is missing: build tide first (make build)"
    return exe


@pytest.fixture
def preload(build_dir) -> pathlib.Path:
    lib = build_dir / "lib" / PRELOAD_NAME
    assert lib.is_file(), f"{lib} is missing: build the tide_preload target"
    return lib


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TIDE_") and k not in ("LD_PRELOAD", "PYTHONPATH")}
    env.update(extra)
    return env


def run(args, **kwargs):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300,
                          **kwargs)


def test_exit_status_passes_through(tide, tmp_path):
    result = run([tide, "run", "--", sys.executable, "-c", "import sys; sys.exit(42)"],
                 env=clean_env(), cwd=tmp_path)
    assert result.returncode == 42, result.stderr


def test_the_preload_is_first_in_ld_preload_and_the_knobs_are_set(tide, tmp_path):
    code = ("import os; print(os.environ['LD_PRELOAD']); print(os.environ['TIDE_MEMORY_LIMIT']);"
            "print(os.environ['TIDE_REPORT'])")
    result = run([tide, "run", "--limit", "2GiB", "--report", "r-%p.json", "--", sys.executable,
                  "-c", code], env=clean_env(), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    preload_line, limit, report = result.stdout.splitlines()
    assert preload_line.split(":")[0].endswith(PRELOAD_NAME)
    assert (limit, report) == ("2GiB", "r-%p.json")


def test_optimizer_hook_chains_to_the_users_sitecustomize(tide, tmp_path):
    pytest.importorskip("torch")
    user = tmp_path / "user_site"
    user.mkdir()
    (user / "sitecustomize.py").write_text(
        "import builtins\nbuiltins.USER_SITECUSTOMIZE_RAN = True\nprint('user sitecustomize ran')\n")
    code = ("import builtins, sitecustomize; assert builtins.USER_SITECUSTOMIZE_RAN;"
            "print('site', sitecustomize.__file__); import torch; torch.optim.AdamW")
    result = run([tide, "run", "--optimizer", "--", sys.executable, "-c", code],
                 env=clean_env(PYTHONPATH=str(user)), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "user sitecustomize ran", "it runs, once, before the program"
    assert lines.count("user sitecustomize ran") == 1
    assert lines[1] == f"site {user / 'sitecustomize.py'}", "the user's module keeps its name"
    # One line says what the hook did (test_tide_run_optimizer.py checks the optimizer itself).
    notes = [l for l in result.stderr.splitlines() if l.startswith("tide run --optimizer:")]
    assert len(notes) == 1, result.stderr
    assert "torch.optim.AdamW and torch.optim.Adam are tide's" in notes[0]


def test_optimizer_hook_without_a_user_sitecustomize_nor_torch(tide, tmp_path):
    result = run([tide, "run", "--optimizer", "--", sys.executable, "-c", "print('program ran')"],
                 env=clean_env(), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "program ran"
    assert "import torch" not in result.stderr and "Traceback" not in result.stderr


def test_a_failing_user_sitecustomize_is_reported_as_python_would(tide, tmp_path):
    user = tmp_path / "broken_site"
    user.mkdir()
    (user / "sitecustomize.py").write_text("raise RuntimeError('broken user sitecustomize')\n")
    result = run([tide, "run", "--optimizer", "--", sys.executable, "-c", "print('program ran')"],
                 env=clean_env(PYTHONPATH=str(user)), cwd=tmp_path)
    assert result.returncode == 0
    assert "broken user sitecustomize" in result.stderr, "site.py's own error report"
    assert result.stdout.strip() == "program ran"


def test_torch_imports_and_computes_under_the_preload_as_without_it(preload, tmp_path):
    pytest.importorskip("torch")
    code = ("import torch; x = torch.randn(64, 64); print(float((x @ x).sum()) == float((x @ x).sum()),"
            " torch.cuda.is_available())")
    # Whether torch sees CUDA is the machine's answer (False here, True on a GPU machine): the
    # preload must not change it.
    plain = run([sys.executable, "-c", code], cwd=tmp_path, env=clean_env())
    assert plain.returncode == 0, plain.stderr
    expected = plain.stdout.split()
    assert expected in (["True", "False"], ["True", "True"]), plain.stdout
    result = run([sys.executable, "-c", code], cwd=tmp_path,
                 env=clean_env(LD_PRELOAD=str(preload),
                               TIDE_REPORT=str(tmp_path / "torch-%p.json")))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == expected
    assert not list(tmp_path.glob("torch-*.json")), "no CUDA use, no report"


def test_the_report_is_json(tide, build_dir, tmp_path):
    child = build_dir / "bin" / "interpose_report_child"
    fake = build_dir / "tests" / "interpose" / "fakecuda"
    if not child.is_file() or not (fake / "libcuda.so.1").is_file():
        pytest.skip("the interposer's test programs are not built (TIDE_BUILD_TESTS=OFF)")
    result = run([tide, "run", "--stacks", "--report", "out.json", "--", child, "alloc"],
                 env=clean_env(LD_LIBRARY_PATH=str(fake)), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "tide: device memory peak 20.0 MiB on device 0" in result.stderr
    report = json.loads((tmp_path / "out.json").read_text())
    trace = json.loads((tmp_path / "out.trace.json").read_text())
    assert report["telemetry"]["phases"]["peak_bytes"]["backward"] == 20 << 20
    assert report["traces"] == ["out.trace.json"], "next to the report, as it was named"
    # Failed on an H200 (from the bundle, debug info stripped): the sites' first frames say why.
    assert any(site["frames"][0].get("function", "").startswith("report_child_forward")
               for site in report["stacks"]["top_sites"]), [
        site["frames"][:3] for site in report["stacks"]["top_sites"][:3]]
    assert {e["name"] for e in trace["traceEvents"]} >= {"memory", "forward", "backward", "update"}


@pytest.fixture
def standin_child(build_dir, tmp_path):
    """A program that allocates 20 MiB of device memory through libcuda.so.1, which is tide's
    host stand-in driver here."""
    driver_dir = tmp_path / "standin_driver"
    driver_dir.mkdir()
    (driver_dir / "libcuda.so.1").symlink_to(build_dir / "lib" / "libtide_standin_cuda.so")
    program = pathlib.Path(__file__).parent / "fixtures" / "driver_alloc.py"
    return [sys.executable, program], {"LD_LIBRARY_PATH": str(driver_dir)}


def test_without_report_the_report_goes_to_the_per_user_directory(tide, standin_child,
                                                                   tmp_path):
    child, env = standin_child
    cwd = tmp_path / "work"
    cwd.mkdir()
    state = tmp_path / "state"
    result = run([tide, "run", "--", *child], cwd=cwd,
                 env=clean_env(XDG_STATE_HOME=str(state), **env))
    assert result.returncode == 0, result.stderr
    assert not list(cwd.iterdir()), "nothing in the program's working directory"
    reports = state / "tide" / "reports"
    assert oct(reports.stat().st_mode & 0o777) == "0o700"
    (report,) = reports.glob("tide-report.*[0-9].json")
    assert (reports / report.name.replace(".json", ".trace.json")).is_file()
    assert f"; report: {report}" in result.stderr
    assert json.loads(report.read_text())["stand_in_driver"] is True

    # Without XDG_STATE_HOME: ~/.local/state.
    home = tmp_path / "home"
    no_state = {k: v for k, v in clean_env(HOME=str(home), **env).items()
                if k != "XDG_STATE_HOME"}
    result = run([tide, "run", "--", *child], cwd=cwd, env=no_state)
    assert result.returncode == 0, result.stderr
    assert len(list((home / ".local/state/tide/reports").glob("tide-report.*[0-9].json"))) == 1

    # TIDE_REPORT, when set, is where it goes; and --report over both.
    result = run([tide, "run", "--", *child], cwd=cwd,
                 env=clean_env(XDG_STATE_HOME=str(state), TIDE_REPORT=str(tmp_path / "mine.json"),
                               **env))
    assert result.returncode == 0 and (tmp_path / "mine.json").is_file(), result.stderr
    result = run([tide, "run", "--report", tmp_path / "flag.json", "--", *child],
                 cwd=cwd, env=clean_env(TIDE_REPORT=str(tmp_path / "mine2.json"), **env))
    assert (tmp_path / "flag.json").is_file() and not (tmp_path / "mine2.json").exists()


def test_the_per_user_directory_keeps_the_most_recent_reports(tide, standin_child, tmp_path):
    child, env = standin_child
    reports = tmp_path / "state" / "tide" / "reports"
    reports.mkdir(parents=True)
    for pid in range(1000, 1070):  # 70 older reports, each with its trace, oldest first
        for name in (f"tide-report.{pid}.json", f"tide-report.{pid}.trace.json"):
            (reports / name).write_text("{}")
            os.utime(reports / name, (1e9 + pid, 1e9 + pid))
    (reports / "notes.txt").write_text("mine")
    (reports / "tide-report.x.json").write_text("not a report's name")
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    (reports / "tide-report.1.json").symlink_to(outside)  # not a regular file: left alone
    os.utime(reports / "tide-report.1.json", (1e9, 1e9), follow_symlinks=False)
    result = run([tide, "run", "--", *child], cwd=tmp_path,
                 env=clean_env(XDG_STATE_HOME=str(tmp_path / "state"), **env))
    assert result.returncode == 0, result.stderr
    new = pathlib.Path(result.stderr.split("; report: ")[1].split()[0])
    assert new.is_file() and new.parent == reports
    older = sorted(int(p.name.split(".")[1]) for p in reports.glob("tide-report.*.json")
                   if p.name.split(".")[1].isdigit() and not p.name.endswith(".trace.json")
                   and not p.is_symlink() and p != new)
    assert older == list(range(1007, 1070)), "the 63 most recent older ones, and this run's"
    assert not (reports / "tide-report.1006.trace.json").exists()
    assert (reports / "tide-report.1007.trace.json").exists()
    assert (reports / "notes.txt").read_text() == "mine"
    assert (reports / "tide-report.x.json").exists() and outside.read_text() == "{}"


def test_a_run_over_the_stand_in_says_so(tide, standin_child, tmp_path):
    child, env = standin_child
    result = run([tide, "run", "--report", "r.json", "--", *child], cwd=tmp_path,
                 env=clean_env(**env))
    assert result.returncode == 0, result.stderr
    assert ("tide: device memory peak 20.0 MiB on stand-in device 0 (tide's host stand-in "
            "driver: host memory, no GPU)") in result.stderr


def test_no_report_directory_is_said_and_the_run_goes_on(tide, standin_child, tmp_path):
    child, env = standin_child
    blocker = tmp_path / "state"
    blocker.write_text("a file where the directory would be")
    result = run([tide, "run", "--", *child], cwd=tmp_path,
                 env=clean_env(XDG_STATE_HOME=str(blocker), **env))
    assert result.returncode == 0, result.stderr
    assert f"tide run: no report file ({blocker}/tide/reports: " in result.stderr
    assert "--report PATH writes one" in result.stderr
    assert "tide: device memory peak 20.0 MiB" in result.stderr and "; report:" not in result.stderr
    env = {k: v for k, v in clean_env(**env).items() if k not in ("HOME", "XDG_STATE_HOME")}
    result = run([tide, "run", "--", *child], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert "tide run: no report file (neither XDG_STATE_HOME nor HOME is set" in result.stderr

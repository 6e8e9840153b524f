"""The steps of `make gpu-check` (scripts/gpu_check.sh), and their report.

Two ways in. Built here (`make gpu-check` on a GPU machine with network): gpu_check.sh builds,
then runs this with .venv's python. From a bundle (`GPU_BUNDLE=out/gpu-bundle.tar.gz make
gpu-check` on a lent, offline GPU machine): this unpacks the archive `make gpu-bundle` made into
build/ and runs every step with the machine's own python3 (PYTHONPATH=python; no .venv, apt, pip,
build or network). `--standin` (GPU_CHECK_STANDIN=1) rehearses the bundle flow on a machine without
a GPU: the real-driver steps run over the bundle's host stand-in driver, the Python suite in CPU
mode (a subset, GPU_CHECK_PYTEST_ARGS), and what needs a GPU (memcheck) is left out.

Each step runs as a subprocess with its own time limit (STEPS; the whole fits 9.5 minutes on a
16-core H100/H200), its output in out/gpu-check/STEP.log; a failing step does not stop the others.
The report, out/gpu-check/report.md and report.json, has the machine (GPU, driver, CPU), the commit,
and per step its status, seconds and figures; out/gpu-check/logs.tar.gz has every log. Those three
files are everything. Exit status 0 when every step passed.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import importlib.util
import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
OUT = REPO / "out" / "gpu-check"
BUILD = REPO / "build"
MANIFEST = BUILD / "ctest-manifest.json"
STANDIN = BUILD / "lib" / "libtide_standin_cuda.so"

# Seconds each step may take on a 16-core H100/H200 (docs/contributing/testing.md), in the order they run,
# as timed on an H200 (2026-11-27); no step runs past BUDGET seconds from the start (unpacking has
# no limit of its own), so that the check and its report end within 9.5 minutes of a 15-minute
# loan that includes the machine's start. The benchmarks go before the Python suite: the suite
# (ELASTIC, last) gets all that is left, and on that machine it needs about 8 minutes in all, so a
# budget too short for it cuts it (the tests not run are named), never a benchmark.
STEPS = {
    "unpack": 15,
    "preflight": 10,
    "ctest-gpu": 20,
    "ctest-real-driver": 35,
    "memcheck-gpu": 40,
    "example": 35,
    "bench-gpu_update_phase": 80,
    "bench-gpu_allocator_replay": 25,
    "bench-ddp_offload": 30,
    "bench-gpu_iteration": 140,
    "pytest": 90,
}
# bench/gpu_iteration.py in the check: fewer steps, and its own cap this many seconds inside the
# step's limit, so that it ends its subprocesses and prints its summary before the limit.
GPU_ITERATION_OPTIONS = ["--steps", "3", "--warmup", "1"]
GPU_ITERATION_MARGIN = 8
BUDGET = 540
ELASTIC = "pytest"
PYTEST_TEST_LIMIT = 60  # seconds per Python test: a hung test costs this much, then the run goes on
# Python test files that cannot run on a lent machine: they need the network or a build.
PYTEST_NEVER = {
    "tests/python/test_deepspeed.py": "installs DeepSpeed with pip (network); CPU-only by design",
    "tests/python/test_make_bench.py": "runs `make bench`, which builds first (apt, pip)",
}
# ... and those that need packages the machine's python may lack (checked there).
PYTEST_NEEDS = {"tests/python/test_trainers.py": ["transformers", "lightning"]}
# The rehearsal's Python subset (a few minutes on 2 cores): the optimizer on its devices, the
# library, the allocator, the interposer under `tide run`.
REHEARSAL_PYTEST = ["tests/python/test_lib.py", "tests/python/test_allocator.py",
                    "tests/python/test_optim.py", "tests/python/test_interpose_run.py"]


def command_output(args: list[str], **kwargs) -> str:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=60,
                              **kwargs).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def cmake_archs() -> str:
    try:
        text = (BUILD / "CMakeCache.txt").read_text()
    except OSError:
        return ""
    m = re.search(r"^TIDE_CUDA_ARCHS:\w+=(.*)$", text, re.MULTILINE)
    return m.group(1) if m else ""


def bundle_info() -> dict:
    try:
        return json.loads((BUILD / "gpu-bundle.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def machine() -> dict:
    gpu = command_output(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,compute_cap",
                          "--format=csv,noheader"])
    cpu = ""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                    if line.startswith("model name")), "")
    except OSError:
        pass
    return {"gpus": [g.strip() for g in gpu.splitlines() if g.strip()], "cpu": cpu,
            "cores": os.cpu_count(), "host": platform.node(),
            "commit": command_output(["git", "-C", str(REPO), "rev-parse", "HEAD"]),
            "python": f"{sys.executable} {platform.python_version()}",
            "torch": command_output([sys.executable, "-c",
                                     "import torch; print(torch.__version__)"]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


class Steps:
    """Runs the steps, each within its limit and what is left of the budget."""

    def __init__(self, env: dict, budget: float, scale: float):
        self.env = env
        self.scale = scale
        self.deadline = time.monotonic() + budget * scale
        self.done: list[dict] = []

    def left(self, name: str) -> float:
        now_left = self.deadline - time.monotonic()
        if name == ELASTIC:
            order = list(STEPS)
            after = sum(STEPS[n] for n in order[order.index(name) + 1:]) * self.scale
            return max(0.0, min(now_left, max(STEPS[name] * self.scale, now_left - after)))
        return max(0.0, min(STEPS[name] * self.scale, now_left))

    def add(self, name: str, status: str, seconds: float = 0, figures: dict | None = None) -> dict:
        step = {"step": name, "status": status, "seconds": round(seconds, 1),
                "log": f"out/gpu-check/{name}.log", "figures": figures or {}}
        self.done.append(step)
        print(f"gpu-check: {name}: {status}", flush=True)
        return step

    def run(self, name: str, args: list[str], env: dict | None = None) -> dict:
        """Runs one step; its combined output goes to out/gpu-check/NAME.log."""
        limit = self.left(name)
        if limit < 1:
            return self.add(name, "not run (the check's time budget is spent)")
        log = OUT / f"{name}.log"
        start = time.monotonic()
        print(f"gpu-check: {name} (limit {limit:.0f} s): {' '.join(args)}", flush=True)
        with open(log, "w") as f:
            f.write(f"$ {' '.join(args)}\n")
            f.flush()
            # A session of its own, so that the limit ends the step's children too.
            p = subprocess.Popen(args, cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
                                 env={**self.env, **(env or {})}, start_new_session=True)
            try:
                code = p.wait(timeout=limit)
                status = "passed" if code == 0 else f"failed (exit {code})"
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()
                status = f"failed (over its limit of {limit:.0f} s)"
        step = {"step": name, "status": status, "seconds": round(time.monotonic() - start, 1),
                "log": str(log.relative_to(REPO)), "figures": {}}
        self.done.append(step)
        print(f"gpu-check: {name}: {status} in {step['seconds']} s", flush=True)
        return step


# ---- figures -------------------------------------------------------------------------------------

def read_json(path: pathlib.Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def ctest_figures(path: pathlib.Path) -> dict:
    r = read_json(path)
    figures = {k: r[k] for k in ("tests", "passed", "skipped", "failures") if k in r}
    if r.get("failed"):
        figures["failed_tests"] = r["failed"]
    return figures


def pytest_figures(path: pathlib.Path, ignored: dict) -> dict:
    r = read_json(path)
    keys = ("collected", "passed", "failed", "errors", "skipped", "xfailed", "xpassed", "crashed",
            "not_run", "collection_errors", "rounds")
    figures = {k: r[k] for k in keys if k in r}
    if r.get("crashes"):
        figures["crashes"] = r["crashes"]
    if r.get("failures"):
        figures["failed_tests"] = r["failures"]
    if r.get("failure_messages"):
        figures["failure_messages"] = r["failure_messages"]
    if r.get("not_run_tests"):  # by file: what GPU_CHECK_PYTEST_ARGS gives the next run
        figures["not_run_files"] = dict(collections.Counter(
            test.split("::", 1)[0] for test in r["not_run_tests"]))
    if r.get("collection_error_messages"):
        figures["collection_error_messages"] = r["collection_error_messages"]
    if ignored:
        figures["left_out"] = ignored
    return figures


def no_skips(step: dict) -> dict:
    """On a machine with a GPU nothing may be skipped: a skip means the GPU was not reached."""
    figures = step["figures"]
    if step["status"] == "passed" and (not figures or figures.get("skipped", 0) > 0 or
                                       any("skipped" in line for line in figures.get("lines", [])) or
                                       figures.get("ran_on_cuda") is False):
        step["status"] = "failed (skipped, or not on the GPU)"
    return step


def example_figures(log: pathlib.Path) -> dict:
    text = log.read_text(errors="replace") if log.exists() else ""
    out = {}
    m = re.search(r"mean step time \(update phase\): tide ([\d.]+) ms, torch.optim.AdamW ([\d.]+) ms",
                  text)
    if m:
        out["update_ms_tide"], out["update_ms_torch"] = float(m.group(1)), float(m.group(2))
        out["update_ratio_torch_over_tide"] = round(float(m.group(2)) / float(m.group(1)), 3)
    m = re.search(r"largest weight difference from torch.optim.AdamW: ([\d.e+-]+) .*relative "
                  r"([\d.e+-]+)", text)
    if m:
        out["largest_weight_difference"] = float(m.group(1))
        out["largest_weight_difference_relative"] = float(m.group(2))
    m = re.search(r"final loss tide ([\d.]+), torch.optim.AdamW ([\d.]+)", text)
    if m:
        out["final_loss_tide"], out["final_loss_torch"] = float(m.group(1)), float(m.group(2))
    out["ran_on_cuda"] = "no GPU" not in text and "stand-in" not in text
    return out


# What tide breaking PyTorch's contexts looked like on the first real GPU (issue 25): none of it
# may appear in any step's log, whatever the step's own verdict.
CONTEXT_ERRORS = re.compile(r"CUDA_ERROR_INVALID_CONTEXT|CUDA_ERROR_CONTEXT_IS_DESTROYED|"
                            r"invalid device context|context is destroyed")


def context_errors(log: pathlib.Path, keep: int = 3) -> list[str]:
    """The first `keep` lines of `log` that report a CUDA context error (empty: none)."""
    found = []
    with contextlib.suppress(OSError):
        for line in log.read_text(errors="replace").splitlines():
            if CONTEXT_ERRORS.search(line):
                found.append(line.strip()[:300])
                if len(found) == keep:
                    break
    return found


def fail_on_context_errors(steps: list[dict]) -> None:
    for step in steps:
        lines = context_errors(REPO / step["log"])
        if lines:
            step["figures"]["context_errors"] = lines
            if step["status"] == "passed":
                step["status"] = "failed (CUDA context errors in its log)"


def json_lines(log: pathlib.Path) -> list[dict]:
    lines = []
    for line in (log.read_text(errors="replace") if log.exists() else "").splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return lines


# ---- steps ---------------------------------------------------------------------------------------

def python_that_imports_tide(python: str, where: pathlib.Path) -> str:
    """A python in which `import tide` works without PYTHONPATH: the tests run programs as a
    user's shell would (no PYTHONPATH), so tide must be importable as if installed. .venv's is
    (`pip install -e` wrote its tide-source.pth); a lent machine's python3 has no tide and no pip.
    There: a virtual environment over that python at `where`, without pip, whose one .pth adds
    that python's package folders (torch and the rest, their own .pth files too) and tide's
    source tree. Nothing of the machine's python is changed."""
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run([python, "-c", "import tide"], env=clean, cwd="/", capture_output=True)
    if probe.returncode == 0:
        return python
    subprocess.run([python, "-m", "venv", "--without-pip", "--clear", str(where)], check=True,
                   env=clean)
    folders = json.loads(subprocess.check_output(
        [python, "-c", "import json, sys; print(json.dumps([p for p in sys.path "
                       "if p.endswith(('site-packages', 'dist-packages'))]))"],
        env=clean, cwd="/", text=True))
    venv_python = where / "bin" / "python"
    purelib = subprocess.check_output(
        [str(venv_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        env=clean, text=True).strip()
    lines = [f"import site; site.addsitedir({f!r})" for f in folders] + [str(REPO / "python")]
    (pathlib.Path(purelib) / "tide-gpu-check.pth").write_text("\n".join(lines) + "\n")
    return str(venv_python)


def unpack(steps: Steps, bundle: pathlib.Path) -> bool:
    start = time.monotonic()
    try:
        with tarfile.open(bundle) as tar:
            members = tar.getmembers()
            names = [m.name for m in members]
            if not names or any(not (n == "build" or n.startswith("build/")) for n in names):
                raise tarfile.TarError(f"{bundle} holds more than build/: not a gpu-bundle")
            if hasattr(tarfile, "data_filter"):  # Python 3.12: say which filter (3.14's default)
                tar.extractall(REPO, filter="tar")
            else:
                tar.extractall(REPO)
        info = bundle_info()
        step = steps.add("unpack", "passed", time.monotonic() - start,
                         {"files": sum(m.isfile() for m in members),
                          "bundle_bytes": bundle.stat().st_size,
                          "bundle_commit": info.get("commit"), "bundle_dirty": info.get("dirty"),
                          "bundle_built": info.get("built")})
    except (OSError, tarfile.TarError) as e:
        steps.add("unpack", f"failed ({e})", time.monotonic() - start)
        return False
    return step["status"] == "passed"


def preflight(steps: Steps) -> None:
    """What the machine offers: the driver and devices tide sees, and any library the bundle's
    programs need that it lacks (then every C++ step fails for the same reason: said here once)."""
    s = steps.run("preflight", ["sh", "-c", "build/bin/tide info; status=$?; echo '== ldd'; "
                                "for f in build/bin/* build/lib/*.so build/lib/bundled/*; do "
                                "ldd \"$f\" 2>&1 | sed -n \"/not found/s|^|$f: |p\"; done; "
                                "exit $status"])
    lines = (REPO / s["log"]).read_text(errors="replace").splitlines()[1:]  # after the command
    cut = lines.index("== ldd") if "== ldd" in lines else len(lines)
    s["figures"] = {"tide_info": lines[:min(cut, 8)],
                    "missing_libraries": sorted({m for line in lines[cut:]
                                                 for m in re.findall(r"(\S+) => not found", line)})}
    if s["figures"]["missing_libraries"] and s["status"] == "passed":
        s["status"] = "failed (libraries missing)"


def ctest_step(steps: Steps, python: str, name: str, options: list[str], gpu: bool) -> None:
    result = OUT / f"{name}.json"
    limit = steps.left(name)
    s = steps.run(name, [python, "scripts/ctest_manifest.py", "run", str(MANIFEST),
                         "--deadline", f"{max(limit - 5, 1):.0f}", "--json", str(result), *options])
    s["figures"] = ctest_figures(result)
    if gpu:
        no_skips(s)


def pytest_step(steps: Steps, python: str, extra: list[str]) -> None:
    ignored = dict(PYTEST_NEVER)
    for path, modules in PYTEST_NEEDS.items():
        missing = [m for m in modules if importlib.util.find_spec(m) is None]
        if missing:
            ignored[path] = f"needs {', '.join(missing)}, not on this python"
    result = OUT / "pytest.json"
    limit = steps.left("pytest")
    args = [python, "scripts/pytest_resume.py", "--timeout", str(PYTEST_TEST_LIMIT * steps.scale),
            "--deadline", f"{max(limit - 5, 1):.0f}", "--json", str(result), "--",
            "-q", "-rfE", "--durations=25", "-p", "no:cacheprovider",
            *[f"--ignore={p}" for p in ignored], *(extra or ["tests/python"])]
    s = steps.run("pytest", args)
    s["figures"] = pytest_figures(result, ignored)


def bench_options(steps: Steps, bench: str) -> list[str]:
    """A GPU benchmark's options in the check: fewer steps; gpu_iteration also a time cap inside
    what is left of its step's limit when it starts."""
    if bench == "gpu_update_phase":
        return ["--steps", "3"]
    if bench == "ddp_offload":  # one rank: NCCL on the one GPU a loan has
        return ["--world", "1", "--steps", "5"]
    if bench == "gpu_iteration":
        cap = max(steps.left("bench-gpu_iteration") - GPU_ITERATION_MARGIN * steps.scale, 1)
        return [*GPU_ITERATION_OPTIONS, "--time-cap", f"{cap:.0f}"]
    return []


def _error_line(message: str) -> str:
    """What a failure says, short: pytest's first "E" line (the exception and its message; the
    lines after it detail the comparison), else its last line."""
    lines = [l.strip() for l in message.splitlines() if l.strip()]
    said = [l for l in lines if l.startswith("E ")][:1] or lines[-1:]
    return "`" + (said[0][:200].replace("`", "'") if said else "?") + "`"


def markdown(report: dict) -> str:
    m = report["machine"]
    b = report.get("bundle") or {}
    lines = [f"# tide gpu-check, {m['date']}", "",
             f"- GPU: {'; '.join(m['gpus']) or 'none'}", f"- CPU: {m['cpu']} ({m['cores']} cores)",
             f"- python: {m['python']}, torch {m['torch']}",
             f"- commit: {m['commit'] or 'unknown (no .git here)'}",
             *([f"- bundle: built from {b.get('commit')}"
                f"{' with uncommitted changes' if b.get('dirty') else ''} on {b.get('built')}"]
               if b else []),
             f"- mode: {report['mode']}", f"- fatbin architectures: {report['archs']}",
             f"- overall: **{'passed' if report['passed'] else 'FAILED'}**"
             f" in {report['seconds']} s (budget {report['budget_seconds']} s)", "",
             "| step | status | seconds | figures |", "| --- | --- | --- | --- |"]
    for s in report["steps"]:
        shown = {k: v for k, v in s["figures"].items()
                 if k not in ("lines", "crashes", "failed_tests", "collection_error_messages",
                              "left_out", "tide_info", "failure_messages", "not_run_files")}
        if "lines" in s["figures"]:
            shown["json_lines"] = len(s["figures"]["lines"])
        lines.append(f"| {s['step']} | {s['status']} | {s['seconds']} | "
                     f"{json.dumps(shown) if shown else ''} |")
    for s in report["steps"]:
        f = s["figures"]
        detail = [f"- crashed: `{c['test']}`: {c['reason']}" for c in f.get("crashes", [])]
        messages = f.get("failure_messages", {})
        detail += [f"- failed: `{t}`" + (f": {_error_line(messages[t])}" if t in messages else "")
                   for t in f.get("failed_tests", [])]
        if f.get("not_run_files"):
            detail += [f"- not reached: `{p}` ({n} tests)" for p, n in f["not_run_files"].items()]
            detail += [f"- the next run, for those: `GPU_CHECK_PYTEST_ARGS=\"{' '.join(f['not_run_files'])}\"`"]
        if f.get("tide_info"):
            detail += ["```", *f["tide_info"], "```"]
        detail += [f"- collection error: `{p}`: {why}"
                   for p, why in f.get("collection_error_messages", {}).items()]
        detail += [f"- left out: `{p}`: {why}" for p, why in f.get("left_out", {}).items()]
        detail += ["- " + json.dumps(line) for line in f.get("lines", [])]
        detail += step_tables(f.get("lines", []))
        if detail:
            lines += ["", f"## {s['step']}", "", *detail]
    lines += ["", "Logs: out/gpu-check/logs.tar.gz (one per step); all of the above also in "
              "report.json.", ""]
    return "\n".join(lines)


# bench/gpu_iteration.py's per-step records, as columns: where each step's time went, what was
# resident after it, and the pressure and driver calls of its passes (the capped cases' question).
STEP_COLUMNS = ("forward_ms", "forward_backward_ms", "update_ms", "phase_ms", "predicted_ms",
                "zero_grad_ms", "gpu_subgroups", "cpu_subgroups", "resident_subgroups", "evicted_subgroups", "evict_ms", "cache_releases",
                "alloc_retries", "driver_allocs", "driver_frees", "peak_live_gib",
                "held_headroom_gib", "gpu_busy_ms", "h2d_busy_ms", "d2h_busy_ms", "cpu_busy_ms",
                "gradients_offloaded_in_backward", "gradients_offloaded_at_step",
                "gradient_offloads_deferred")


def step_tables(lines: list[dict]) -> list[str]:
    """One table per benchmark line with per-step records: a row per step (warm-up ones
    marked), a column per figure any of its steps has, in STEP_COLUMNS' order."""
    out = []
    for line in lines:
        steps = line.get("steps")
        if not isinstance(steps, list) or not steps:
            continue  # no records (other benchmarks' "steps" may be a count)
        columns = [c for c in STEP_COLUMNS if any(c in st for st in steps)]
        out += ["", f"`{line.get('case', '?')}`, per step:", "",
                "| step | " + " | ".join(columns) + " |",
                "| --- |" + " --- |" * len(columns)]
        for i, st in enumerate(steps):
            name = f"{i + 1}{' (warm-up)' if st.get('warmup') else ''}"
            out.append(f"| {name} | " + " | ".join(str(st.get(c, "")) for c in columns) + " |")
    return out


def pack_logs() -> None:
    with tarfile.open(OUT / "logs.tar.gz", "w:gz") as tar:
        for f in sorted(OUT.iterdir()):
            if f.suffix in (".log", ".json") and f.name != "report.json":
                tar.add(f, arcname=f"gpu-check/{f.name}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bundle", help="unpack this archive (make gpu-bundle) into build/ first")
    parser.add_argument("--standin", action="store_true",
                        help="rehearse on the host stand-in driver (no GPU needed)")
    parser.add_argument("--build-status", default="passed")
    parser.add_argument("--build-seconds", type=float, default=0)
    parser.add_argument("--archs", default="")
    parser.add_argument("--budget", type=float, default=BUDGET, help="seconds for all the steps")
    parser.add_argument("--time-scale", type=float,
                        default=float(os.environ.get("GPU_CHECK_TIME_SCALE", 0)) or None,
                        help="every limit times this (default 1; 4 with --standin: a rehearsal "
                             "runs on a small machine)")
    parser.add_argument("--pytest-args", default=os.environ.get("GPU_CHECK_PYTEST_ARGS", ""),
                        help="what pytest runs instead of tests/python (space-separated)")
    args = parser.parse_args()
    started = time.monotonic()
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.iterdir():  # a report of this run only (gpu_check.sh's build log is)
        if old.is_file() and old.name != "build.log":
            old.unlink()

    python = sys.executable
    if args.bundle:
        python = python_that_imports_tide(python, OUT / "python")
    env = dict(os.environ)
    # tide from the tree (python/), the bundle's libraries (libunwind for `tide run --stacks`).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "python"), env.get("PYTHONPATH"))
                                        if p)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(BUILD / "lib" / "bundled"), env.get("LD_LIBRARY_PATH")) if p)
    if args.standin:
        env["TIDE_CUDA_DRIVER"] = str(STANDIN)
    # Child processes find this python first (tests' subprocesses mostly use sys.executable).
    env["PATH"] = os.pathsep.join((str(pathlib.Path(python).parent), env.get("PATH", "")))
    steps = Steps(env, args.budget, args.time_scale or (4 if args.standin else 1))

    ok = True
    if args.bundle:
        ok = unpack(steps, pathlib.Path(args.bundle).resolve())
    else:
        steps.add("build", args.build_status, args.build_seconds)
        ok = args.build_status == "passed"
        if ok:
            subprocess.run([python, "scripts/ctest_manifest.py", "generate", "build",
                            str(MANIFEST)], cwd=REPO, check=True)
    if ok:
        preflight(steps)
        driver = ["--driver", "standin" if args.standin else "real"]
        ctest_step(steps, python, "ctest-gpu", ["--label", "gpu", "-j", "2"], gpu=not args.standin)
        # 8 at a time: many of them start as many threads as the machine has cores.
        ctest_step(steps, python, "ctest-real-driver",
                   ["--label", "real_driver", "-j", "8", *driver], gpu=False)
        sanitizer = shutil.which("compute-sanitizer") or shutil.which(
            "compute-sanitizer", path="/usr/local/cuda/bin")
        if args.standin or not sanitizer:
            steps.add("memcheck-gpu", "not run (" + ("rehearsal: compute-sanitizer needs a GPU"
                      if args.standin else "no compute-sanitizer found") + ")")
        else:
            ctest_step(steps, python, "memcheck-gpu",
                       ["--label", "gpu", "-j", "2", "--wrap",
                        f"{sanitizer} --tool memcheck --error-exitcode 86"],
                       gpu=True)
        # The rehearsal's CPU does in minutes what a GPU does in seconds: fewer steps there.
        s = steps.run("example", [python, "examples/train_gpt.py", "--compare",
                                  "--out", "out/gpu-check/example",
                                  *(["--steps", "20"] if args.standin else [])])
        s["figures"] = example_figures(REPO / s["log"])
        if not args.standin:
            no_skips(s)
        for bench in ("gpu_update_phase", "gpu_allocator_replay", "ddp_offload",
                      "gpu_iteration"):
            s = steps.run(f"bench-{bench}",
                          [python, f"bench/{bench}.py", *bench_options(steps, bench)])
            s["figures"] = {"lines": json_lines(REPO / s["log"])}
            if not args.standin:
                no_skips(s)
        extra = args.pytest_args.split() or (REHEARSAL_PYTEST if args.standin else [])
        pytest_step(steps, python, extra)

    fail_on_context_errors(steps.done)
    passed = all(s["status"] == "passed" or s["status"].startswith("not run (rehearsal")
                 for s in steps.done)
    report = {"machine": machine(), "bundle": bundle_info() if args.bundle else None,
              "mode": ("rehearsal on the host stand-in driver" if args.standin else "real GPU") +
                      (f", from {args.bundle}" if args.bundle else ", built here"),
              "archs": args.archs or (bundle_info().get("cuda_archs", "") if args.bundle
                                      else cmake_archs()),
              "budget_seconds": round(args.budget * steps.scale), "time_scale": steps.scale,
              "steps": steps.done, "passed": passed,
              "seconds": round(time.monotonic() - started, 1)}
    (OUT / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (OUT / "report.md").write_text(markdown(report))
    pack_logs()
    print(f"gpu-check: {'passed' if passed else 'FAILED'} in {report['seconds']} s; report: "
          "out/gpu-check/report.md, report.json, logs.tar.gz", flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())

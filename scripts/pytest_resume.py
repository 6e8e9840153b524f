"""pytest in one process, in the suite's own order, where a crash ends one test, not the run.

Crashes that depend on test order (one test leaves the process in a state that kills a later one)
show only when the tests share one interpreter, so that is how they run here. This file is both:

- the driver: `python3 scripts/pytest_resume.py [--timeout S] [--deadline S] [--json OUT]
  [--python PY] -- PYTEST_ARGS...` runs `PY -m pytest -p pytest_resume PYTEST_ARGS`; when that
  process dies in a test (a signal, an abort, a per-test timeout), the test is recorded as crashed,
  with why, and pytest starts again in a fresh process with the tests not yet run (those done and
  the crashed one deselected), until none is left. --json gets the counts (passed, failed, errors,
  skipped, xfailed, xpassed, crashed, not_run, collection_errors), the crashed and failed tests;
- the plugin (`-p pytest_resume`, this folder on PYTHONPATH): it appends, to the file named by
  PYTEST_RESUME_PROGRESS, each test's id before it runs and its outcome after, deselects the ids
  listed in PYTEST_RESUME_DESELECT, and gives each test PYTEST_RESUME_TIMEOUT seconds (faulthandler:
  every thread's stack, then the process exits; it works in C code too, and needs no plugin).

Exit status 0 when every test that ran passed, skipped or xfailed, and none crashed or was left.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

PROGRESS = "PYTEST_RESUME_PROGRESS"
DESELECT = "PYTEST_RESUME_DESELECT"
TIMEOUT = "PYTEST_RESUME_TIMEOUT"


# ---- the plugin (runs inside pytest) -------------------------------------------------------------

class _Progress:
    def __init__(self, path: str):
        self.file = open(path, "a", buffering=1)
        self.outcomes: dict[str, str] = {}
        # The real stderr, for the per-test timeout's stacks: pytest captures fd 2 during tests
        # (as its own faulthandler plugin does, taken while capturing is suspended).
        self.stderr_fd = os.dup(2)

    def write(self, **record) -> None:
        # One line per record, flushed at once: what a dying process wrote is in the file.
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()


_progress: _Progress | None = None
FAILURE_CHARS = 3000  # of each failure's report kept: its end, where the error is
_RANK = ["passed", "xpassed", "skipped", "xfailed", "failed", "errors"]  # the worst phase wins


def pytest_configure(config) -> None:
    global _progress
    if os.environ.get(PROGRESS):
        _progress = _Progress(os.environ[PROGRESS])


def pytest_collectreport(report) -> None:
    if _progress and report.failed:
        lines = str(report.longrepr).strip().splitlines() or ["?"]
        _progress.write(collect_error=report.nodeid, message=lines[-1][:300])


def _collection_modifyitems(config, items) -> None:
    if not _progress:
        return
    path = os.environ.get(DESELECT)
    skip = set(pathlib.Path(path).read_text().split("\n")) if path else set()
    dropped = [i for i in items if i.nodeid in skip]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if i.nodeid not in skip]
    _progress.write(collected=[i.nodeid for i in items])


def pytest_runtest_logreport(report) -> None:
    if not _progress:
        return
    if report.failed:
        outcome = "failed" if report.when == "call" else "errors"
        # Written as it happens: a run cut at its deadline prints no summary, yet keeps why.
        text = str(report.longrepr).strip()
        _progress.write(failure=report.nodeid, when=report.when,
                        message=text[-FAILURE_CHARS:])
    elif report.skipped:
        outcome = "xfailed" if hasattr(report, "wasxfail") else "skipped"
    elif report.when == "call":
        outcome = "xpassed" if hasattr(report, "wasxfail") else "passed"
    else:
        return
    previous = _progress.outcomes.get(report.nodeid, "passed")
    _progress.outcomes[report.nodeid] = max(previous, outcome, key=_RANK.index)


def _runtest_protocol(item, nextitem):
    if _progress:
        _progress.write(start=item.nodeid)
    timeout = float(os.environ.get(TIMEOUT) or 0)
    if timeout > 0:
        faulthandler.dump_traceback_later(timeout, exit=True,
                                          file=_progress.stderr_fd if _progress else sys.stderr)
    yield
    if timeout > 0:
        faulthandler.cancel_dump_traceback_later()
    if _progress:
        _progress.write(done=item.nodeid, outcome=_progress.outcomes.get(item.nodeid, "passed"))


try:  # pytest is there whenever pytest loads this file as its plugin
    import pytest

    # Last: after -k and -m have deselected, so that `collected` is what will run.
    pytest_collection_modifyitems = pytest.hookimpl(trylast=True)(_collection_modifyitems)
    pytest_runtest_protocol = pytest.hookimpl(hookwrapper=True)(_runtest_protocol)
except ImportError:
    pass


# ---- the driver ----------------------------------------------------------------------------------

def read_progress(path: pathlib.Path) -> list[dict]:
    records = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by the crash
            pass
    return records


def why_it_died(code: int, output_tail: str) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    if "Timeout (" in output_tail:  # faulthandler's dump_traceback_later
        return "over the per-test time limit"
    return f"the process exited with status {code}"


def run_pytest(command: list[str], env: dict, log, seconds: float) -> tuple[int | None, str]:
    """Runs one pytest process, its output to `log` (and kept, the last 64 KiB, to say why it
    died). None: killed at the deadline."""
    p = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    tail = b""
    deadline = time.monotonic() + seconds
    os.set_blocking(p.stdout.fileno(), False)
    while True:
        chunk = p.stdout.read(65536)
        if chunk:
            log.buffer.write(chunk)
            log.flush()
            tail = (tail + chunk)[-65536:]
        elif p.poll() is not None:
            break
        elif time.monotonic() > deadline:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            return None, tail.decode(errors="replace")
        else:
            time.sleep(0.05)
    return p.returncode, tail.decode(errors="replace")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--timeout", type=float, default=0, help="seconds per test (0: none)")
    parser.add_argument("--deadline", type=float, default=3600, help="seconds for the whole run")
    parser.add_argument("--json", help="write the counts and lists here")
    parser.add_argument("--max-crashes", type=int, default=50)
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args

    # Removed when the driver ends, however it ends: one is made per run.
    work_folder = tempfile.TemporaryDirectory(prefix="pytest_resume.")
    work = pathlib.Path(work_folder.name)
    deselect = work / "deselect.txt"
    env = dict(os.environ, **{DESELECT: str(deselect), TIMEOUT: str(args.timeout)})
    here = str(pathlib.Path(__file__).resolve().parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    command = [args.python, "-m", "pytest", "-p", "pytest_resume",
               "--continue-on-collection-errors", *pytest_args]

    outcomes: dict[str, str] = {}  # nodeid -> outcome, in the order they ran
    crashes: list[dict] = []
    collection_errors: dict[str, str] = {}
    collected: list[str] = []
    failure_messages: dict[str, str] = {}  # nodeid -> the end of its first failing report
    start = time.monotonic()
    deadline = start + args.deadline
    rounds, status, exit_codes = 0, "finished", []
    while True:
        rounds += 1
        progress = work / f"progress.{rounds}.jsonl"
        deselect.write_text("\n".join([*outcomes, *(c["test"] for c in crashes)]))
        print(f"pytest_resume: round {rounds}: {' '.join(command)}", flush=True)
        code, tail = run_pytest(command, {**env, PROGRESS: str(progress)}, sys.stdout,
                                deadline - time.monotonic())
        records = read_progress(progress)
        running = None
        for r in records:
            if "collected" in r:
                collected = r["collected"] if rounds == 1 else collected
            elif "failure" in r:
                failure_messages.setdefault(r["failure"], f"[{r['when']}] {r['message']}")
            elif "collect_error" in r:
                collection_errors[r["collect_error"]] = r["message"]
            elif "start" in r:
                running = r["start"]
            elif "done" in r:
                outcomes[r["done"]] = r["outcome"]
                running = None
        if code is None:
            status = "cut at the deadline" + (f", in {running}" if running else "")
            break
        exit_codes.append(code)
        if running is None:  # pytest ended by itself, between tests
            if code not in (0, 1, 5):  # 2: interrupted, 3: internal error, 4: usage, <0: signal
                status = f"pytest ended with status {code} outside any test"
            break
        reason = why_it_died(code, tail)
        crashes.append({"test": running, "reason": reason})
        print(f"pytest_resume: CRASHED in {running}: {reason}; resuming after it", flush=True)
        if len(crashes) >= args.max_crashes:
            status = f"stopped after {len(crashes)} crashes"
            break
        if not set(collected) - set(outcomes) - {c["test"] for c in crashes}:
            break

    finished = set(outcomes) | {c["test"] for c in crashes}
    counts = {k: sum(v == k for v in outcomes.values())
              for k in ("passed", "failed", "errors", "skipped", "xfailed", "xpassed")}
    counts.update(crashed=len(crashes), not_run=len([t for t in collected if t not in finished]),
                  collection_errors=len(collection_errors), collected=len(collected))
    summary = {**counts, "rounds": rounds, "status": status, "exit_codes": exit_codes,
               "seconds": round(time.monotonic() - start, 1), "crashes": crashes,
               "failures": [t for t, o in outcomes.items() if o in ("failed", "errors")],
               "not_run_tests": [t for t in collected if t not in finished],
               "collection_error_messages": collection_errors,
               "failure_messages": failure_messages}
    print("pytest_resume: " + ", ".join(f"{v} {k}" for k, v in counts.items()) +
          f" ({rounds} process{'es' if rounds > 1 else ''}; {status})", flush=True)
    for c in crashes:
        print(f"pytest_resume: crashed: {c['test']}: {c['reason']}", flush=True)
    for test, message in failure_messages.items():
        print(f"pytest_resume: FAILED {test}:\n{message}\n", flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    work_folder.cleanup()
    bad = counts["failed"] + counts["errors"] + counts["crashed"] + counts["not_run"]
    return 0 if bad == 0 and not collection_errors and collected and status == "finished" else 1


if __name__ == "__main__":
    sys.exit(main())

"""The C++ tests without ctest's generated files: a manifest, and a runner for it.

ctest's CTestTestfile.cmake files hold the build tree's absolute paths, so a build tree copied to
another machine (make gpu-bundle, make gpu-check there) cannot run `ctest`. This script writes what
ctest knows of each test (`ctest --show-only=json-v1`) into one JSON file with the build and source
trees' paths replaced by @BUILD@ and @SOURCE@, and runs the tests from it as ctest would: command,
environment, working directory, timeout, PASS_REGULAR_EXPRESSION, SKIP_RETURN_CODE.

  python3 scripts/ctest_manifest.py generate BUILD_DIR OUTPUT.json
  python3 scripts/ctest_manifest.py run MANIFEST.json [--label L]... [--exclude-label L]...
      [--driver standin|real] [--wrap "CMD ARGS"] [-j N] [--deadline S] [--json OUT] [--log OUT]

--driver real: each TIDE_CUDA_DRIVER the manifest points at the host stand-in driver becomes
libcuda.so.1, the driver tide loads by default (the variable stays set: driver_test compares the
library tide loaded with it). Exit status 0 when every selected test passed or was skipped.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time

STANDIN_NAME = "libtide_standin_cuda.so"
# The ctest properties the runner honours; any other one is an error at generation, so that a
# property added in CMake is not silently dropped on the GPU machine.
KNOWN_PROPERTIES = {"WORKING_DIRECTORY", "ENVIRONMENT", "TIMEOUT", "LABELS",
                    "PASS_REGULAR_EXPRESSION", "SKIP_RETURN_CODE"}


# ---- generate ------------------------------------------------------------------------------------

def source_dir(build: pathlib.Path) -> pathlib.Path:
    for line in (build / "CMakeCache.txt").read_text().splitlines():
        if line.startswith("CMAKE_HOME_DIRECTORY:INTERNAL="):
            return pathlib.Path(line.split("=", 1)[1])
    raise SystemExit(f"ctest_manifest: no CMAKE_HOME_DIRECTORY in {build}/CMakeCache.txt")


def generate(build: pathlib.Path) -> dict:
    build = build.resolve()
    source = source_dir(build).resolve()
    shown = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, check=True,
                           capture_output=True, text=True).stdout
    # The build tree first: it lies inside the source tree.
    replacements = [(str(build), "@BUILD@"), (str(source), "@SOURCE@")]

    def relative(text: str) -> str:
        for path, mark in replacements:
            text = text.replace(path, mark)
        return text

    tests = []
    for t in json.loads(shown)["tests"]:
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        if "command" not in t:  # ctest leaves it out while the executable does not exist
            raise SystemExit(f"ctest_manifest: test {t['name']} has no command: is {build} built?")
        unknown = set(props) - KNOWN_PROPERTIES
        if unknown:
            raise SystemExit(f"ctest_manifest: test {t['name']} has properties this runner does "
                             f"not honour: {sorted(unknown)} (scripts/ctest_manifest.py)")
        tests.append({
            "name": t["name"],
            "command": [relative(c) for c in t["command"]],
            "labels": props.get("LABELS", []),
            "environment": [relative(e) for e in props.get("ENVIRONMENT", [])],
            "working_directory": relative(props.get("WORKING_DIRECTORY", str(build))),
            "timeout": props.get("TIMEOUT", 1500),
            "pass_regular_expression": [relative(r) for r in props.get("PASS_REGULAR_EXPRESSION",
                                                                       [])],
            "skip_return_code": props.get("SKIP_RETURN_CODE"),
        })
    for t in tests:  # what the GPU machine cannot have must not be left
        text = json.dumps(t)
        for path, _ in replacements:
            if path in text:
                raise SystemExit(f"ctest_manifest: {t['name']} still names {path}")
    return {"version": 1, "tests": tests}


# ---- run -----------------------------------------------------------------------------------------

def resolve(text: str, build: pathlib.Path, source: pathlib.Path) -> str:
    return text.replace("@BUILD@", str(build)).replace("@SOURCE@", str(source))


def test_environment(test: dict, build: pathlib.Path, source: pathlib.Path, driver: str) -> dict:
    env = dict(os.environ)
    for entry in test["environment"]:
        key, _, value = resolve(entry, build, source).partition("=")
        if driver == "real" and key == "TIDE_CUDA_DRIVER" and value.endswith("/" + STANDIN_NAME):
            value = "libcuda.so.1"
        env[key] = value
    return env


def test_command(test: dict, build: pathlib.Path, source: pathlib.Path,
                 wrap: list[str]) -> list[str]:
    command = [resolve(c, build, source) for c in test["command"]]
    # A tool at another place on this machine (cmake under /usr/local/bin, say): by name, on PATH.
    if os.path.isabs(command[0]) and not os.path.exists(command[0]):
        command[0] = shutil.which(os.path.basename(command[0])) or command[0]
    return wrap + command


def run_one(test: dict, build: pathlib.Path, source: pathlib.Path, driver: str, wrap: list[str],
            deadline: float) -> dict:
    cwd = pathlib.Path(resolve(test["working_directory"], build, source))
    cwd.mkdir(parents=True, exist_ok=True)  # ctest's build tree made these; a bundle does not
    command = test_command(test, build, source, wrap)
    timeout = max(1.0, min(float(test["timeout"]), deadline - time.monotonic()))
    start = time.monotonic()
    try:
        # A session of its own: on timeout the whole process group goes (a `sh -c` test's children
        # would otherwise keep the output pipe open).
        p = subprocess.Popen(command, cwd=cwd, env=test_environment(test, build, source, driver),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
        try:
            raw, _ = p.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            raw, _ = p.communicate()
            timed_out = True
        output, code = raw.decode(errors="replace"), p.returncode
        if timed_out:
            status = f"failed (over {timeout:.0f} s)"
        elif test["skip_return_code"] is not None and code == test["skip_return_code"]:
            status = "skipped"
        elif test["pass_regular_expression"]:
            # CMake's regular expressions: "." matches a newline too.
            matched = any(re.search(r, output, re.DOTALL) for r in test["pass_regular_expression"])
            status = "passed" if matched else "failed (output does not match)"
        elif code == 0:
            status = "passed"
        elif code < 0:
            status = f"failed (signal {-code})"
        else:
            status = f"failed (exit {code})"
    except OSError as e:
        output, status = str(e), f"failed ({e.strerror or e})"
    return {"name": test["name"], "status": status, "seconds": round(time.monotonic() - start, 1),
            "command": shlex.join(command), "output": output}


def select(tests: list[dict], labels: list[str], excluded: list[str],
           names: list[str]) -> list[dict]:
    chosen = []
    for t in tests:
        if labels and not set(labels) & set(t["labels"]):
            continue
        if set(excluded) & set(t["labels"]):
            continue
        if names and t["name"] not in names:
            continue
        chosen.append(t)
    return chosen


def run(args: argparse.Namespace) -> int:
    manifest = pathlib.Path(args.manifest).resolve()
    build = pathlib.Path(args.build).resolve() if args.build else manifest.parent
    source = build.parent
    tests = select(json.loads(manifest.read_text())["tests"], args.label, args.exclude_label,
                   args.test)
    wrap = shlex.split(args.wrap) if args.wrap else []
    deadline = time.monotonic() + args.deadline
    log = open(args.log, "w") if args.log else sys.stdout
    lock = threading.Lock()
    results = []

    def one(test: dict) -> None:
        if time.monotonic() >= deadline:
            r = {"name": test["name"], "status": "not run (step time limit)", "seconds": 0,
                 "command": "", "output": ""}
        else:
            r = run_one(test, build, source, args.driver, wrap, deadline)
        with lock:
            results.append(r)
            log.write(f"---- {r['name']}: {r['status']} ({r['seconds']} s)\n$ {r['command']}\n"
                      f"{r['output']}\n")
            log.flush()
            print(f"{len(results)}/{len(tests)} {r['name']}: {r['status']} ({r['seconds']} s)",
                  flush=True)

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(one, tests))

    counts = {"tests": len(results),
              "passed": sum(r["status"] == "passed" for r in results),
              "skipped": sum(r["status"] == "skipped" for r in results),
              "failures": sum(r["status"].startswith(("failed", "not run")) for r in results)}
    failed = sorted(r["name"] for r in results if r["status"].startswith(("failed", "not run")))
    summary = (f"{counts['passed']} passed, {counts['skipped']} skipped, {counts['failures']} "
               f"failed out of {counts['tests']}" + (f": {', '.join(failed)}" if failed else ""))
    log.write(summary + "\n")
    print(summary, flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {**counts, "failed": failed,
             "results": [{k: r[k] for k in ("name", "status", "seconds")} for r in results]},
            indent=2) + "\n")
    return 0 if counts["failures"] == 0 and counts["tests"] > 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    g = sub.add_parser("generate", help="write the manifest of BUILD_DIR's tests")
    g.add_argument("build_dir")
    g.add_argument("output")
    r = sub.add_parser("run", help="run tests from a manifest")
    r.add_argument("manifest")
    r.add_argument("--build", help="the build tree (default: the manifest's folder)")
    r.add_argument("--label", action="append", default=[], help="tests with any of these labels")
    r.add_argument("--exclude-label", action="append", default=[])
    r.add_argument("--test", action="append", default=[], help="only tests of these names")
    r.add_argument("--driver", choices=("standin", "real"), default="standin")
    r.add_argument("--wrap", default="", help="a command put before each test's (a sanitizer)")
    r.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    r.add_argument("--deadline", type=float, default=3600, help="seconds for all the tests")
    r.add_argument("--json", help="write the results here")
    r.add_argument("--log", help="write each test's output here (default: stdout)")
    args = parser.parse_args()
    if args.what == "generate":
        out = pathlib.Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(generate(pathlib.Path(args.build_dir)), indent=1) + "\n")
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

"""The steps of `make gpu-check` (scripts/gpu_check.sh builds first), and their report.

Each step runs as a subprocess with its own time limit, its output in out/gpu-check/STEP.log; a
failing step does not stop the others. The report, out/gpu-check/report.md and report.json, has
the machine (GPU, driver, CPU), the commit, and per step its status, seconds and figures: test
counts, the example run's update-phase times against torch.optim.AdamW and its largest weight
difference, and the benchmarks' JSON lines. Exit status 0 when every step passed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

REPO = pathlib.Path(__file__).resolve().parents[1]
OUT = REPO / "out" / "gpu-check"
PY = str(REPO / ".venv" / "bin" / "python")


def command_output(args: list[str]) -> str:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


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
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def run(name: str, args: list[str], timeout: int, env: dict | None = None) -> dict:
    """Runs one step; its combined output goes to out/gpu-check/NAME.log."""
    log = OUT / f"{name}.log"
    start = time.monotonic()
    print(f"gpu-check: {name}: {' '.join(args)}", flush=True)
    try:
        with open(log, "w") as f:
            p = subprocess.run(args, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                               env={**os.environ, **(env or {})})
        status = "passed" if p.returncode == 0 else f"failed (exit {p.returncode})"
    except subprocess.TimeoutExpired:
        status = f"failed (over {timeout} s)"
    seconds = round(time.monotonic() - start, 1)
    print(f"gpu-check: {name}: {status} in {seconds} s", flush=True)
    return {"step": name, "status": status, "seconds": seconds, "log": str(log.relative_to(REPO)),
            "figures": {}}


def junit_counts(path: pathlib.Path) -> dict:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return {}
    suites = [root] if root.tag == "testsuite" else list(root)
    keys = ("tests", "failures", "errors", "skipped")
    return {k: sum(int(s.get(k, 0)) for s in suites) for k in keys}


def ctest_counts(log: pathlib.Path) -> dict:
    text = log.read_text(errors="replace") if log.exists() else ""
    m = re.search(r"(\d+)% tests passed, (\d+) tests failed out of (\d+)", text)
    if not m:
        return {}
    skipped = re.findall(r"^\s*\d+ - (\S+) \(Skipped\)", text, re.MULTILINE)
    return {"tests": int(m.group(3)), "failures": int(m.group(2)), "skipped": len(skipped)}


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


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [f"# tide gpu-check, {m['date']}", "",
             f"- GPU: {'; '.join(m['gpus']) or 'unknown'}", f"- CPU: {m['cpu']} ({m['cores']} cores)",
             f"- commit: {m['commit']}", f"- fatbin architectures: {report['archs']}",
             f"- overall: **{'passed' if report['passed'] else 'FAILED'}**", "",
             "| step | status | seconds | figures |", "| --- | --- | --- | --- |"]
    for s in report["steps"]:
        figures = s["figures"]
        shown = {k: v for k, v in figures.items() if k != "lines"}
        if "lines" in figures:
            shown["json_lines"] = len(figures["lines"])
        lines.append(f"| {s['step']} | {s['status']} | {s['seconds']} | "
                     f"{json.dumps(shown) if shown else ''} |")
    for s in report["steps"]:
        if s["figures"].get("lines"):
            lines += ["", f"## {s['step']}", ""]
            lines += ["- " + json.dumps(line) for line in s["figures"]["lines"]]
    lines += ["", "Logs: out/gpu-check/*.log; everything above also in report.json.", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-status", default="passed")
    parser.add_argument("--build-seconds", type=float, default=0)
    parser.add_argument("--archs", default="")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)

    steps = [{"step": "build", "status": args.build_status, "seconds": args.build_seconds,
              "log": "out/gpu-check/build.log", "figures": {}}]
    if args.build_status == "passed":
        s = run("ctest-gpu", ["ctest", "--test-dir", "build", "-L", "gpu", "--output-on-failure"],
                timeout=1800)
        s["figures"] = ctest_counts(REPO / s["log"])
        steps.append(no_skips(s))

        xml = OUT / "pytest-gpu.xml"
        s = run("pytest-gpu", [PY, "-m", "pytest", "-q", "-m", "gpu", f"--junitxml={xml}",
                               "tests/python"], timeout=3600)
        s["figures"] = junit_counts(xml)
        steps.append(no_skips(s))

        xml = OUT / "pytest-optim.xml"
        s = run("pytest-optim-on-cuda", [PY, "-m", "pytest", "-q", f"--junitxml={xml}",
                                         "tests/python/test_optim.py"], timeout=3600)
        s["figures"] = junit_counts(xml)
        steps.append(s)

        s = run("make-run", ["make", "--no-print-directory", "run"], timeout=3600)
        s["figures"] = example_figures(REPO / s["log"])
        steps.append(no_skips(s))

        for bench in ("gpu_update_phase", "gpu_allocator_replay"):
            s = run(f"bench-{bench}", [PY, f"bench/{bench}.py"], timeout=3600)
            s["figures"] = {"lines": json_lines(REPO / s["log"])}
            steps.append(no_skips(s))

    report = {"machine": machine(), "archs": args.archs, "steps": steps,
              "passed": all(s["status"] == "passed" for s in steps)}
    (OUT / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (OUT / "report.md").write_text(markdown(report))
    print(f"gpu-check: {'passed' if report['passed'] else 'FAILED'}; report: "
          f"out/gpu-check/report.md, out/gpu-check/report.json", flush=True)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# `make gpu-check`: everything that needs a real GPU, in one command, with one report. Without a
# GPU it says so in one line and exits 0, before building anything. With one it builds tide (also
# for this GPU's architecture when the default fatbin lacks it), then scripts/gpu_check.py runs
# the gpu-labelled C++ tests, the gpu-marked Python tests and all of tests/python/test_optim.py
# (on CUDA tensors there), the example training on CUDA (`make run`) and the GPU benchmarks, and
# writes out/gpu-check/report.md and report.json. Exit status: 0 when every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [[ ${gpus:-0} -eq 0 ]]; then
  echo "gpu-check: no GPU on this machine (nvidia-smi lists none): nothing to check"
  exit 0
fi

mkdir -p out/gpu-check
# The GPU's compute capability (9.0 → 90), added to the fatbin's architectures when missing: the
# default fatbin runs on sm_80 and sm_90 only. (Quoted for the shell that runs make's recipe.)
archs="80;90"
flags=()
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' .')
if [[ $cap =~ ^[0-9]+$ && ";$archs;" != *";$cap;"* ]]; then
  archs="$archs;$cap"
  flags=(CMAKE_FLAGS="-DTIDE_CUDA_ARCHS='$archs'")
fi

echo "gpu-check: $gpus GPU(s), compute capability ${cap:-unknown}; building (log: out/gpu-check/build.log)"
start=$(date +%s)
if make --no-print-directory build "${flags[@]}" >out/gpu-check/build.log 2>&1; then
  build_status=passed
else
  build_status=failed
fi
build_seconds=$(($(date +%s) - start))
if [[ ! -x .venv/bin/python ]]; then
  echo "gpu-check: the build failed before the Python environment existed; see out/gpu-check/build.log" >&2
  exit 1
fi
exec .venv/bin/python scripts/gpu_check.py --build-status "$build_status" \
  --build-seconds "$build_seconds" --archs "$archs" "$@"

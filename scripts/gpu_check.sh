#!/usr/bin/env bash
# `make gpu-check`: everything that needs a real GPU, in one command, with one report
# (scripts/gpu_check.py runs the steps: docs/contributing/testing.md). Without a GPU it says so in one line and
# exits 0, before building or unpacking anything.
#
#   make gpu-check                              a GPU machine with network: builds tide (also for
#                                               this GPU's architecture when the fatbin lacks it)
#   GPU_BUNDLE=out/gpu-bundle.tar.gz make gpu-check
#                                               a lent, offline GPU machine: unpacks what
#                                               `make gpu-bundle` packed, runs with python3
#   GPU_BUNDLE=... GPU_CHECK_STANDIN=1 make gpu-check
#                                               the same, rehearsed here on the host stand-in driver
#
# Only make, bash and a python3 with torch are needed with GPU_BUNDLE (PYTHON=... picks another
# python). Exit status: 0 when every step passed, or when there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

bundle=${GPU_BUNDLE:-}
standin=${GPU_CHECK_STANDIN:-0}

if [[ $standin == 1 ]]; then
  [[ -n $bundle ]] || { echo "gpu-check: GPU_CHECK_STANDIN=1 rehearses the bundle flow: set GPU_BUNDLE too" >&2; exit 2; }
else
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  if [[ ${gpus:-0} -eq 0 ]]; then
    echo "gpu-check: no GPU on this machine (nvidia-smi lists none): nothing to check"
    exit 0
  fi
fi

if [[ -n $bundle ]]; then
  [[ -f $bundle ]] || { echo "gpu-check: GPU_BUNDLE=$bundle: no such file" >&2; exit 2; }
  python=${PYTHON:-python3}
  flags=(--bundle "$bundle")
  [[ $standin == 1 ]] && flags+=(--standin)
  echo "gpu-check: from $bundle with $(command -v "$python")$([[ $standin == 1 ]] && echo ', on the host stand-in driver (rehearsal)')"
  exec "$python" scripts/gpu_check.py "${flags[@]}" "$@"
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

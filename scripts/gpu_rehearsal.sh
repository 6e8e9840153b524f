#!/usr/bin/env bash
# `make gpu-rehearsal`: the offline GPU check's flow, rehearsed on this machine (no GPU needed).
# A scratch copy of the tree as a lent GPU machine gets it (tracked and unignored files: no .git,
# .venv or build/) plus out/gpu-bundle.tar.gz, then `GPU_BUNDLE=... GPU_CHECK_STANDIN=1 make
# gpu-check` there with .venv's python first on PATH as the machine's `python3`. The report is
# copied back to out/gpu-check/. GPU_CHECK_PYTEST_ARGS and GPU_CHECK_TIME_SCALE pass through
# (docs/contributing/testing.md).
set -euo pipefail
cd "$(dirname "$0")/.."

scratch=${GPU_REHEARSAL_DIR:-/tmp/tide-gpu-rehearsal}
[[ -f out/gpu-bundle.tar.gz ]] || { echo "gpu-rehearsal: no out/gpu-bundle.tar.gz (make gpu-bundle)" >&2; exit 1; }
[[ -x .venv/bin/python3 ]] || { echo "gpu-rehearsal: no .venv/bin/python3 (make bootstrap)" >&2; exit 1; }

# Emptied first, so only a folder this script made is ever emptied (GPU_REHEARSAL_DIR may name any).
marker=.tide-gpu-rehearsal
if [[ -e $scratch && ! -f $scratch/$marker ]]; then
  echo "gpu-rehearsal: $scratch exists and is not a rehearsal folder of ours: choose another GPU_REHEARSAL_DIR" >&2
  exit 1
fi
rm -rf "$scratch"
mkdir -p "$scratch/out"
touch "$scratch/$marker"
git ls-files -z -co --exclude-standard | xargs -0 tar -cf - | tar -C "$scratch" -xf -
cp out/gpu-bundle.tar.gz "$scratch/out/"
venv_bin=$(cd .venv/bin && pwd)

status=0
(cd "$scratch" && PATH="$venv_bin:$PATH" GPU_BUNDLE=out/gpu-bundle.tar.gz GPU_CHECK_STANDIN=1 \
   make --no-print-directory gpu-check) || status=$?
rm -rf out/gpu-check && mkdir -p out/gpu-check
cp "$scratch"/out/gpu-check/report.* "$scratch"/out/gpu-check/logs.tar.gz out/gpu-check/ 2>/dev/null || true
echo "gpu-rehearsal: report in out/gpu-check/ (the scratch tree: $scratch)"
exit $status

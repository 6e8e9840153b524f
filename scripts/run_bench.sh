#!/usr/bin/env bash
# `make bench [BENCH=name]`: runs bench/NAME.py (Python benchmarks) or build/bin/bench_NAME
# (C++ benchmarks); with no name, all of them. Each prints JSON lines, one object per case.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -z ${TIDE_CUDA_DRIVER:-} ]] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  export TIDE_CUDA_DRIVER=$PWD/build/lib/libtide_standin_cuda.so
fi

run_one() {
  local name=$1
  if [[ -f bench/$name.py ]]; then
    .venv/bin/python "bench/$name.py"
  elif [[ -x build/bin/bench_$name ]]; then
    "build/bin/bench_$name"
  else
    echo "make bench: no benchmark named '$name' (bench/$name.py or build/bin/bench_$name)" >&2
    exit 2
  fi
}

if [[ $# -gt 0 && -n $1 ]]; then
  run_one "$1"
else
  shopt -s nullglob
  names=()
  for f in bench/*.py; do names+=("$(basename "$f" .py)"); done
  for f in build/bin/bench_*; do names+=("${f#build/bin/bench_}"); done
  for name in $(printf '%s\n' "${names[@]}" | sort -u); do run_one "$name"; done
fi

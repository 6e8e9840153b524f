#!/usr/bin/env bash
# tide's main job (`make run`): the example training run once it exists, otherwise a report of
# the CUDA driver and devices tide sees. Without a GPU, tide runs over the host stand-in driver.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -z ${TIDE_CUDA_DRIVER:-} ]] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  export TIDE_CUDA_DRIVER=$PWD/build/lib/libtide_standin_cuda.so
  echo "tide: no CUDA driver on this machine; using the host stand-in driver ($TIDE_CUDA_DRIVER)"
fi

if [[ -f examples/train_gpt.py ]]; then
  exec .venv/bin/python examples/train_gpt.py "$@"
fi
build/bin/tide info

#!/usr/bin/env bash
# The numerics tests (C++ kernels and executor; Python tests marked `numerics`) once more for
# each CPU kernel variant this machine runs besides its widest, which the rest of `make test`
# uses. Each run forces tide's kernels (TIDE_CPU_ISA) and holds PyTorch's own CPU kernels, oneDNN
# and MKL to the same instruction set, so that it resembles a machine that has only that one:
# tests that compare with PyTorch must hold there too (PyTorch's kernels at AVX2 made tide and
# PyTorch part by 1.2% under bf16 autocast where AVX-512 kept them within 1e-7).
#
# usage: scripts/test_cpu_variants.sh [JOBS]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${1:-$(nproc)}
py=.venv/bin/python
numerics_ctest='^(kernels_.*|executor_numerics_test|executor_fault_test|gradient_offload_test)$'

read -r widest supported < <(env -u TIDE_CPU_ISA "$py" -c \
  'from tide import kernels; i = kernels.cpu_info(); print(i["isa"], " ".join(i["supported"]))')
echo "CPU kernel variants: ${supported} (widest: ${widest}, tested by the other runs)"
for isa in avx512 avx2 scalar; do
  [[ " ${supported} " == *" ${isa} "* && ${isa} != "${widest}" ]] || continue
  case ${isa} in
    # avx512 beside avx512bf16: the same instructions but for the bf16 roundings; PyTorch's
    # kernels and oneDNN without AVX512_BF16 too.
    avx512) torch_env=(ATEN_CPU_CAPABILITY=avx512 ONEDNN_MAX_CPU_ISA=AVX512_CORE
                       MKL_ENABLE_INSTRUCTIONS=AVX512) ;;
    avx2) torch_env=(ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2) ;;
    scalar) torch_env=(ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41
                       MKL_ENABLE_INSTRUCTIONS=SSE4_2) ;;
  esac
  echo "== numerics tests with TIDE_CPU_ISA=${isa} (${torch_env[*]})"
  (cd build && env TIDE_CPU_ISA="${isa}" "${torch_env[@]}" \
     ctest -j"${jobs}" --output-on-failure -LE gpu -R "${numerics_ctest}")
  env TIDE_CPU_ISA="${isa}" "${torch_env[@]}" \
    "$py" -m pytest -q -m "numerics and not gpu" tests/python
done

// The AVX-512 variant for CPUs with AVX512_BF16 (TIDE_CPU_ISA=avx512bf16): cpu_avx512.cpp
// compiled once more, its bf16 roundings to nearest even done by VCVTNEPS2BF16 where that gives
// the same bits (to_bf16 there). One source for both, so that the two cannot drift apart.
#define TIDE_AVX512_BF16 1
#include "kernels/cpu_avx512.cpp"  // NOLINT(bugprone-suspicious-include): on purpose, see above

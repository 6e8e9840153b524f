// The scalar variant of the CPU implementation: runs on any x86-64 (and any other) CPU.
#include <cstdint>

#include "kernels/cpu_quant8.h"
#include "kernels/cpu_variant.h"

namespace tide::kernels {
namespace {

struct AdamRange {
  template <Dtype G, Dtype S, Dtype C>
  static std::uint64_t run(const AdamCoefficients& c, const AdamSubgroup& s, std::size_t begin,
                           std::size_t end) {
    return adam_scalar_range<G, S, C>(c, s, begin, end);
  }
  template <Dtype G, Dtype C>
  static std::uint64_t run_sr(const AdamCoefficients& c, const AdamSubgroup& s, std::size_t begin,
                              std::size_t end, std::uint32_t span_key) {
    return adam_scalar_range<G, Dtype::kBFloat16, C, true>(c, s, begin, end, span_key);
  }
  template <Dtype G, Dtype C>
  static std::uint64_t run_q8(const AdamCoefficients& c, const AdamSubgroup& s, std::size_t begin,
                              std::size_t end) {
    return adam_q8_scalar_range<G, C>(c, s, begin, end);
  }
};

// A value is non-finite when its exponent bits are all ones.
template <typename Storage>
std::uint64_t count_exponent_all_ones(const Storage* x, Storage exponent, std::size_t begin,
                                      std::size_t end) {
  std::uint64_t n = 0;
  for (std::size_t i = begin; i < end; ++i) n += (x[i] & exponent) == exponent;
  return n;
}

std::uint64_t count_nonfinite(const void* values, Dtype dtype, std::size_t begin, std::size_t end) {
  if (dtype == Dtype::kFloat32) {
    return count_exponent_all_ones(static_cast<const std::uint32_t*>(values), 0x7f800000u, begin,
                                   end);
  }
  const auto exponent = static_cast<std::uint16_t>(dtype == Dtype::kBFloat16 ? 0x7f80u : 0x7c00u);
  return count_exponent_all_ones(static_cast<const std::uint16_t*>(values), exponent, begin, end);
}

void cast(const float* src, void* dst, Dtype dst_dtype, std::size_t begin, std::size_t end) {
  auto* out = static_cast<std::uint16_t*>(dst);
  if (dst_dtype == Dtype::kFloat16) {
    for (std::size_t i = begin; i < end; ++i) out[i] = float_to_fp16(src[i]);
  } else {
    for (std::size_t i = begin; i < end; ++i) out[i] = float_to_bf16(src[i]);
  }
}

}  // namespace

const CpuKernels& scalar_kernels() {
  static constexpr CpuKernels kKernels{CpuIsa::kScalar, &adam_for_dtypes<AdamRange>,
                                       &count_nonfinite, &cast};
  return kKernels;
}

}  // namespace tide::kernels

// The per-instruction-set entry points of the CPU implementation: cpu_scalar.cpp, cpu_avx2.cpp,
// cpu_avx512.cpp and cpu_avx512_bf16.cpp each define one table (the SIMD ones from the loops of
// cpu_simd.h, over their vector width). Every entry works on elements [begin, end) of its buffers
// on the calling thread; cpu_adam.cpp splits the work over threads and picks the table.
//
// The AVX2 and AVX-512 files are compiled for their instruction set with a `#pragma GCC target`
// region that starts after every #include, and keep all their code in an anonymous namespace:
// inline functions from headers (which other files also instantiate) stay compiled for the
// baseline CPU, so the linker can never pick an AVX-512 copy of one for code that runs on a CPU
// without it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/adam_math.h"
#include "kernels/cpu_adam.h"
#include "kernels/dtype.h"
#include "kernels/stochastic_round.h"

namespace tide::kernels {

struct CpuKernels {
  CpuIsa isa;
  // Returns the number of elements left unchanged (non-finite gradient or update).
  std::uint64_t (*adam)(const AdamCoefficients& terms, const AdamSubgroup& subgroup,
                        std::size_t begin, std::size_t end);
  std::uint64_t (*count_nonfinite)(const void* values, Dtype dtype, std::size_t begin,
                                   std::size_t end);
  void (*cast)(const float* src, void* dst, Dtype dst_dtype, std::size_t begin, std::size_t end);
};

const CpuKernels& scalar_kernels();
const CpuKernels& avx2_kernels();
const CpuKernels& avx512_kernels();
const CpuKernels& avx512_bf16_kernels();

// The table of `isa`; throws std::invalid_argument if this CPU cannot run it.
const CpuKernels& cpu_kernels(CpuIsa isa);

// A copy-dtype template argument meaning "no low-precision copy" (fp32 is never a copy dtype).
inline constexpr Dtype kNoCopy = Dtype::kFloat32;

// Calls fn(G, S, C) with the subgroup's dtypes as std::integral_constant<Dtype, ...> values, so
// that each variant instantiates one loop per dtype combination (18 in all) and the loops carry
// no dtype branches. The subgroup must have been validated.
template <typename Fn>
decltype(auto) dispatch_dtypes(const AdamSubgroup& s, Fn&& fn) {
  auto with_copy = [&](auto g, auto st) -> decltype(auto) {
    if (s.param_copy == nullptr) return fn(g, st, std::integral_constant<Dtype, kNoCopy>{});
    if (s.copy_dtype == Dtype::kFloat16) {
      return fn(g, st, std::integral_constant<Dtype, Dtype::kFloat16>{});
    }
    return fn(g, st, std::integral_constant<Dtype, Dtype::kBFloat16>{});
  };
  auto with_state = [&](auto g) -> decltype(auto) {
    if (s.state_dtype == Dtype::kBFloat16) {
      return with_copy(g, std::integral_constant<Dtype, Dtype::kBFloat16>{});
    }
    return with_copy(g, std::integral_constant<Dtype, Dtype::kFloat32>{});
  };
  switch (s.grad_dtype) {
    case Dtype::kBFloat16:
      return with_state(std::integral_constant<Dtype, Dtype::kBFloat16>{});
    case Dtype::kFloat16:
      return with_state(std::integral_constant<Dtype, Dtype::kFloat16>{});
    case Dtype::kFloat32:
      break;
  }
  return with_state(std::integral_constant<Dtype, Dtype::kFloat32>{});
}

// The table's adam entry for a variant whose loop over [begin, end) is Range::run<G, S, C>, and
// Range::run_q8<G, C> for 8-bit moments (kernels/cpu_quant8.h; begin a multiple of kQuantBlock):
// the subgroup's dtypes picked once, outside the loop.
// With stochastically rounded bf16 moments, Range::run_sr<G, C>(..., span_key) over pieces of
// [begin, end) whose global indices share their high 32 bits (kernels/stochastic_round.h).
template <typename Range>
std::uint64_t adam_for_dtypes(const AdamCoefficients& t, const AdamSubgroup& s, std::size_t begin,
                              std::size_t end) {
  if (s.moment_rounding == MomentRounding::kStochastic) {
    return dispatch_dtypes(s, [&](auto g, auto, auto c) {
      std::uint64_t rejected = 0;
      for (std::size_t i = begin; i < end;) {
        const std::uint64_t index = s.rounding_index + i;
        const std::uint64_t span_left = (std::uint64_t{1} << 32) - (index & 0xffffffffu);
        const std::size_t piece_end =
            i + static_cast<std::size_t>(std::min<std::uint64_t>(end - i, span_left));
        rejected += Range::template run_sr<decltype(g)::value, decltype(c)::value>(
            t, s, i, piece_end, rounding_span_key(t.rounding_key, index));
        i = piece_end;
      }
      return rejected;
    });
  }
  if (s.state_format == StateFormat::kBlockQ8) {
    return dispatch_dtypes(s, [&](auto g, auto, auto c) {
      return Range::template run_q8<decltype(g)::value, decltype(c)::value>(t, s, begin, end);
    });
  }
  return dispatch_dtypes(s, [&](auto g, auto st, auto c) {
    return Range::template run<decltype(g)::value, decltype(st)::value, decltype(c)::value>(
        t, s, begin, end);
  });
}

// The scalar loop: the scalar variant, and the tails of the AVX2 variant. Stores every element
// (old values where the update is rejected), so a rejected element's copy is the cast of its
// unchanged weight. With bf16 master weights (never with a copy) the same over the weight pair.
// kSr: bf16 moments rounded stochastically with the bits of span_key (kernels/stochastic_round.h;
// [begin, end) within one span).
template <Dtype G, Dtype S, Dtype C, bool kSr = false>
std::uint64_t adam_scalar_range(const AdamCoefficients& t, const AdamSubgroup& s, std::size_t begin,
                                std::size_t end, std::uint32_t span_key = 0) {
  static_assert(!kSr || S == Dtype::kBFloat16);
  using GT = DtypeTraits<G>;
  using ST = DtypeTraits<S>;
  const auto* grad = static_cast<const typename GT::Storage*>(s.grad);
  auto* m = static_cast<typename ST::Storage*>(s.exp_avg);
  auto* v = static_cast<typename ST::Storage*>(s.exp_avg_sq);
  float* param = s.param;
  std::uint64_t rejected = 0;
  if constexpr (C == kNoCopy) {
    if (s.master_dtype == Dtype::kBFloat16) {
      for (std::size_t i = begin; i < end; ++i) {
        float w = bf16_to_float(s.param_bf16[i]);
        float c = bf16_to_float(s.param_comp[i]);
        float mi = ST::to_float(m[i]);
        float vi = ST::to_float(v[i]);
        if (!adam_master_element<HostMath>(t, GT::to_float(grad[i]), w, c, mi, vi)) ++rejected;
        s.param_bf16[i] = float_to_bf16(w);
        s.param_comp[i] = float_to_bf16(c);
        m[i] = ST::from_float(mi);
        v[i] = ST::from_float(vi);
      }
      return rejected;
    }
  }
  for (std::size_t i = begin; i < end; ++i) {
    float p = param[i];
    float mi = ST::to_float(m[i]);
    float vi = ST::to_float(v[i]);
    if (!adam_element<HostMath>(t, GT::to_float(grad[i]), p, mi, vi)) ++rejected;
    param[i] = p;
    if constexpr (kSr) {
      const std::uint32_t h =
          rounding_bits(span_key, static_cast<std::uint32_t>(s.rounding_index + i));
      m[i] = float_to_bf16_stochastic(mi, h & 0xffffu);
      v[i] = float_to_bf16_stochastic(vi, h >> 16);
    } else {
      m[i] = ST::from_float(mi);
      v[i] = ST::from_float(vi);
    }
    if constexpr (C != kNoCopy) {
      static_cast<std::uint16_t*>(s.param_copy)[i] = DtypeTraits<C>::from_float(p);
    }
  }
  return rejected;
}

}  // namespace tide::kernels

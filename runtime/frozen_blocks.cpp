#include "runtime/frozen_blocks.h"

#include <algorithm>
#include <cmath>

#include "kernels/adam_math.h"

namespace tide::runtime {

using kernels::HostMath;
using kernels::kQuantBlock;

void FrozenQ8Blocks::save(const OptimizerState& state, std::size_t i,
                          const std::vector<ParamSlice>& frozen) {
  const std::uint64_t n = state.params(i);
  const auto* cm = static_cast<const std::uint8_t*>(state.exp_avg(i));
  const auto* cv = static_cast<const std::uint8_t*>(state.exp_avg_sq(i));
  for (const ParamSlice& slice : frozen) {
    const std::uint64_t end = slice.offset + slice.count;
    for (std::uint64_t b = slice.offset / kQuantBlock; b * kQuantBlock < end; ++b) {
      if (blocks_.empty() || blocks_.back().subgroup != i || blocks_.back().index != b) {
        Block& block = blocks_.emplace_back();
        block.subgroup = i;
        block.index = b;
        const std::uint64_t first = b * kQuantBlock;
        const std::uint64_t count = std::min<std::uint64_t>(kQuantBlock, n - first);
        std::copy(cm + first, cm + first + count, block.m.begin());
        std::copy(cv + first, cv + first + count, block.v.begin());
        block.scale_m = state.exp_avg_scale(i)[b];
        block.scale_v = state.exp_avg_sq_scale(i)[b];
      }
      Block& block = blocks_.back();
      const std::uint64_t from = std::max(slice.offset, b * kQuantBlock) - b * kQuantBlock;
      const std::uint64_t to = std::min(end, (b + 1) * kQuantBlock) - b * kQuantBlock;
      std::fill(block.frozen.begin() + static_cast<std::ptrdiff_t>(from),
                block.frozen.begin() + static_cast<std::ptrdiff_t>(to), true);
    }
  }
}

void FrozenQ8Blocks::restore(const OptimizerState& state) const {
  for (const Block& block : blocks_) {
    const std::size_t i = block.subgroup;
    const std::uint64_t first = block.index * kQuantBlock;
    const std::uint64_t count = std::min<std::uint64_t>(kQuantBlock, state.params(i) - first);
    auto* cm = static_cast<std::uint8_t*>(state.exp_avg(i)) + first;
    auto* cv = static_cast<std::uint8_t*>(state.exp_avg_sq(i)) + first;
    float& scale_m = state.exp_avg_scale(i)[block.index];
    float& scale_v = state.exp_avg_sq_scale(i)[block.index];
    if (std::all_of(block.frozen.begin(), block.frozen.begin() + static_cast<std::ptrdiff_t>(count),
                    [](bool f) { return f; })) {
      std::copy(block.m.begin(), block.m.begin() + static_cast<std::ptrdiff_t>(count), cm);
      std::copy(block.v.begin(), block.v.begin() + static_cast<std::ptrdiff_t>(count), cv);
      scale_m = block.scale_m;
      scale_v = block.scale_v;
      continue;
    }
    std::array<float, kQuantBlock> m{}, v{};
    float absmax_m = 0.0f, absmax_v = 0.0f;
    for (std::uint64_t e = 0; e < count; ++e) {
      const bool old = block.frozen[e];
      m[e] = kernels::q8_exp_avg_value<HostMath>(old ? block.m[e] : cm[e],
                                                 old ? block.scale_m : scale_m);
      v[e] = kernels::q8_exp_avg_sq_value<HostMath>(old ? block.v[e] : cv[e],
                                                    old ? block.scale_v : scale_v);
      absmax_m = std::max(absmax_m, std::fabs(m[e]));
      absmax_v = std::max(absmax_v, std::fabs(v[e]));
    }
    const kernels::Q8Normalizer nm = kernels::q8_normalizer<HostMath>(absmax_m);
    const kernels::Q8Normalizer nv = kernels::q8_normalizer<HostMath>(absmax_v);
    for (std::uint64_t e = 0; e < count; ++e) {
      cm[e] = kernels::q8_exp_avg_code<HostMath>(m[e], nm);
      cv[e] = kernels::q8_exp_avg_sq_code<HostMath>(v[e], nv);
    }
    scale_m = absmax_m;
    scale_v = absmax_v;
  }
}

}  // namespace tide::runtime

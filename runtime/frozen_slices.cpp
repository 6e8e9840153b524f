#include "runtime/frozen_slices.h"

#include <algorithm>
#include <cstring>

namespace tide::runtime {

FrozenSlices::FrozenSlices(const OptimizerState& state) : flags_(state.size()) {
  for (std::size_t i = 0; i < state.size(); ++i) flags_[i].assign(state.spec(i).slices.size(), 0);
}

bool FrozenSlices::any(std::size_t subgroup) const {
  const std::vector<char>& f = flags_.at(subgroup);
  return std::any_of(f.begin(), f.end(), [](char x) { return x != 0; });
}

void FrozenSlices::set(std::size_t subgroup, std::size_t slice, bool frozen) {
  flags_.at(subgroup).at(slice) = frozen ? 1 : 0;
}

FrozenSlices::Saved FrozenSlices::save(OptimizerState& state) const {
  Saved saved;
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < state.size(); ++i) {
    for (std::size_t k = 0; k < flags_[i].size(); ++k) {
      if (flags_[i][k]) total += state.spec(i).slices[k].count;
    }
  }
  if (total == 0) return saved;
  // 8-bit moments: the master weights here, the moments' blocks in `saved.blocks`.
  saved.bytes.resize((state.quantized() ? 4 : state.state_bytes()) * total);  // may throw
  std::vector<ParamSlice> frozen;
  for (std::size_t i = 0; i < state.size(); ++i) {
    frozen.clear();
    for (std::size_t k = 0; k < flags_[i].size(); ++k) {
      if (flags_[i][k]) frozen.push_back(state.spec(i).slices[k]);
    }
    if (state.quantized()) saved.blocks.save(state, i, frozen);  // may throw: nothing changed yet
  }
  char* out = saved.bytes.data();
  for (std::size_t i = 0; i < state.size(); ++i) {
    for (std::size_t k = 0; k < flags_[i].size(); ++k) {
      if (!flags_[i][k]) continue;
      const ParamSlice& slice = state.spec(i).slices[k];
      for (const auto& [part, size] : parts(state, i)) {
        const char* from = part + slice.offset * size;
        out = std::copy(from, from + slice.count * size, out);
      }
      if (state.host_params()) continue;
      std::memset(static_cast<char*>(state.grad(i)) + slice.offset * state.grad_bytes(), 0,
                  slice.count * state.grad_bytes());
    }
  }
  return saved;
}

void FrozenSlices::restore(const OptimizerState& state, const Saved& saved) const {
  if (saved.bytes.empty()) return;
  const char* in = saved.bytes.data();
  for (std::size_t i = 0; i < state.size(); ++i) {
    for (std::size_t k = 0; k < flags_[i].size(); ++k) {
      if (!flags_[i][k]) continue;
      const ParamSlice& slice = state.spec(i).slices[k];
      for (const auto& [part, size] : parts(state, i)) {
        std::copy(in, in + slice.count * size, part + slice.offset * size);
        in += slice.count * size;
      }
    }
  }
  saved.blocks.restore(state);
}

// The master weights (fp32; or bf16 weights, then their compensation; none when host-resident:
// those parameters are never written for a frozen slice) and the moments (unless 8-bit: their
// blocks are saved whole).
std::vector<std::pair<char*, unsigned>> FrozenSlices::parts(const OptimizerState& state,
                                                            std::size_t i) {
  std::vector<std::pair<char*, unsigned>> parts;
  if (state.bf16_master()) {
    parts.emplace_back(reinterpret_cast<char*>(state.master_bf16(i)), 2u);
    parts.emplace_back(reinterpret_cast<char*>(state.master_comp(i)), 2u);
  } else if (!state.host_params()) {
    parts.emplace_back(reinterpret_cast<char*>(state.param(i)), 4u);
  }
  if (state.quantized()) return parts;
  parts.emplace_back(static_cast<char*>(state.exp_avg(i)), state.moment_bytes());
  parts.emplace_back(static_cast<char*>(state.exp_avg_sq(i)), state.moment_bytes());
  return parts;
}

}  // namespace tide::runtime

// What a step must leave of frozen slices (parameters without a gradient this step) when the
// moments are 8-bit (kernels/quant8.h). Their codes cannot be saved and put back one element at
// a time: a quantization block shares one scale among its elements, and a block that also holds
// updated elements gets a new scale. So the blocks that frozen slices touch are saved whole
// before the step, and after it each is put back: exactly (codes and scales) when all of its
// elements are frozen, else requantized from its frozen elements' old values and the others'
// new values, as the kernels requantize an element whose update they reject (the frozen
// elements keep their moments' values, their codes under the block's new scale). The master
// weights are saved and restored exactly, as for every format (Executor::save_frozen).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/quant8.h"
#include "runtime/optimizer_state.h"

namespace tide::runtime {

class FrozenQ8Blocks {
 public:
  // Saves the blocks of subgroup i's moments that `frozen` (its frozen slices, sorted by
  // offset) touch. Throws std::bad_alloc before anything changed.
  void save(const OptimizerState& state, std::size_t i, const std::vector<ParamSlice>& frozen);
  // Puts every saved block back (see above) into the subgroups' current slots.
  void restore(const OptimizerState& state) const;

 private:
  struct Block {
    std::size_t subgroup = 0;
    std::uint64_t index = 0;  // of the block in its subgroup
    std::array<std::uint8_t, kernels::kQuantBlock> m{}, v{};
    float scale_m = 0.0f, scale_v = 0.0f;
    std::array<bool, kernels::kQuantBlock> frozen{};
  };
  std::vector<Block> blocks_;
};

}  // namespace tide::runtime

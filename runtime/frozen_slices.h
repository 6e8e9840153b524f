// Frozen slices: parameters without a gradient this step, which torch.optim leaves untouched. An
// update phase updates whole subgroups, so the executor saves what the frozen slices hold before
// the phase and puts it back after it: their master weights and moments come out of the step
// exactly as they went in (8-bit moments: by their blocks, runtime/frozen_blocks.h).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "runtime/frozen_blocks.h"
#include "runtime/optimizer_state.h"

namespace tide::runtime {

class FrozenSlices {
 public:
  // Nothing frozen.
  explicit FrozenSlices(const OptimizerState& state);

  // `slice` is the slice's position in state.spec(subgroup).slices. Kept until changed.
  void set(std::size_t subgroup, std::size_t slice, bool frozen);
  bool frozen(std::size_t subgroup, std::size_t slice) const {
    return flags_.at(subgroup).at(slice) != 0;
  }
  bool any(std::size_t subgroup) const;  // some slice of the subgroup is frozen

  // What save() took: the frozen slices' state, in order, and their 8-bit moments' blocks.
  struct Saved {
    std::vector<char> bytes;
    FrozenQ8Blocks blocks;
  };
  // Saves every frozen slice's state and zeroes its gradient in the pinned buffer (so that its
  // update is finite and counts as nothing; host-resident parameters have no buffer: the GPU
  // copy-in zeroes theirs, the CPU update skips them). Throws std::bad_alloc before anything
  // changed.
  Saved save(OptimizerState& state) const;
  // Puts what save() took back into the subgroups' current slots.
  void restore(const OptimizerState& state, const Saved& saved) const;

 private:
  // Subgroup i's parts a frozen slice keeps, each with its element size.
  static std::vector<std::pair<char*, unsigned>> parts(const OptimizerState& state, std::size_t i);

  std::vector<std::vector<char>> flags_;  // per subgroup, per slice
};

}  // namespace tide::runtime

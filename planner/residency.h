// Residency: which subgroups keep their state (master weights and moments) in device memory
// across iterations, so that their update copies nothing over the link. A pure decision, made
// before every update phase from the memory that can be held through a whole iteration (the
// allocator's held headroom forecast), with hysteresis so that a forecast that wobbles does not
// move state back and forth every step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tide::planner {

struct ResidencyInput {
  std::vector<std::uint64_t> slot_bytes;  // by subgroup: its state slot's bytes
  std::vector<char> allowed;              // by subgroup: may be resident this phase (1) or not
  std::vector<char> resident;             // by subgroup: resident now
  // Bytes that may be held through the whole iteration, forward and backward included.
  std::uint64_t held_bytes = 0;
  // Held besides the slots while a resident subgroup is updated: its gradient and weights area
  // (the executor's lane), reserved first.
  std::uint64_t working_bytes = 0;
  // A subgroup joins only while the resident slots stay under (1 - hysteresis) of what is left
  // after working_bytes; one leaves only when they no longer fit under all of it.
  double hysteresis = 0.05;
};

// By subgroup, whether it is resident in the coming phase. Subgroups stay resident while they
// fit (the last ones, by index, leave first when they no longer do) and join in index order, so
// that a steady forecast keeps a steady set.
std::vector<char> choose_resident(const ResidencyInput& input);

// Bytes of the slots `resident` marks.
std::uint64_t resident_bytes(const std::vector<std::uint64_t>& slot_bytes,
                             const std::vector<char>& resident);

}  // namespace tide::planner

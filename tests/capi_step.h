// One tide_optimizer_step as tests call it: hyperparameters, a policy (NULL: TIDE_PLACEMENT) and a
// headroom, with the result in `result` when given.
#pragma once

#include <cstdint>

#include "tide/tide.h"

namespace tide::test {

inline tide_status step_once(tide_optimizer* optimizer, const tide_adam_hyper* hyper,
                             const tide_placement_policy* policy, std::uint64_t headroom_bytes,
                             tide_step_result* result = nullptr) {
  tide_step_request request = tide_step_request_default();
  if (hyper != nullptr) request.hyper = *hyper;
  request.policy = policy;
  request.headroom_bytes = headroom_bytes;
  tide_step_result local = tide_step_result_default();
  return tide_optimizer_step(optimizer, &request, result != nullptr ? result : &local);
}

}  // namespace tide::test

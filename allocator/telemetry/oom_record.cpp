#include "allocator/telemetry/oom_record.h"

#include "config/bytes.h"

namespace tide::allocator::telemetry {

std::string OomRecord::describe(int device) const {
  const auto b = config::format_bytes_apart({requested, rounded, allocated, reserved, limit,
                                             device_free, device_total, largest_free_block});
  return "tide: out of memory on device " + std::to_string(device) + ": asked for " + b[0] +
         " (block of " + b[1] + "); " + b[2] + " live, " + b[3] + " reserved of a limit of " +
         b[4] +
         (limit_reached ? " (the limit refused it: TIDE_ALLOC_MEMORY_FRACTION, "
                          "TIDE_ALLOC_MAX_BYTES or set_memory_fraction)"
                        : "") +
         "; the device has " + b[5] + " free of " + b[6] + "; largest free cached block " + b[7];
}

}  // namespace tide::allocator::telemetry

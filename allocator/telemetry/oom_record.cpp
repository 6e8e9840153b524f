#include "allocator/telemetry/oom_record.h"

#include <cstdio>

namespace tide::allocator::telemetry {

std::string OomRecord::describe(int device) const {
  auto mib = [](std::uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); };
  char text[512];
  std::snprintf(
      text, sizeof text,
      "tide: out of memory on device %d: asked for %.2f MiB (block of %.2f MiB); %.2f MiB "
      "live, %.2f MiB reserved of a limit of %.2f MiB%s; the device has %.2f MiB free of "
      "%.2f MiB; largest free cached block %.2f MiB",
      device, mib(requested), mib(rounded), mib(allocated), mib(reserved), mib(limit),
      limit_reached ? " (the limit refused it: TIDE_ALLOC_MEMORY_FRACTION, "
                      "TIDE_ALLOC_MAX_BYTES or set_memory_fraction)"
                    : "",
      mib(device_free), mib(device_total), mib(largest_free_block));
  return text;
}

}  // namespace tide::allocator::telemetry

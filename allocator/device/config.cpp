#include "allocator/device/config.h"

#include <cstdint>
#include <limits>

#include "config/env.h"
#include "config/knobs.h"

namespace tide::allocator::device {

AllocatorConfig AllocatorConfig::from_environment() {
  AllocatorConfig c;
  if (auto v = config::env_double("TIDE_ALLOC_MEMORY_FRACTION", 0.0, 1.0)) {
    if (*v <= 0.0) {
      throw config::EnvError("TIDE_ALLOC_MEMORY_FRACTION",
                             *config::env_text("TIDE_ALLOC_MEMORY_FRACTION"),
                             "a number greater than 0 and at most 1");
    }
    c.memory_fraction = *v;
  }
  // 0 is refused rather than read as a cap of nothing or as none: unset means no cap.
  if (auto v =
          config::env_bytes("TIDE_ALLOC_MAX_BYTES", 1, std::numeric_limits<std::uint64_t>::max(),
                            config::kLimitAccepts)) {
    c.max_bytes = *v;
  }
  if (auto v = config::env_int("TIDE_ALLOC_ROUND_DIVISIONS", 0, 64)) {
    c.round_divisions = static_cast<int>(*v);
  }
  if (auto v = config::env_bool("TIDE_ALLOC_GROWABLE")) c.growable = *v;
  if (auto v = config::env_bytes("TIDE_ALLOC_THREAD_CACHE")) c.thread_cache_bytes = *v;
  if (auto v = config::env_int("TIDE_TELEMETRY_SAMPLES", 1024, std::int64_t{1} << 26)) {
    c.telemetry_samples = static_cast<std::size_t>(*v);
  }
  if (auto v = config::env_bytes("TIDE_TELEMETRY_RESOLUTION")) c.telemetry_resolution = *v;
  if (auto v = config::env_double("TIDE_HEADROOM_MARGIN", 0.0, 0.5)) c.headroom_margin = *v;
  if (auto v = config::env_int("TIDE_HEADROOM_ITERATIONS", 1, 1000)) {
    c.headroom_iterations = static_cast<int>(*v);
  }
  return c;
}

}  // namespace tide::allocator::device

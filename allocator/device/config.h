// The device caching allocator's settings, read from TIDE_ALLOC_* / TIDE_TELEMETRY_* /
// TIDE_HEADROOM_* variables (registered in config/knobs.cpp, documented in the README).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace tide::allocator::device {

struct AllocatorConfig {
  // Cap on reserved bytes: a fraction of the device's memory, and/or a number of bytes (the
  // smaller wins). Unset: no cap but the device's own capacity.
  std::optional<double> memory_fraction;   // TIDE_ALLOC_MEMORY_FRACTION
  std::optional<std::uint64_t> max_bytes;  // TIDE_ALLOC_MAX_BYTES
  // Large requests rounded up to one of N equal steps per power of two (0: 512-byte multiples
  // only). Coarser rounding lets blocks of nearby sizes be reused for each other.
  int round_divisions = 0;  // TIDE_ALLOC_ROUND_DIVISIONS
  // The large pool grows one reserved address range through the driver's virtual-memory calls
  // where the driver has them.
  bool growable = true;  // TIDE_ALLOC_GROWABLE
  // Bytes of small free blocks each thread keeps for itself (0: none).
  std::size_t thread_cache_bytes = std::size_t{4} << 20;  // TIDE_ALLOC_THREAD_CACHE
  // Timeline samples kept per device, and the change in live or reserved bytes that makes a new
  // sample (0: the device's memory / 16384).
  std::size_t telemetry_samples = std::size_t{1} << 16;  // TIDE_TELEMETRY_SAMPLES
  std::uint64_t telemetry_resolution = 0;                // TIDE_TELEMETRY_RESOLUTION
  // Headroom forecast: safety margin as a fraction of the device memory limit, and how many
  // recent iterations it looks at.
  double headroom_margin = 0.02;  // TIDE_HEADROOM_MARGIN
  int headroom_iterations = 5;    // TIDE_HEADROOM_ITERATIONS

  // Defaults overridden by the environment; throws config::EnvError for a bad value.
  static AllocatorConfig from_environment();
};

}  // namespace tide::allocator::device

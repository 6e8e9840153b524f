// cuInit: what the stand-in simulates, read once from TIDE_STANDIN_* (config/knobs.cpp).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace tide::standin {

struct Config {
  int devices = 1;
  std::uint64_t memory = std::uint64_t{8} << 30;  // per device
  double h2d_bytes_per_s = 0;                     // 0: no simulated limit
  double d2h_bytes_per_s = 0;
  std::uint64_t fail_alloc = 0;  // 0: no fault armed
  std::uint64_t fail_copy = 0;
  std::uint64_t device_lost = 0;
  bool hmm = false;  // devices may address pageable host memory (host_access.h)
};

// Reads the environment; throws tide::config::EnvError for a bad value.
Config read_config();

// The first call reads the configuration and creates the devices; a bad value makes this and
// every later call fail with CUDA_ERROR_INVALID_VALUE (the message is printed once, to stderr).
// In a child forked after a successful cuInit, this and every other call fail with
// CUDA_ERROR_NOT_INITIALIZED, as with CUDA.
CUresult initialize(unsigned flags);
bool initialized();

}  // namespace tide::standin

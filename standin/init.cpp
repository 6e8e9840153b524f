#include "standin/init.h"

#include <pthread.h>

#include <atomic>
#include <cstdio>
#include <limits>
#include <mutex>
#include <string>

#include "config/env.h"
#include "standin/bandwidth.h"
#include "standin/devices.h"
#include "standin/faults.h"
#include "standin/host_access.h"

namespace tide::standin {
namespace {

std::atomic<bool> g_ready{false};
// Set in the child of a fork() after cuInit: the stream workers did not survive the fork.
std::atomic<bool> g_forked{false};

// A rate in GB/s, strictly positive: TIDE_STANDIN_H2D_GBPS / _D2H_GBPS.
double rate_bytes_per_s(const char* name) {
  static constexpr const char* kAccepts = "a number of GB/s (1e9 bytes/s) greater than 0";
  const auto text = config::env_text(name);
  if (!text) return 0;
  double gbps = 0;
  try {
    gbps = config::parse_double(name, *text, 0, std::numeric_limits<double>::max());
  } catch (const config::EnvError&) {
    throw config::EnvError(name, *text, kAccepts);
  }
  if (gbps <= 0) throw config::EnvError(name, *text, kAccepts);
  return gbps * 1e9;
}

std::uint64_t fault_number(const char* name) {
  return static_cast<std::uint64_t>(
      config::env_int(name, 1, std::numeric_limits<std::int64_t>::max()).value_or(0));
}

}  // namespace

Config read_config() {
  Config c;
  c.devices = static_cast<int>(config::env_int("TIDE_STANDIN_DEVICES", 1, 16).value_or(1));
  c.memory = config::env_bytes("TIDE_STANDIN_MEMORY").value_or(c.memory);
  c.h2d_bytes_per_s = rate_bytes_per_s("TIDE_STANDIN_H2D_GBPS");
  c.d2h_bytes_per_s = rate_bytes_per_s("TIDE_STANDIN_D2H_GBPS");
  c.fail_alloc = fault_number("TIDE_STANDIN_FAIL_ALLOC");
  c.fail_copy = fault_number("TIDE_STANDIN_FAIL_COPY");
  c.device_lost = fault_number("TIDE_STANDIN_DEVICE_LOST");
  c.hmm = config::env_bool("TIDE_STANDIN_HMM").value_or(false);
  return c;
}

CUresult initialize(unsigned flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (g_forked.load()) return CUDA_ERROR_NOT_INITIALIZED;
  static std::once_flag once;
  static CUresult result = CUDA_ERROR_NOT_INITIALIZED;
  std::call_once(once, [] {
    try {
      const Config c = read_config();
      create_devices(c.devices, c.memory);
      set_rate(Direction::kHostToDevice, c.h2d_bytes_per_s);
      set_rate(Direction::kDeviceToHost, c.d2h_bytes_per_s);
      arm_from_environment(c.fail_alloc, c.fail_copy, c.device_lost);
      if (c.hmm) set_host_addressable(true);  // not off: tide_standin_set_hmm may precede cuInit
      // As with CUDA, a child forked after cuInit cannot use the driver: its calls fail with
      // CUDA_ERROR_NOT_INITIALIZED instead of waiting forever for workers it does not have.
      pthread_atfork(nullptr, nullptr, [] { g_forked.store(true); });
      result = CUDA_SUCCESS;
      g_ready.store(true, std::memory_order_release);
    } catch (const config::EnvError& e) {
      std::fprintf(stderr, "tide stand-in driver: %s\n", e.what());
      result = CUDA_ERROR_INVALID_VALUE;
    }
  });
  return result;
}

bool initialized() { return g_ready.load(std::memory_order_acquire) && !g_forked.load(); }

}  // namespace tide::standin

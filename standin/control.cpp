// The control API of standin.h.
#include <cmath>
#include <cstddef>
#include <cstring>

#include "standin/bandwidth.h"
#include "standin/busy.h"
#include "standin/devices.h"
#include "standin/faults.h"
#include "standin/holds.h"
#include "standin/host_access.h"
#include "standin/init.h"
#include "standin/modules.h"
#include "standin/recording.h"
#include "standin/standin.h"
#include "standin/stats.h"

namespace {

struct Field {
  const char* name;
  std::size_t offset;
};

#define TIDE_STANDIN_FIELD(name) \
  { #name, offsetof(tide_standin_stats, name) }
constexpr Field kFields[] = {
    TIDE_STANDIN_FIELD(driver_calls),
    TIDE_STANDIN_FIELD(device_allocs),
    TIDE_STANDIN_FIELD(device_frees),
    TIDE_STANDIN_FIELD(mem_creates),
    TIDE_STANDIN_FIELD(mem_releases),
    TIDE_STANDIN_FIELD(copies_h2d),
    TIDE_STANDIN_FIELD(copies_d2h),
    TIDE_STANDIN_FIELD(copies_d2d),
    TIDE_STANDIN_FIELD(bytes_h2d),
    TIDE_STANDIN_FIELD(bytes_d2h),
    TIDE_STANDIN_FIELD(bytes_d2d),
    TIDE_STANDIN_FIELD(memsets),
    TIDE_STANDIN_FIELD(pageable_async_copies),
    TIDE_STANDIN_FIELD(host_registers),
    TIDE_STANDIN_FIELD(host_unregisters),
    TIDE_STANDIN_FIELD(host_allocs),
    TIDE_STANDIN_FIELD(host_frees),
    TIDE_STANDIN_FIELD(kernel_launches),
    TIDE_STANDIN_FIELD(host_funcs),
    TIDE_STANDIN_FIELD(injected_faults),
    TIDE_STANDIN_FIELD(device_bytes_in_use),
    TIDE_STANDIN_FIELD(device_bytes_peak),
    TIDE_STANDIN_FIELD(registered_host_bytes),
    TIDE_STANDIN_FIELD(host_alloc_bytes),
    TIDE_STANDIN_FIELD(primary_ctx_retains),
    TIDE_STANDIN_FIELD(primary_ctx_releases),
    TIDE_STANDIN_FIELD(unretained_releases),
    TIDE_STANDIN_FIELD(calls_without_context),
    TIDE_STANDIN_FIELD(destroyed_stream_uses),
    TIDE_STANDIN_FIELD(primary_ctx_references),
    TIDE_STANDIN_FIELD(events_created),
    TIDE_STANDIN_FIELD(events_destroyed),
};
#undef TIDE_STANDIN_FIELD
static_assert(sizeof kFields / sizeof kFields[0] * sizeof(std::uint64_t) ==
                  sizeof(tide_standin_stats),
              "every field of tide_standin_stats has a name");

int require_init() { return tide::standin::initialized() ? 0 : CUDA_ERROR_NOT_INITIALIZED; }

}  // namespace

extern "C" {

void tide_standin_get_stats(tide_standin_stats* out) {
  if (out != nullptr) *out = tide::standin::snapshot();
}

int tide_standin_stat(const char* name, uint64_t* value) {
  if (name == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const tide_standin_stats stats = tide::standin::snapshot();
  for (const Field& field : kFields) {
    if (std::strcmp(field.name, name) == 0) {
      std::memcpy(value, reinterpret_cast<const char*>(&stats) + field.offset, sizeof *value);
      return 0;
    }
  }
  return CUDA_ERROR_INVALID_VALUE;
}

void tide_standin_reset_stats(void) { tide::standin::reset_counters(); }

int tide_standin_fail_alloc(uint64_t n) {
  if (int r = require_init(); r != 0) return r;
  tide::standin::arm_alloc_failure(n);
  return 0;
}

int tide_standin_fail_pin(uint64_t n) {
  if (int r = require_init(); r != 0) return r;
  tide::standin::arm_pin_failure(n);
  return 0;
}

int tide_standin_fail_copy(uint64_t n) {
  if (int r = require_init(); r != 0) return r;
  tide::standin::arm_copy_failure(n);
  return 0;
}

int tide_standin_fail_launch(uint64_t n) {
  if (int r = require_init(); r != 0) return r;
  tide::standin::arm_launch_failure(n);
  return 0;
}

int tide_standin_device_lost(uint64_t n) {
  if (int r = require_init(); r != 0) return r;
  tide::standin::arm_device_lost(n);
  return 0;
}

int tide_standin_set_bandwidth(double h2d_gbps, double d2h_gbps) {
  if (int r = require_init(); r != 0) return r;
  if (!std::isfinite(h2d_gbps) || !std::isfinite(d2h_gbps) || h2d_gbps < 0 || d2h_gbps < 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  tide::standin::set_rate(tide::standin::Direction::kHostToDevice, h2d_gbps * 1e9);
  tide::standin::set_rate(tide::standin::Direction::kDeviceToHost, d2h_gbps * 1e9);
  return 0;
}

int tide_standin_set_hmm(int on) {
  if (on != 0 && on != 1) return CUDA_ERROR_INVALID_VALUE;
  tide::standin::set_host_addressable(on == 1);
  return 0;
}

int tide_standin_device_memory(int device, uint64_t* used, uint64_t* peak, uint64_t* capacity) {
  if (int r = require_init(); r != 0) return r;
  const tide::standin::Device* d = tide::standin::find_device(device);
  if (d == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  if (used != nullptr) *used = d->memory.used();
  if (peak != nullptr) *peak = d->memory.peak();
  if (capacity != nullptr) *capacity = d->memory.capacity();
  return 0;
}

int tide_standin_set_capacity(int device, uint64_t bytes) {
  if (int r = require_init(); r != 0) return r;
  tide::standin::Device* d = tide::standin::find_device(device);
  if (d == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  d->memory.set_capacity(bytes);
  return 0;
}

int tide_standin_register_kernel(const char* name, tide_standin_kernel run, size_t param_bytes) {
  try {
    return tide::standin::register_kernel(name, run, param_bytes);
  } catch (...) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
}

int tide_standin_busy(void* stream, double seconds, const char* name) {
  if (int r = require_init(); r != 0) return r;
  try {
    return tide::standin::enqueue_busy(static_cast<CUstream>(stream), seconds, name);
  } catch (...) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
}

int tide_standin_record(size_t capacity) { return tide::standin::start_recording(capacity); }

int tide_standin_recorded(tide_standin_op* out, size_t max, size_t* recorded, uint64_t* dropped) {
  if (recorded == nullptr || (out == nullptr && max != 0)) return CUDA_ERROR_INVALID_VALUE;
  tide::standin::copy_recording(out, max, recorded, dropped);
  return 0;
}

int tide_standin_hold(unsigned kinds) { return tide::standin::hold(kinds); }

int tide_standin_release(unsigned kinds, uint64_t count) {
  return tide::standin::release(kinds, count);
}

}  // extern "C"

// The C ABI of the device caching allocator (include/tide/tide.h, "device caching allocator"),
// compiled into libtide.so itself (allocator/CMakeLists.txt says why).
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "allocator/device/device_registry.h"
#include "capi/status.h"
#include "capi/versioned.h"
#include "tide/tide.h"

namespace {

using tide::capi::require;

namespace telemetry = tide::allocator::telemetry;
using tide::allocator::device::AllocatorStats;
using tide::allocator::device::CachingAllocator;
using tide::allocator::device::device_allocator;
using tide::allocator::device::find_device_allocator;
using tide::allocator::device::for_each_device_allocator;
using tide::allocator::device::kMaxDevices;
using tide::allocator::device::Stat;

CUstream as_stream(void* stream) { return static_cast<CUstream>(stream); }

// The hooks return nothing: a failure is this thread's last error and a line on stderr.
template <typename Body>
void hook(const char* name, Body&& body) noexcept {
  if (tide::capi::guard(std::forward<Body>(body)) != TIDE_OK) {
    std::fprintf(stderr, "%s: %s\n", name, tide::capi::last_error_text());
  }
}

void for_devices(int device, const std::function<void(CachingAllocator&)>& fn) {
  if (device >= 0) {
    fn(device_allocator(device));
    return;
  }
  require(device == -1, "tide allocator: device must be >= 0, or -1 for every device");
  for_each_device_allocator(fn);
}

// Allocates; when out of memory returns NULL with this thread's last error describing the
// allocator's state. Throws what the allocator throws (a failing driver call).
void* allocate_or_describe(size_t size, int device, void* stream) {
  CachingAllocator& allocator = device_allocator(device);
  void* ptr = allocator.allocate(size, as_stream(stream));
  if (ptr == nullptr && size != 0) {
    const auto ooms = allocator.ooms();
    tide::capi::set_last_error(ooms.empty() ? std::string("tide: out of memory")
                                            : ooms.back().describe(device));
  }
  return ptr;
}

tide_alloc_stat to_c(const Stat& s) {
  return tide_alloc_stat{s.current, s.peak, s.allocated, s.freed};
}

tide_alloc_iteration to_c(const telemetry::IterationStats& it) {
  tide_alloc_iteration out{};
  out.index = it.index;
  out.start_ns = it.start_ns;
  out.end_ns = it.end_ns;
  for (int p = 0; p < telemetry::kPhaseCount; ++p) {
    out.phase_start_ns[p] = it.phase_start_ns[p];
    out.peak_live_bytes[p] = it.peak_live[p];
    out.peak_reserved_bytes[p] = it.peak_reserved[p];
    if (it.phase_seen[p]) out.phase_seen |= 1u << p;
  }
  out.peak_live_all_bytes = it.peak_live_all;
  out.min_live_bytes = it.min_live;
  out.detected = it.detected ? 1 : 0;
  return out;
}

// Copies the newest `capacity` items of `items` into `out` (out null: only the count).
template <typename T, typename C, typename Convert>
void copy_newest(const std::vector<T>& items, C* out, size_t capacity, size_t* count,
                 Convert convert) {
  require(count != nullptr, "tide allocator: null count");
  if (out == nullptr) {
    *count = items.size();
    return;
  }
  const size_t n = items.size() < capacity ? items.size() : capacity;
  const size_t first = items.size() - n;
  for (size_t i = 0; i < n; ++i) out[i] = convert(items[first + i]);
  *count = n;
}

}  // namespace

extern "C" {

TIDE_API void* tide_alloc(size_t size, int device, void* stream) {
  tide::capi::count_call();
  try {
    return allocate_or_describe(size, device, stream);
  } catch (...) {
    tide::capi::status_of_current_exception();
    return nullptr;
  }
}

// PyTorch stores what its pluggable allocate function returns as the tensor's data pointer without
// looking (CUDAPluggableAllocator::malloc, PyTorch 2.15): a NULL would be a crash later, far from
// the cause. Its own caching allocator throws c10::OutOfMemoryError from the same place, so every
// caller above is written for an exception; one of c10's types cannot be thrown without building
// against PyTorch, a std::runtime_error can, and PyTorch's bindings make it a RuntimeError with
// this message. The "CUDA out of memory." prefix is PyTorch's own, which code that retries with
// smaller batches looks for.
TIDE_API void* tide_alloc_throwing(size_t size, int device, void* stream) {
  tide::capi::count_call();
  void* ptr = nullptr;
  try {
    ptr = allocate_or_describe(size, device, stream);
  } catch (const std::exception& e) {
    tide::capi::status_of_current_exception();
    throw std::runtime_error(e.what());
  }
  if (ptr == nullptr && size != 0) {
    throw std::runtime_error(std::string("CUDA out of memory. ") + tide::capi::last_error_text() +
                             " (tide.torch.last_oom() and tide.torch.memory_stats() have more)");
  }
  return ptr;
}

TIDE_API void tide_free(void* ptr, size_t size, int device, void* stream) {
  if (ptr == nullptr) {
    tide::capi::count_call();
    return;
  }
  hook("tide_free", [&] { device_allocator(device).deallocate(ptr, size, as_stream(stream)); });
}

TIDE_API void tide_alloc_hook_init(int device_count) {
  // Allocators are created on first use; creating them now only checks the driver early.
  hook("tide_alloc_hook_init", [&] {
    for (int d = 0; d < device_count && d < kMaxDevices; ++d) device_allocator(d);
  });
}

TIDE_API void tide_alloc_hook_reset(void) {
  hook("tide_alloc_hook_reset",
       [] { for_devices(-1, [](CachingAllocator& a) { a.empty_cache(); }); });
}

TIDE_API void tide_alloc_hook_memory_fraction(double fraction, int device) {
  hook("tide_alloc_hook_memory_fraction",
       [&] { device_allocator(device).set_memory_fraction(fraction); });
}

TIDE_API void tide_alloc_hook_record_stream(void* ptr, void* stream) {
  hook("tide_alloc_hook_record_stream", [&] {
    bool found = false;
    for_each_device_allocator([&](CachingAllocator& a) {
      if (!found && a.owns(ptr)) {
        a.record_stream(ptr, as_stream(stream));
        found = true;
      }
    });
    require(found, "tide allocator: record_stream of an address it did not hand out");
  });
}

TIDE_API tide_status tide_alloc_get_stats(int device, tide_alloc_stats* stats) {
  return tide::capi::guard([&] {
    require(stats != nullptr, "tide_alloc_get_stats: null stats");
    const AllocatorStats s = device_allocator(device).stats();
    tide_alloc_stats out{};
    for (int i = 0; i < 3; ++i) {
      out.allocated_bytes[i] = to_c(s.allocated_bytes[i]);
      out.requested_bytes[i] = to_c(s.requested_bytes[i]);
      out.reserved_bytes[i] = to_c(s.reserved_bytes[i]);
      out.active_bytes[i] = to_c(s.active_bytes[i]);
      out.allocation[i] = to_c(s.allocation[i]);
      out.active[i] = to_c(s.active[i]);
      out.segment[i] = to_c(s.segment[i]);
      out.inactive_split_bytes[i] = s.inactive_split_bytes[i];
      out.inactive_split[i] = s.inactive_split[i];
    }
    out.num_alloc_retries = s.num_alloc_retries;
    out.num_ooms = s.num_ooms;
    out.num_sync_all_streams = s.num_sync_all_streams;
    out.num_device_alloc = s.num_device_alloc;
    out.num_device_free = s.num_device_free;
    out.memory_limit = s.memory_limit;
    out.thread_cached_bytes = s.thread_cached_bytes;
    out.largest_free_block = s.largest_free_block;
    out.growable = s.growable;
    out.thread_cache_hits = s.thread_cache_hits;
    tide::capi::write_versioned(stats, out, "tide_alloc_stats");
  });
}

TIDE_API tide_status tide_alloc_reset_peak_stats(int device) {
  return tide::capi::guard([&] { device_allocator(device).reset_peak_stats(); });
}

TIDE_API tide_status tide_alloc_reset_accumulated_stats(int device) {
  return tide::capi::guard([&] { device_allocator(device).reset_accumulated_stats(); });
}

TIDE_API tide_status tide_alloc_empty_cache(int device) {
  return tide::capi::guard(
      [&] { for_devices(device, [](CachingAllocator& a) { a.empty_cache(); }); });
}

TIDE_API tide_status tide_alloc_set_memory_fraction(int device, double fraction) {
  return tide::capi::guard([&] { device_allocator(device).set_memory_fraction(fraction); });
}

TIDE_API tide_status tide_alloc_record_stream(void* ptr, void* stream) {
  return tide::capi::guard([&] {
    bool found = false;
    for_each_device_allocator([&](CachingAllocator& a) {
      if (!found && a.owns(ptr)) {
        a.record_stream(ptr, as_stream(stream));
        found = true;
      }
    });
    require(found, "tide_alloc_record_stream: not an address the allocator handed out");
  });
}

TIDE_API tide_status tide_alloc_mark_phase(int device, int phase) {
  return tide::capi::guard([&] {
    require(phase >= TIDE_PHASE_FORWARD && phase <= TIDE_PHASE_ITERATION_END,
            "tide_alloc_mark_phase: phase must be a tide_phase (0 forward, 1 backward, 2 update, "
            "3 iteration end)");
    const auto mark = static_cast<telemetry::Mark>(phase);
    if (device == -1 && find_device_allocator(0) == nullptr) device_allocator(0);
    for_devices(device, [&](CachingAllocator& a) { a.mark(mark); });
  });
}

TIDE_API tide_status tide_alloc_timeline(int device, tide_alloc_sample* out, size_t capacity,
                                         size_t* count) {
  return tide::capi::guard([&] {
    const auto samples = device_allocator(device).timeline();
    copy_newest(samples, out, capacity, count, [](const telemetry::Sample& s) {
      return tide_alloc_sample{s.t_ns, s.live, s.reserved};
    });
  });
}

TIDE_API tide_status tide_alloc_iterations(int device, tide_alloc_iteration* out, size_t capacity,
                                           size_t* count) {
  return tide::capi::guard([&] {
    const auto iterations = device_allocator(device).iterations();
    copy_newest(iterations, out, capacity, count,
                [](const telemetry::IterationStats& it) { return to_c(it); });
  });
}

TIDE_API tide_status tide_alloc_headroom(int device, tide_alloc_forecast* forecast) {
  return tide::capi::guard([&] {
    require(forecast != nullptr, "tide_alloc_headroom: null output");
    const telemetry::HeadroomForecast f = device_allocator(device).headroom();
    tide::capi::write_versioned(
        forecast,
        tide_alloc_forecast{sizeof(tide_alloc_forecast), f.headroom, f.update_peak, f.limit,
                            f.margin, f.iterations, f.detected ? 1 : 0, f.held_headroom,
                            f.iteration_peak},
        "tide_alloc_forecast");
  });
}

TIDE_API tide_status tide_alloc_last_oom(int device, tide_alloc_oom* oom, int* found) {
  return tide::capi::guard([&] {
    require(oom != nullptr && found != nullptr, "tide_alloc_last_oom: null output");
    const auto ooms = device_allocator(device).ooms();
    tide::capi::check_struct_size<tide_alloc_oom>(oom->struct_size, "tide_alloc_oom");
    *found = ooms.empty() ? 0 : 1;
    tide_alloc_oom out{};
    if (!ooms.empty()) {
      const telemetry::OomRecord& r = ooms.back();
      out = tide_alloc_oom{sizeof(tide_alloc_oom),
                           r.t_ns,
                           r.requested,
                           r.rounded,
                           r.allocated,
                           r.reserved,
                           r.limit,
                           r.device_free,
                           r.device_total,
                           r.largest_free_block,
                           r.limit_reached ? 1u : 0u};
    }
    tide::capi::write_versioned(oom, out, "tide_alloc_oom");
  });
}

TIDE_API tide_status tide_alloc_export_timeline(int device, const char* path) {
  return tide::capi::guard([&] {
    require(path != nullptr, "tide_alloc_export_timeline: null path");
    device_allocator(device).export_chrome_trace(path);
  });
}

TIDE_API tide_status tide_alloc_trace_start(int device, size_t max_events) {
  return tide::capi::guard([&] {
    require(max_events > 0, "tide_alloc_trace_start: max_events must be > 0");
    device_allocator(device).start_trace(max_events);
  });
}

TIDE_API tide_status tide_alloc_trace_stop(int device, const char* path) {
  return tide::capi::guard([&] {
    const telemetry::Trace trace = device_allocator(device).stop_trace();
    if (path != nullptr) telemetry::save_trace(path, trace);
  });
}

}  // extern "C"

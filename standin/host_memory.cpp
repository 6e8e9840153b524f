#include "standin/host_memory.h"

#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
#include <string>

#include "standin/contexts.h"
#include "standin/device_faults.h"
#include "standin/faults.h"
#include "standin/pending_uses.h"
#include "standin/stats.h"

namespace tide::standin {
namespace {

struct Range {
  std::size_t size;
  bool allocated;  // by cuMemHostAlloc (else registered)
  int device;      // of the context it was registered or allocated in
  bool read_only = false;
};

struct Registry {
  std::mutex mutex;
  std::map<std::uintptr_t, Range> ranges;  // by base address, never overlapping
  std::uint64_t registered_bytes = 0;
  std::uint64_t allocated_bytes = 0;
};

Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

// The range holding `p`, or end().
std::map<std::uintptr_t, Range>::iterator holding(Registry& r, std::uintptr_t p) {
  auto it = r.ranges.upper_bound(p);
  if (it == r.ranges.begin()) return r.ranges.end();
  --it;
  return p - it->first < it->second.size ? it : r.ranges.end();
}

bool overlaps(Registry& r, std::uintptr_t base, std::size_t size) {
  if (holding(r, base) != r.ranges.end()) return true;
  const auto next = r.ranges.upper_bound(base);
  return next != r.ranges.end() && next->first - base < size;
}

}  // namespace

CUresult host_register(void* ptr, std::size_t bytes, unsigned flags) {
  constexpr unsigned kKnown = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                              CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
  if (ptr == nullptr || bytes == 0 || (flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  // I/O memory is a third-party device's physically contiguous MMIO space, never memory the
  // stand-in could have been given: CUDA refuses ordinary memory with this flag.
  if ((flags & CU_MEMHOSTREGISTER_IOMEMORY) != 0) return CUDA_ERROR_NOT_SUPPORTED;
  Context* context = nullptr;
  if (CUresult r = current_context(&context); r != CUDA_SUCCESS) return r;
  if (inject_pin_failure()) return CUDA_ERROR_OUT_OF_MEMORY;
  const auto base = reinterpret_cast<std::uintptr_t>(ptr);
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  if (overlaps(r, base, bytes)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  r.ranges.emplace(
      base, Range{bytes, false, context->device(), (flags & CU_MEMHOSTREGISTER_READ_ONLY) != 0});
  r.registered_bytes += bytes;
  count(Counter::kHostRegisters);
  return CUDA_SUCCESS;
}

CUresult host_unregister(void* ptr) {
  if (ptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* context = nullptr;
  if (CUresult r = current_context(&context); r != CUDA_SUCCESS) return r;
  // CUDA does not wait for copies still queued: they would read or write unpinned pages.
  const PendingUseGuard pending;
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  // As in CUDA, by the base address that was registered.
  const auto it = r.ranges.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == r.ranges.end() || it->second.allocated) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  if (std::string what; pending.overlaps(it->first, it->second.size, &what)) {
    device_fault("cuMemHostUnregister of " + std::to_string(it->second.size) + " bytes that " +
                 what + ", still pending, uses");
  }
  r.registered_bytes -= it->second.size;
  r.ranges.erase(it);
  count(Counter::kHostUnregisters);
  return CUDA_SUCCESS;
}

CUresult host_alloc(void** out, std::size_t bytes, unsigned flags) {
  constexpr unsigned kKnown =
      CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if (out == nullptr || bytes == 0 || (flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  Context* context = nullptr;
  if (CUresult r = current_context(&context); r != CUDA_SUCCESS) return r;
  if (inject_pin_failure()) return CUDA_ERROR_OUT_OF_MEMORY;
  // From malloc, at its exact size, so that AddressSanitizer sees overruns of pinned buffers.
  void* p = nullptr;
  if (posix_memalign(&p, 4096, bytes) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  r.ranges.emplace(reinterpret_cast<std::uintptr_t>(p), Range{bytes, true, context->device()});
  r.allocated_bytes += bytes;
  count(Counter::kHostAllocs);
  *out = p;
  return CUDA_SUCCESS;
}

CUresult free_host(void* ptr) {
  Context* context = nullptr;
  if (CUresult r = current_context(&context); r != CUDA_SUCCESS) return r;
  // Waits for the context's work first, as cuMemFree does: a queued copy may still use it.
  if (!is_page_locked(ptr, 1)) return CUDA_ERROR_INVALID_VALUE;
  context->synchronize();
  {
    Registry& r = registry();
    const std::lock_guard lock(r.mutex);
    const auto it = r.ranges.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == r.ranges.end() || !it->second.allocated) return CUDA_ERROR_INVALID_VALUE;
    r.allocated_bytes -= it->second.size;
    r.ranges.erase(it);
  }
  std::free(ptr);
  count(Counter::kHostFrees);
  return CUDA_SUCCESS;
}

bool find_page_locked(const void* ptr, PinnedRange* out) {
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  const auto it = holding(r, reinterpret_cast<std::uintptr_t>(ptr));
  if (it == r.ranges.end()) return false;
  *out = PinnedRange{it->first, it->second.size, it->second.read_only};
  return true;
}

bool is_page_locked(const void* ptr, std::size_t bytes) {
  PinnedRange range;
  if (!find_page_locked(ptr, &range)) return false;
  return bytes <= range.size - (reinterpret_cast<std::uintptr_t>(ptr) - range.base);
}

void unregister_host_memory_of(int device) {
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  std::erase_if(r.ranges, [&](const auto& entry) {
    if (entry.second.allocated || entry.second.device != device) return false;
    r.registered_bytes -= entry.second.size;
    return true;
  });
}

PinnedBytes pinned_bytes() {
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  return PinnedBytes{r.registered_bytes, r.allocated_bytes};
}

}  // namespace tide::standin

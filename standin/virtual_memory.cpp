#include "standin/virtual_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "standin/device_faults.h"
#include "standin/device_memory.h"
#include "standin/devices.h"
#include "standin/faults.h"
#include "standin/pending_uses.h"
#include "standin/stats.h"

namespace tide::standin {
namespace {

struct Physical {
  int fd;
  std::size_t size;
  int device;
  bool released = false;
  int mappings = 0;
};

struct Mapping {
  std::size_t size;
  CUmemGenericAllocationHandle handle;
  int prot = PROT_NONE;  // mappings start inaccessible, as in CUDA
};

struct State {
  std::mutex mutex;
  std::map<std::uintptr_t, std::size_t> reservations;  // base → size
  std::map<CUmemGenericAllocationHandle, Physical> physical;
  std::map<std::uintptr_t, Mapping> mappings;  // base → mapping
  CUmemGenericAllocationHandle next_handle = 1;
};

State& state() {
  static auto* s = new State;
  return *s;
}

bool aligned(std::uintptr_t value) { return value % kGranularity == 0; }

CUresult check_properties(const CUmemAllocationProp* prop) {
  if (prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (find_device(prop->location.id) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  // No shareable handles: the stand-in has no cuMemExportToShareableHandle.
  if (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE) return CUDA_ERROR_NOT_SUPPORTED;
  return CUDA_SUCCESS;
}

// Physical memory goes once it is released and no longer mapped.
void destroy_if_unused(State& s, CUmemGenericAllocationHandle handle) {
  const auto it = s.physical.find(handle);
  if (!it->second.released || it->second.mappings > 0) return;
  close(it->second.fd);
  refund(it->second.device, it->second.size);
  s.physical.erase(it);
}

// The mappings that exactly cover [ptr, ptr + size), one after the other; empty if they don't.
std::vector<std::map<std::uintptr_t, Mapping>::iterator> covering(State& s, std::uintptr_t ptr,
                                                                  std::size_t size) {
  std::vector<std::map<std::uintptr_t, Mapping>::iterator> found;
  std::uintptr_t at = ptr;
  const std::uintptr_t end = ptr + size;
  while (at < end) {
    const auto it = s.mappings.find(at);
    if (it == s.mappings.end()) return {};
    found.push_back(it);
    at += it->second.size;
  }
  if (at != end) return {};
  return found;
}

// The mapping holding `ptr`, or end().
std::map<std::uintptr_t, Mapping>::iterator holding(State& s, std::uintptr_t ptr) {
  auto it = s.mappings.upper_bound(ptr);
  if (it == s.mappings.begin()) return s.mappings.end();
  --it;
  return ptr - it->first < it->second.size ? it : s.mappings.end();
}

}  // namespace

CUresult mem_get_allocation_granularity(std::size_t* out, const CUmemAllocationProp* prop,
                                        CUmemAllocationGranularity_flags option) {
  if (out == nullptr || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                         option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult r = check_properties(prop); r != CUDA_SUCCESS) return r;
  *out = kGranularity;
  return CUDA_SUCCESS;
}

CUresult mem_address_reserve(CUdeviceptr* out, std::size_t size, std::size_t alignment,
                             CUdeviceptr hint, unsigned long long flags) {
  if (out == nullptr || size == 0 || !aligned(size) || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (alignment != 0 && ((alignment & (alignment - 1)) != 0 || alignment < kGranularity)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const std::size_t align = std::max(alignment, kGranularity);
  constexpr int kFlags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  void* base = MAP_FAILED;
  // The address asked for, if it is free and aligned (a hint, as in CUDA).
  if (hint != 0 && hint % align == 0) {
    base =
        mmap(reinterpret_cast<void*>(hint), size, PROT_NONE, kFlags | MAP_FIXED_NOREPLACE, -1, 0);
    if (base != MAP_FAILED && reinterpret_cast<std::uintptr_t>(base) != hint) {
      munmap(base, size);  // a kernel without MAP_FIXED_NOREPLACE placed it elsewhere
      base = MAP_FAILED;
    }
  }
  if (base == MAP_FAILED) {
    // Over-reserve, then trim to an aligned range.
    const std::size_t span = size + align;
    void* raw = mmap(nullptr, span, PROT_NONE, kFlags, -1, 0);
    if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    const auto start = reinterpret_cast<std::uintptr_t>(raw);
    const std::uintptr_t aligned_start = (start + align - 1) / align * align;
    if (aligned_start > start) munmap(raw, aligned_start - start);
    const std::uintptr_t end = aligned_start + size;
    if (start + span > end) munmap(reinterpret_cast<void*>(end), start + span - end);
    base = reinterpret_cast<void*>(aligned_start);
  }
  State& s = state();
  const std::lock_guard lock(s.mutex);
  s.reservations.emplace(reinterpret_cast<std::uintptr_t>(base), size);
  *out = reinterpret_cast<CUdeviceptr>(base);
  return CUDA_SUCCESS;
}

CUresult mem_address_free(CUdeviceptr ptr, std::size_t size) {
  State& s = state();
  const std::lock_guard lock(s.mutex);
  const auto it = s.reservations.find(ptr);
  if (it == s.reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  // Stricter than CUDA documents: a range still mapped is an error, not a leak.
  const auto mapped = s.mappings.lower_bound(ptr);
  if (mapped != s.mappings.end() && mapped->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  munmap(reinterpret_cast<void*>(ptr), size);
  s.reservations.erase(it);
  return CUDA_SUCCESS;
}

CUresult mem_create(CUmemGenericAllocationHandle* out, std::size_t size,
                    const CUmemAllocationProp* prop, unsigned long long flags) {
  if (out == nullptr || size == 0 || !aligned(size) || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_properties(prop); r != CUDA_SUCCESS) return r;
  const int device = prop->location.id;
  if (inject_alloc_failure()) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!charge(device, size)) return CUDA_ERROR_OUT_OF_MEMORY;
  const int fd = memfd_create("tide-standin-device-memory", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
    if (fd >= 0) close(fd);
    refund(device, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  State& s = state();
  const std::lock_guard lock(s.mutex);
  const CUmemGenericAllocationHandle handle = s.next_handle++;
  s.physical.emplace(handle, Physical{fd, size, device});
  count(Counter::kMemCreates);
  *out = handle;
  return CUDA_SUCCESS;
}

CUresult mem_release(CUmemGenericAllocationHandle handle) {
  State& s = state();
  const std::lock_guard lock(s.mutex);
  const auto it = s.physical.find(handle);
  if (it == s.physical.end() || it->second.released) return CUDA_ERROR_INVALID_VALUE;
  it->second.released = true;
  count(Counter::kMemReleases);
  destroy_if_unused(s, handle);
  return CUDA_SUCCESS;
}

CUresult mem_map(CUdeviceptr ptr, std::size_t size, std::size_t offset,
                 CUmemGenericAllocationHandle handle, unsigned long long flags) {
  if (flags != 0 || offset != 0 || size == 0 || !aligned(ptr) || !aligned(size)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  State& s = state();
  const std::lock_guard lock(s.mutex);
  const auto phys = s.physical.find(handle);
  if (phys == s.physical.end() || phys->second.released) return CUDA_ERROR_INVALID_HANDLE;
  if (size > phys->second.size) return CUDA_ERROR_INVALID_VALUE;
  // Inside one reservation...
  auto reservation = s.reservations.upper_bound(ptr);
  if (reservation == s.reservations.begin()) return CUDA_ERROR_INVALID_VALUE;
  --reservation;
  if (ptr - reservation->first >= reservation->second ||
      size > reservation->second - (ptr - reservation->first)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // ... and over nothing mapped.
  if (holding(s, ptr) != s.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
  const auto next = s.mappings.upper_bound(ptr);
  if (next != s.mappings.end() && next->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  void* p = mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED,
                 phys->second.fd, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  s.mappings.emplace(ptr, Mapping{size, handle});
  ++phys->second.mappings;
  return CUDA_SUCCESS;
}

CUresult mem_unmap(CUdeviceptr ptr, std::size_t size) {
  if (size == 0 || !aligned(ptr) || !aligned(size)) return CUDA_ERROR_INVALID_VALUE;
  // CUDA does not wait for work still queued (cuMemFree does): work that uses the range would
  // reach an unmapped address, a device fault here at once. Other work runs on.
  const PendingUseGuard pending;
  State& s = state();
  const std::lock_guard lock(s.mutex);
  const auto found = covering(s, ptr, size);
  if (found.empty()) return CUDA_ERROR_INVALID_VALUE;
  if (std::string what; pending.overlaps(ptr, size, &what)) {
    device_fault("cuMemUnmap of " + std::to_string(size) + " bytes that " + what +
                 ", still pending, uses");
  }
  // Back to a bare reservation.
  if (mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED) {
    return CUDA_ERROR_OUT_OF_MEMORY;  // the mappings stay as they were
  }
  for (const auto& it : found) {
    const CUmemGenericAllocationHandle handle = it->second.handle;
    s.mappings.erase(it);
    --s.physical.at(handle).mappings;
    destroy_if_unused(s, handle);
  }
  return CUDA_SUCCESS;
}

CUresult mem_set_access(CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc* desc,
                        std::size_t count) {
  if (desc == nullptr || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  int prot = PROT_NONE;
  for (std::size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (find_device(desc[i].location.id) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    // Every device sees the same host pages: the union of the access asked for.
    switch (desc[i].flags) {
      case CU_MEM_ACCESS_FLAGS_PROT_NONE:
        break;
      case CU_MEM_ACCESS_FLAGS_PROT_READ:
        prot |= PROT_READ;
        break;
      case CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
        prot |= PROT_READ | PROT_WRITE;
        break;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  }
  State& s = state();
  const std::lock_guard lock(s.mutex);
  const auto found = covering(s, ptr, size);
  if (found.empty()) return CUDA_ERROR_INVALID_VALUE;
  if (mprotect(reinterpret_cast<void*>(ptr), size, prot) != 0) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& it : found) it->second.prot = prot;
  return CUDA_SUCCESS;
}

bool vmm_accessible(std::uintptr_t ptr, std::size_t bytes, bool write) {
  const int need = write ? PROT_READ | PROT_WRITE : PROT_READ;
  State& s = state();
  const std::lock_guard lock(s.mutex);
  auto it = holding(s, ptr);
  const std::uintptr_t end = ptr + bytes;
  // Across adjacent mappings, as one contiguous device range.
  while (it != s.mappings.end() && (it->second.prot & need) == need) {
    const std::uintptr_t mapping_end = it->first + it->second.size;
    if (end <= mapping_end) return true;
    it = s.mappings.find(mapping_end);
  }
  return false;
}

bool overlaps_reservation(std::uintptr_t ptr, std::size_t bytes) {
  State& s = state();
  const std::lock_guard lock(s.mutex);
  auto it = s.reservations.lower_bound(ptr + bytes);  // the first reservation at or past the end
  if (it == s.reservations.begin()) return false;
  --it;  // the last one starting before the end
  return it->first + it->second > ptr;
}

bool find_mapping(std::uintptr_t ptr, MappedRange* out) {
  State& s = state();
  const std::lock_guard lock(s.mutex);
  const auto it = holding(s, ptr);
  if (it == s.mappings.end()) return false;
  *out = MappedRange{it->first, it->second.size, s.physical.at(it->second.handle).device};
  return true;
}

}  // namespace tide::standin

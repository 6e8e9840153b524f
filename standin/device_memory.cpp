#include "standin/device_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <vector>

#include "standin/contexts.h"
#include "standin/devices.h"
#include "standin/faults.h"
#include "standin/stats.h"

namespace tide::standin {
namespace {

// All devices together: used and peak bytes for the statistics.
MemoryAccount& total() {
  static auto* account = new MemoryAccount(~std::uint64_t{0});
  return *account;
}

struct Registry {
  std::mutex mutex;
  std::map<std::uintptr_t, Allocation> allocations;  // by base address
};

Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

// CUDA promises 256-byte alignment, and no more: an allocation starts 256 bytes into its pages,
// so that code assuming more (512 bytes, a page) fails here too.
constexpr std::size_t kAlignment = 256;

std::size_t mapped_size(std::size_t bytes) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + kAlignment + page - 1) / page * page;
}

void unmap(const Allocation& a) {
  munmap(reinterpret_cast<void*>(a.base - kAlignment), mapped_size(a.size));
  refund(a.device, a.size);
}

// Allocates on `device`: the fault injection, the capacity, then the mapping.
CUresult allocate(Device& device, CUdeviceptr* out, std::size_t bytes, bool low) {
  if (inject_alloc_failure()) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!charge(device.ordinal, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  // Reserved, not touched: the pages cost nothing until a copy or kernel writes them.
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  if (low) flags |= MAP_32BIT;
  void* p = mmap(nullptr, mapped_size(bytes), PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED || (low && reinterpret_cast<std::uintptr_t>(p) > 0xffffffffu)) {
    if (p != MAP_FAILED) munmap(p, mapped_size(bytes));
    refund(device.ordinal, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const auto base = reinterpret_cast<std::uintptr_t>(p) + kAlignment;
  {
    Registry& r = registry();
    const std::lock_guard lock(r.mutex);
    r.allocations.emplace(base, Allocation{base, bytes, device.ordinal});
  }
  count(Counter::kDeviceAllocs);
  *out = base;
  return CUDA_SUCCESS;
}

// Takes the allocation starting at `ptr` out of the registry.
bool take(CUdeviceptr ptr, Allocation* out) {
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  const auto it = r.allocations.find(static_cast<std::uintptr_t>(ptr));
  if (it == r.allocations.end()) return false;
  *out = it->second;
  r.allocations.erase(it);
  return true;
}

}  // namespace

bool MemoryAccount::charge(std::uint64_t bytes) {
  const std::lock_guard lock(mutex_);
  if (bytes > capacity_ || used_ > capacity_ - bytes) return false;
  used_ += bytes;
  peak_ = std::max(peak_, used_);
  return true;
}

void MemoryAccount::refund(std::uint64_t bytes) {
  const std::lock_guard lock(mutex_);
  used_ -= std::min(used_, bytes);
}

std::uint64_t MemoryAccount::used() const {
  const std::lock_guard lock(mutex_);
  return used_;
}

std::uint64_t MemoryAccount::peak() const {
  const std::lock_guard lock(mutex_);
  return peak_;
}

std::uint64_t MemoryAccount::capacity() const {
  const std::lock_guard lock(mutex_);
  return capacity_;
}

void MemoryAccount::set_capacity(std::uint64_t bytes) {
  const std::lock_guard lock(mutex_);
  capacity_ = bytes;
}

void MemoryAccount::reset_peak() {
  const std::lock_guard lock(mutex_);
  peak_ = used_;
}

bool charge(int device, std::uint64_t bytes) {
  if (!find_device(device)->memory.charge(bytes)) return false;
  total().charge(bytes);
  return true;
}

void refund(int device, std::uint64_t bytes) {
  find_device(device)->memory.refund(bytes);
  total().refund(bytes);
}

DeviceBytes device_bytes() { return DeviceBytes{total().used(), total().peak()}; }

void reset_device_peak() {
  total().reset_peak();
  for (int i = 0; i < device_count(); ++i) find_device(i)->memory.reset_peak();
}

CUresult mem_alloc(CUdeviceptr* out, std::size_t bytes, bool low) {
  if (out == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  Context* context = nullptr;
  if (CUresult r = current_context(&context); r != CUDA_SUCCESS) return r;
  return allocate(*find_device(context->device()), out, bytes, low);
}

CUresult mem_free(CUdeviceptr ptr) {
  Context* context = nullptr;
  if (CUresult r = current_context(&context); r != CUDA_SUCCESS) return r;
  if (ptr == 0) return CUDA_SUCCESS;  // as CUDA: freeing nothing is no error
  Allocation a;
  if (!find_allocation(ptr, &a) || a.base != ptr) return CUDA_ERROR_INVALID_VALUE;
  // cuMemFree waits for the device's work, as in CUDA: nothing queued may still use the buffer
  // when its pages go.
  Device* device = find_device(a.device);
  if (device->context.active()) device->context.synchronize();
  if (!take(ptr, &a)) return CUDA_ERROR_INVALID_VALUE;  // freed meanwhile by another thread
  unmap(a);
  count(Counter::kDeviceFrees);
  return CUDA_SUCCESS;
}

CUresult mem_alloc_async(CUdeviceptr* out, std::size_t bytes, CUstream handle,
                         DefaultStream fallback) {
  if (out == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Stream> stream;
  if (CUresult r = resolve_stream(handle, fallback, &stream); r != CUDA_SUCCESS) return r;
  // Memory available at once is available in stream order too.
  return allocate(*find_device(stream->context().device()), out, bytes, false);
}

CUresult mem_free_async(CUdeviceptr ptr, CUstream handle, DefaultStream fallback) {
  std::shared_ptr<Stream> stream;
  if (CUresult r = resolve_stream(handle, fallback, &stream); r != CUDA_SUCCESS) return r;
  Allocation a;
  if (!take(ptr, &a)) return CUDA_ERROR_INVALID_VALUE;
  // The pages go when the stream reaches the free: work queued before it may still use them.
  stream->submit([a] { unmap(a); });
  count(Counter::kDeviceFrees);
  return CUDA_SUCCESS;
}

CUresult mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* context = nullptr;
  if (CUresult r = current_context(&context); r != CUDA_SUCCESS) return r;
  const MemoryAccount& account = find_device(context->device())->memory;
  const std::uint64_t capacity = account.capacity();
  const std::uint64_t used = account.used();
  *free_bytes = used < capacity ? capacity - used : 0;
  *total_bytes = capacity;
  return CUDA_SUCCESS;
}

bool find_allocation(std::uintptr_t ptr, Allocation* out) {
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  auto it = r.allocations.upper_bound(ptr);
  if (it == r.allocations.begin()) return false;
  --it;
  if (ptr - it->second.base >= it->second.size) return false;
  *out = it->second;
  return true;
}

bool in_allocation(std::uintptr_t ptr, std::size_t bytes) {
  Allocation a;
  return find_allocation(ptr, &a) && bytes <= a.size - (ptr - a.base);
}

void free_allocations_of(int device) {
  std::vector<Allocation> doomed;
  {
    Registry& r = registry();
    const std::lock_guard lock(r.mutex);
    std::erase_if(r.allocations, [&](const auto& entry) {
      if (entry.second.device != device) return false;
      doomed.push_back(entry.second);
      return true;
    });
  }
  for (const Allocation& a : doomed) unmap(a);
}

}  // namespace tide::standin

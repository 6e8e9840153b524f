#include "standin/pointers.h"

#include <cstddef>
#include <cstdint>

#include "standin/device_memory.h"
#include "standin/devices.h"
#include "standin/host_memory.h"
#include "standin/virtual_memory.h"

namespace tide::standin {
namespace {

struct Where {
  CUmemorytype type;
  std::uintptr_t base;
  std::size_t size;
  int device;  // -1 for host memory
};

bool locate(std::uintptr_t ptr, Where* out) {
  if (Allocation a; find_allocation(ptr, &a)) {
    *out = Where{CU_MEMORYTYPE_DEVICE, a.base, a.size, a.device};
    return true;
  }
  if (MappedRange m; find_mapping(ptr, &m)) {
    *out = Where{CU_MEMORYTYPE_DEVICE, m.base, m.size, m.device};
    return true;
  }
  if (PinnedRange p; find_page_locked(reinterpret_cast<const void*>(ptr), &p)) {
    *out = Where{CU_MEMORYTYPE_HOST, p.base, p.size, -1};
    return true;
  }
  return false;
}

}  // namespace

CUresult pointer_get_attribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Where where{};
  if (!locate(ptr, &where)) return CUDA_ERROR_INVALID_VALUE;
  const bool device = where.type == CU_MEMORYTYPE_DEVICE;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      if (!device) return CUDA_ERROR_INVALID_VALUE;  // portable host memory has no one context
      *static_cast<CUcontext*>(data) = find_device(where.device)->context.handle();
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) = where.type;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      *static_cast<CUdeviceptr*>(data) = ptr;  // unified addressing: the same address
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      if (device) return CUDA_ERROR_INVALID_VALUE;
      *static_cast<void**>(data) = reinterpret_cast<void*>(ptr);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      if (!device) return CUDA_ERROR_INVALID_VALUE;
      *static_cast<int*>(data) = where.device;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = where.base;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<std::size_t*>(data) = where.size;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

}  // namespace tide::standin

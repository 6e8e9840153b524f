#include "allocator/memory_resource.h"

#include <cstdint>

#include "driver/cuda_api.h"
#include "driver/error.h"

namespace tide::allocator {

void* DriverResource::allocate(std::size_t bytes, CUstream /*stream*/) {
  CUdeviceptr ptr = 0;
  const CUresult r = driver::cuda().cuMemAlloc(&ptr, bytes);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) return nullptr;
  driver::check(r, "cuMemAlloc");
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(ptr));
}

void DriverResource::deallocate(void* ptr, std::size_t /*bytes*/, CUstream /*stream*/) {
  // cuMemFree waits for the device's pending work: stream order holds without events.
  TIDE_CU(cuMemFree, static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(ptr)));
}

}  // namespace tide::allocator

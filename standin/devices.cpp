#include "standin/devices.h"

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "standin/init.h"

namespace tide::standin {
namespace {

// Written once by cuInit before initialized() turns true, read-only afterwards.
std::vector<std::unique_ptr<Device>>& devices() {
  static auto* all = new std::vector<std::unique_ptr<Device>>;
  return *all;
}

// What a CUDA 13 driver reports for an H100 (SXM), give or take: enough for code that sizes
// launches or checks features. The copy-engine count matches the stand-in's one link per
// direction; memory pools are off because the stand-in has no cuMemPool* calls.
struct Attribute {
  CUdevice_attribute attribute;
  int value;
};
constexpr Attribute kAttributes[] = {
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 2147483647},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65535},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 49152},
    {CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 65536},
    {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
    {CU_DEVICE_ATTRIBUTE_MAX_PITCH, 2147483647},
    {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 65536},
    {CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 1980000},
    {CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 512},
    {CU_DEVICE_ATTRIBUTE_GPU_OVERLAP, 1},
    {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132},
    {CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT, 0},
    {CU_DEVICE_ATTRIBUTE_INTEGRATED, 0},
    {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, CU_COMPUTEMODE_DEFAULT},
    {CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT, 512},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1},
    {CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 1},
    {CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, 0},
    {CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, 0},
    {CU_DEVICE_ATTRIBUTE_TCC_DRIVER, 0},
    {CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, 2619000},
    {CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 5120},
    {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 52428800},
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048},
    {CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 2},
    {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
    {CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, 233472},
    {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, 65536},
    {CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 0},
    {CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD, 0},
    {CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, 0},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 0},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, 1},
    {CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 1},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 232448},
    {CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 32},
    {CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, 1},
};

}  // namespace

void create_devices(int count, std::uint64_t capacity) {
  for (int i = 0; i < count; ++i) devices().push_back(std::make_unique<Device>(i, capacity));
}

int device_count() { return initialized() ? static_cast<int>(devices().size()) : 0; }

Device* find_device(int ordinal) {
  if (ordinal < 0 || ordinal >= device_count()) return nullptr;
  return devices()[static_cast<std::size_t>(ordinal)].get();
}

Device* find_context(CUcontext handle) {
  for (int i = 0; i < device_count(); ++i) {
    Device* device = find_device(i);
    if (device->context.handle() == handle) return device;
  }
  return nullptr;
}

CUresult device_get(CUdevice* out, int ordinal) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (find_device(ordinal) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  *out = ordinal;
  return CUDA_SUCCESS;
}

CUresult device_get_count(int* out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *out = device_count();
  return CUDA_SUCCESS;
}

CUresult device_get_name(char* name, int length, CUdevice device) {
  if (name == nullptr || length <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (find_device(device) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  const std::string text = "tide stand-in device " + std::to_string(device);
  const std::size_t n = std::min(text.size(), static_cast<std::size_t>(length) - 1);
  std::memcpy(name, text.data(), n);
  name[n] = '\0';
  return CUDA_SUCCESS;
}

// Device d sits on PCI bus d + 1 of domain 0 ("0000:01:00.0" for device 0): a fixed, valid bus
// id that tests can give a sysfs folder of their own (tide reads the GPU's NUMA node there).
// Stricter than CUDA where it differs: a buffer too short for the whole id (13 bytes with the
// terminator) is CUDA_ERROR_INVALID_VALUE instead of a truncated id.
CUresult device_get_pci_bus_id(char* bus_id, int length, CUdevice device) {
  if (bus_id == nullptr || length <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (find_device(device) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  char text[32];
  const int n = std::snprintf(text, sizeof text, "0000:%02x:00.0", (device + 1) & 0xff);
  if (n < 0 || n >= length) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(bus_id, text, static_cast<std::size_t>(n) + 1);
  return CUDA_SUCCESS;
}

CUresult device_total_mem(std::size_t* bytes, CUdevice device) {
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Device* d = find_device(device);
  if (d == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = d->memory.capacity();
  return CUDA_SUCCESS;
}

CUresult device_get_attribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (find_device(device) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  if (attribute == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) {
    *value = device + 1;  // distinct per device, as bus ids are
    return CUDA_SUCCESS;
  }
  for (const Attribute& a : kAttributes) {
    if (a.attribute == attribute) {
      *value = a.value;
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_VALUE;
}

}  // namespace tide::standin

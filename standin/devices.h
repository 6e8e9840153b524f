// Devices: TIDE_STANDIN_DEVICES of them, each with its memory, its copy links and its primary
// context; and the cuDevice* calls.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "standin/bandwidth.h"
#include "standin/contexts.h"
#include "standin/device_memory.h"

namespace tide::standin {

struct Device {
  Device(int ordinal_, std::uint64_t capacity)
      : ordinal(ordinal_), memory(capacity), context(ordinal_) {}

  const int ordinal;
  MemoryAccount memory;
  Link h2d;
  Link d2h;
  Context context;  // the primary context
};

// Called once, by cuInit.
void create_devices(int count, std::uint64_t capacity);
// 0 before cuInit.
int device_count();
// Null before cuInit or for an ordinal out of range.
Device* find_device(int ordinal);
// The device whose primary context `handle` is, or null.
Device* find_context(CUcontext handle);

CUresult device_get(CUdevice* out, int ordinal);
CUresult device_get_count(int* out);
CUresult device_get_name(char* name, int length, CUdevice device);
CUresult device_get_pci_bus_id(char* bus_id, int length, CUdevice device);
CUresult device_total_mem(std::size_t* bytes, CUdevice device);
CUresult device_get_attribute(int* value, CUdevice_attribute attribute, CUdevice device);

}  // namespace tide::standin

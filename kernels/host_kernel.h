// tide's CUDA kernels compiled for the host, by name.
//
// Every kernel in kernels/cuda/ is an extern "C" __global__ function taking one parameter struct
// by value. Its .cu file is compiled a second time as host C++ through
// kernels/host/cuda_emulation.h (kernels/adam_host.cpp, kernels/cast_host.cpp), and
// kernels/host/grid.h runs that compiled source over a launch's grid, every block and every thread.
// The host stand-in driver does so when tide launches a kernel on it: the kernel that runs in the
// tests is the kernel's own code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace tide::kernels {

struct HostGrid {
  unsigned grid[3];
  unsigned block[3];
  unsigned shared_bytes;
};

// One thread of a kernel: the kernel's body, called with a pointer to its parameter struct.
using KernelThread = void (*)(const void* params);

// Device memory a launch may read (and write): the stand-in checks that the device can address
// it, and that nothing unmaps it while the launch is pending.
struct KernelRange {
  std::uint64_t address;
  std::uint64_t bytes;
  bool write;
};
using KernelRanges = std::vector<KernelRange> (*)(const HostGrid& grid, const void* params);

struct HostKernelEntry {
  std::string_view name;  // the kernel's extern "C" name
  KernelThread thread;
  std::size_t param_bytes;  // sizeof the parameter struct: a launch copies it, as CUDA does
  KernelRanges ranges;
};

// The kernel named `name`, compiled for the host, or nullptr.
const HostKernelEntry* find_host_kernel(std::string_view name);

}  // namespace tide::kernels

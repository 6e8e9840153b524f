// Host twins of the CUDA kernels.
//
// Every kernel in kernels/cuda/ is an extern "C" __global__ function taking one parameter struct
// by value. Its host twin computes the same thing over the whole launch grid on the CPU, from the
// same `void** params` array that cuLaunchKernel receives. The host stand-in driver runs these
// twins when tide launches a kernel on it, so the launch path tide uses on a GPU is the path its
// tests exercise.
#pragma once

#include <cstddef>
#include <string_view>

namespace tide::kernels {

struct HostGrid {
  unsigned grid[3];
  unsigned block[3];
  unsigned shared_bytes;
};

// Runs the whole grid. `params` is cuLaunchKernel's kernelParams: params[0] points to the
// kernel's parameter struct.
using HostKernel = void (*)(const HostGrid& grid, void** params);

struct HostKernelEntry {
  std::string_view name;  // the kernel's extern "C" name
  HostKernel run;
  std::size_t param_bytes;  // sizeof the parameter struct: a launch copies it, as CUDA does
};

// The host twin of the kernel named `name`, or nullptr.
const HostKernelEntry* find_host_kernel(std::string_view name);

}  // namespace tide::kernels

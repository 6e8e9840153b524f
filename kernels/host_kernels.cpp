// The kernels compiled for the host, by name.
#include "kernels/host_kernel.h"

namespace tide::kernels {

extern const HostKernelEntry kAdamHostKernel;    // adam_host.cpp
extern const HostKernelEntry kAdamQ8HostKernel;  // adam_host.cpp
extern const HostKernelEntry kCastHostKernel;    // cast_host.cpp

const HostKernelEntry* find_host_kernel(std::string_view name) {
  for (const HostKernelEntry* entry : {&kAdamHostKernel, &kAdamQ8HostKernel, &kCastHostKernel}) {
    if (entry->name == name) return entry;
  }
  return nullptr;
}

}  // namespace tide::kernels

// The registry of host twins, by kernel name.
#include "kernels/adam_kernel.h"
#include "kernels/cast.h"
#include "kernels/host_kernel.h"

namespace tide::kernels {

void cast_host(const HostGrid& grid, void** params);
void adam_host(const HostGrid& grid, void** params);

const HostKernelEntry* find_host_kernel(std::string_view name) {
  static constexpr HostKernelEntry kEntries[] = {
      {kCastKernel, &cast_host, sizeof(CastParams)},
      {kAdamKernel, &adam_host, sizeof(AdamKernelParams)},
  };
  for (const HostKernelEntry& entry : kEntries) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

}  // namespace tide::kernels

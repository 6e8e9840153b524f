// `tide info`: the CUDA driver tide loads, its devices and their memory.
#include <cstdio>

#include "driver/context.h"
#include "driver/cuda_api.h"
#include "tools/command.h"

namespace tide::tools {

int info_command(int /*argc*/, char** /*argv*/) {
  const auto& api = driver::cuda();
  std::printf("driver   %s (CUDA %d.%d)\n", api.library.c_str(), api.version / 1000,
              (api.version % 1000) / 10);
  const int count = driver::device_count();
  std::printf("devices  %d\n", count);
  for (int device = 0; device < count; ++device) {
    const driver::CurrentContext context(device);
    const auto memory = driver::memory_info();
    std::printf("  %d: %s, %.2f GiB total, %.2f GiB free, virtual memory %s\n", device,
                driver::device_name(device).c_str(),
                static_cast<double>(memory.total_bytes) / (1 << 30),
                static_cast<double>(memory.free_bytes) / (1 << 30), api.has_vmm() ? "yes" : "no");
  }
  return 0;
}

}  // namespace tide::tools

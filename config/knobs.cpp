#include "config/knobs.h"

namespace tide::config {

std::span<const Knob> knobs() {
  static constexpr Knob kKnobs[] = {
      {"TIDE_CUDA_DRIVER", "a path to a shared library",
       "CUDA driver library to load instead of libcuda.so.1 (e.g. the host stand-in driver "
       "build/lib/libtide_standin_cuda.so)"},
      {"TIDE_LIBRARY", "a path to libtide.so",
       "Python: the libtide.so to load instead of the package's own or the build tree's"},
      {"TIDE_STANDIN_MEMORY", "a size (e.g. 8GiB)",
       "stand-in driver: device memory capacity (default 8GiB)"},
      {"TIDE_STANDIN_DEVICES", "an integer from 1 to 16",
       "stand-in driver: number of devices (default 1)"},
      {"TIDE_STANDIN_H2D_GBPS", "a number of GB/s, > 0",
       "stand-in driver: simulated host-to-device copy bandwidth (default: memcpy speed)"},
      {"TIDE_STANDIN_D2H_GBPS", "a number of GB/s, > 0",
       "stand-in driver: simulated device-to-host copy bandwidth (default: memcpy speed)"},
      {"TIDE_STANDIN_FAIL_ALLOC", "an integer >= 1",
       "stand-in driver: the Nth device allocation fails with CUDA_ERROR_OUT_OF_MEMORY"},
      {"TIDE_STANDIN_FAIL_COPY", "an integer >= 1",
       "stand-in driver: the Nth copy fails with CUDA_ERROR_LAUNCH_FAILED"},
      {"TIDE_STANDIN_DEVICE_LOST", "an integer >= 1",
       "stand-in driver: from the Nth driver call on, every call fails with "
       "CUDA_ERROR_DEVICE_UNAVAILABLE (device lost)"},
  };
  return kKnobs;
}

}  // namespace tide::config

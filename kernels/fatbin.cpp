#include "kernels/fatbin.h"

extern "C" const unsigned char tide_kernels_fatbin_begin[];
extern "C" const unsigned char tide_kernels_fatbin_end[];

namespace tide::kernels {

const void* fatbin_image() { return tide_kernels_fatbin_begin; }

std::size_t fatbin_size() {
  return static_cast<std::size_t>(tide_kernels_fatbin_end - tide_kernels_fatbin_begin);
}

}  // namespace tide::kernels

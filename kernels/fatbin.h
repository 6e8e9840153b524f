// The kernels of kernels/cuda/, compiled by nvcc for every architecture in TIDE_CUDA_ARCHS (plus
// PTX of the newest, for later GPUs) and embedded in libtide.so. driver::Module loads it.
#pragma once

#include <cstddef>

namespace tide::kernels {

const void* fatbin_image();
std::size_t fatbin_size();

}  // namespace tide::kernels

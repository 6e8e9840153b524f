// Copies and memset.
//
// Every copy runs on a stream's worker: a synchronous one on the default stream (so it is
// ordered with the legacy default stream's rules, as in CUDA) and waited for; an asynchronous
// one on its stream, waited for only when its host side is pageable (not registered or
// cuMemHostAlloc'd), because CUDA then copies before returning too. Device ranges are checked
// when the copy is submitted (a cuMemAlloc'd buffer or accessible mapped memory), as CUDA does.
#pragma once

#include <cuda.h>

#include <cstddef>

#include "standin/streams.h"

namespace tide::standin {

CUresult copy_to_device(CUdeviceptr dst, const void* src, std::size_t bytes,
                        DefaultStream fallback);
CUresult copy_to_host(void* dst, CUdeviceptr src, std::size_t bytes, DefaultStream fallback);
CUresult copy_to_device_async(CUdeviceptr dst, const void* src, std::size_t bytes, CUstream stream,
                              DefaultStream fallback);
CUresult copy_to_host_async(void* dst, CUdeviceptr src, std::size_t bytes, CUstream stream,
                            DefaultStream fallback);
CUresult copy_on_device_async(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, CUstream stream,
                              DefaultStream fallback);
CUresult memset_d8_async(CUdeviceptr dst, unsigned char value, std::size_t bytes, CUstream stream,
                         DefaultStream fallback);

// Whether [ptr, ptr + bytes) is device memory a copy may read (or write, if `write`).
bool is_device_range(std::uintptr_t ptr, std::size_t bytes, bool write);

}  // namespace tide::standin

// cuPointerGetAttribute, for the attributes that describe where memory is.
#pragma once

#include <cuda.h>

namespace tide::standin {

// Supports CONTEXT, MEMORY_TYPE, DEVICE_POINTER, HOST_POINTER, DEVICE_ORDINAL,
// RANGE_START_ADDR and RANGE_SIZE (others: CUDA_ERROR_NOT_SUPPORTED). A pointer the stand-in did
// not give out or page-lock: CUDA_ERROR_INVALID_VALUE.
CUresult pointer_get_attribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr);

}  // namespace tide::standin

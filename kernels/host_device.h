// Lets one function body serve host code (g++) and device code (nvcc).
#pragma once

#if defined(__CUDACC__)
#define TIDE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TIDE_HOST_DEVICE inline
#endif

// Fault injection (TIDE_STANDIN_FAIL_ALLOC, _FAIL_COPY, _DEVICE_LOST and the control API, which
// also arms host pinning and kernel launch failures), and the check every exported entry point
// starts with.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace tide::standin {

// The start of every exported call but cuGetErrorName/String and cuGetProcAddress: counts the
// call, then fails it with CUDA_ERROR_NOT_PERMITTED from a host function (cuLaunchHostFunc), with
// CUDA_ERROR_DEVICE_UNAVAILABLE once the device is lost, or with CUDA_ERROR_NOT_INITIALIZED before
// a successful cuInit.
CUresult enter();
// The same for calls that work without cuInit (cuInit itself, cuDriverGetVersion).
CUresult enter_uninitialized();

// Count one device allocation / one copy, with valid arguments, about to be made; true when it
// is the one armed to fail (the caller then fails it).
bool inject_alloc_failure();
bool inject_copy_failure();
// The same for one host pinning (cuMemHostRegister or cuMemHostAlloc).
bool inject_pin_failure();
// The same for one kernel launch (cuLaunchKernel).
bool inject_launch_failure();

// Arm: the nth event counted from now fails (0 disarms).
void arm_alloc_failure(std::uint64_t n);
void arm_copy_failure(std::uint64_t n);
void arm_device_lost(std::uint64_t n);
void arm_pin_failure(std::uint64_t n);
void arm_launch_failure(std::uint64_t n);
// Arm from TIDE_STANDIN_*, at cuInit: the nth event of the process (0: off).
void arm_from_environment(std::uint64_t fail_alloc, std::uint64_t fail_copy,
                          std::uint64_t device_lost);
// Whether the calls counted so far have reached the armed device loss (counts nothing).
bool device_lost();

}  // namespace tide::standin

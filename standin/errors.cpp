#include "standin/errors.h"

namespace tide::standin {
namespace {

struct Error {
  CUresult code;
  const char* name;
  const char* text;
};

#define TIDE_STANDIN_ERROR(code, text) \
  { code, #code, text }
// Every code the stand-in returns, and the common ones a caller may ask about.
constexpr Error kErrors[] = {
    TIDE_STANDIN_ERROR(CUDA_SUCCESS, "no error"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_DEVICE_UNAVAILABLE,
                       "CUDA-capable device(s) is/are busy or unavailable"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context already current"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_UNMAP_FAILED, "unmapping of buffer object failed"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_ALREADY_MAPPED, "resource already mapped"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_NO_BINARY_FOR_GPU,
                       "no kernel image is available for execution on the device"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_NOT_MAPPED, "resource not mapped"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_ECC_UNCORRECTABLE, "uncorrectable ECC error encountered"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_INVALID_PTX, "a PTX JIT compilation failed"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_INVALID_SOURCE, "device kernel image is invalid"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_FILE_NOT_FOUND, "file not found"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_OPERATING_SYSTEM,
                       "OS call failed or operation not supported on this OS"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_ILLEGAL_STATE,
                       "the operation cannot be performed in the present state"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_NOT_READY, "device not ready"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
                       "too many resources requested for launch"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_LAUNCH_TIMEOUT, "the launch timed out and was terminated"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE,
                       "cannot set while device is active in this process"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_ASSERT, "device-side assert triggered"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
                       "part or all of the requested memory range is already mapped"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
                       "pointer does not correspond to a registered memory region"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_ILLEGAL_INSTRUCTION, "an illegal instruction was encountered"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_MISALIGNED_ADDRESS, "misaligned address"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_SYSTEM_NOT_READY, "system not yet initialized"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
                       "system has unsupported display driver / cuda driver combination"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                       "operation not permitted when stream is capturing"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_TIMEOUT, "wait operation timed out"),
    TIDE_STANDIN_ERROR(CUDA_ERROR_UNKNOWN, "unknown error"),
};
#undef TIDE_STANDIN_ERROR

const Error* find(CUresult code) {
  for (const Error& e : kErrors) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

}  // namespace

CUresult error_name(CUresult error, const char** out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const Error* e = find(error);
  *out = e != nullptr ? e->name : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult error_string(CUresult error, const char** out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const Error* e = find(error);
  *out = e != nullptr ? e->text : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

}  // namespace tide::standin

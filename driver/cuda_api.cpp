#include "driver/cuda_api.h"

#include <dlfcn.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "config/env.h"
#include "driver/error.h"

namespace tide::driver {
namespace {

constexpr const char* kDefaultLibrary = "libcuda.so.1";
// The ABI tide is written against: every function in TIDE_CUDA_FUNCTIONS has had the signature
// cuda.h gives it since CUDA 12.0.
constexpr int kAbiVersion = 12000;

using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult*);

// Where tide's host stand-in driver is: next to the library (or program) this code is in, or in
// ../lib from it (build/lib and tide/lib hold it beside libtide.so; the tide program is in bin/).
std::string standin_location() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&standin_location), &info) != 0 && info.dli_fname != nullptr) {
    std::error_code ignored;
    const auto here = std::filesystem::absolute(info.dli_fname, ignored).parent_path();
    for (const auto& dir : {here, here.parent_path() / "lib"}) {
      const auto path = dir / "libtide_standin_cuda.so";
      if (std::filesystem::exists(path, ignored)) return path.string();
    }
  }
  return "libtide_standin_cuda.so, built beside libtide.so";
}

std::string not_found_message(const std::string& library, const std::string& why) {
  const bool from_env = config::env_text("TIDE_CUDA_DRIVER").has_value();
  std::string message = "tide: no CUDA driver: could not load " + library;
  message += from_env ? " (named by TIDE_CUDA_DRIVER)" : " (the NVIDIA driver's library)";
  message += ": " + why + ". ";
  message += from_env ? "Check the path in TIDE_CUDA_DRIVER, or unset it to use libcuda.so.1."
                      : "Install the NVIDIA driver, or set TIDE_CUDA_DRIVER=/path/to/libcuda.so.1 "
                        "(the host stand-in driver, " +
                            standin_location() + ", runs tide without a GPU).";
  return message;
}

void* resolve(void* handle, GetProcAddress get_proc, const char* name, const char* symbol) {
  void* fn = nullptr;
  if (get_proc != nullptr) {
    CUdriverProcAddressQueryResult status{};
    if (get_proc(name, &fn, kAbiVersion, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status) !=
            CUDA_SUCCESS ||
        status != CU_GET_PROC_ADDRESS_SUCCESS) {
      fn = nullptr;
    }
  }
  if (fn == nullptr) fn = dlsym(handle, symbol);
  return fn;
}

}  // namespace

bool CudaApi::has_vmm() const {
  return cuMemGetAllocationGranularity != nullptr && cuMemAddressReserve != nullptr &&
         cuMemAddressFree != nullptr && cuMemCreate != nullptr && cuMemRelease != nullptr &&
         cuMemMap != nullptr && cuMemUnmap != nullptr && cuMemSetAccess != nullptr;
}

CudaApi load_driver(const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    throw DriverNotFound(not_found_message(library, why != nullptr ? why : "dlopen failed"));
  }
  auto get_proc = reinterpret_cast<GetProcAddress>(dlsym(handle, "cuGetProcAddress_v2"));

  CudaApi api;
  api.library = library;
#define TIDE_CUDA_RESOLVE(name, symbol, required)                                            \
  api.name = reinterpret_cast<decltype(api.name)>(resolve(handle, get_proc, #name, symbol)); \
  if ((required) && api.name == nullptr) {                                                   \
    throw DriverNotFound(not_found_message(library, "it has no " symbol));                   \
  }
  TIDE_CUDA_FUNCTIONS(TIDE_CUDA_RESOLVE)
#undef TIDE_CUDA_RESOLVE

  // Errors from here on are the driver's; name them with the api being built.
  if (CUresult r = api.cuInit(0); r != CUDA_SUCCESS) {
    const char* name = nullptr;
    api.cuGetErrorName(r, &name);
    throw DriverNotFound(not_found_message(
        library, std::string("cuInit failed: ") + (name != nullptr ? name : "unknown error")));
  }
  if (CUresult r = api.cuDriverGetVersion(&api.version); r != CUDA_SUCCESS) {
    throw DriverNotFound(not_found_message(library, "cuDriverGetVersion failed"));
  }
  return api;
}

const CudaApi& cuda() {
  static const CudaApi api =
      load_driver(config::env_text("TIDE_CUDA_DRIVER").value_or(kDefaultLibrary));
  return api;
}

}  // namespace tide::driver

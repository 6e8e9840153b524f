#include "driver/module.h"

#include <utility>

#include "driver/context.h"
#include "driver/cuda_api.h"
#include "driver/error.h"
#include "driver/stream.h"

namespace tide::driver {

Module::Module(const void* image) : context_(current_context()) {
  TIDE_CU(cuModuleLoadData, &module_, image);
}

Module::~Module() {
  if (module_ != nullptr) destroy_in(context_, [this] { cuda().cuModuleUnload(module_); });
}

Module::Module(Module&& other) noexcept
    : module_(std::exchange(other.module_, nullptr)), context_(other.context_) {}

Module& Module::operator=(Module&& other) noexcept {
  std::swap(module_, other.module_);
  std::swap(context_, other.context_);
  return *this;
}

CUfunction Module::function(const std::string& name) const {
  CUfunction fn = nullptr;
  TIDE_CU(cuModuleGetFunction, &fn, module_, name.c_str());
  return fn;
}

void launch_raw(CUfunction kernel, const LaunchShape& shape, const Stream& stream, void** args) {
  TIDE_CU(cuLaunchKernel, kernel, shape.grid_x, shape.grid_y, shape.grid_z, shape.block_x,
          shape.block_y, shape.block_z, shape.shared_bytes, stream.get(), args, nullptr);
}

}  // namespace tide::driver

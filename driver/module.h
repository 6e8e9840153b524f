// A loaded module (fatbin, cubin or PTX image) and launches of its kernels.
#pragma once

#include <cuda.h>

#include <string>

namespace tide::driver {

class Stream;

struct LaunchShape {
  unsigned grid_x = 1, grid_y = 1, grid_z = 1;
  unsigned block_x = 1, block_y = 1, block_z = 1;
  unsigned shared_bytes = 0;
};

// Loaded into the context current when it is made (which must stay alive while it does), and
// unloaded in it, on whatever thread lets it go.
class Module {
 public:
  // `image` must stay valid while the module is loaded.
  explicit Module(const void* image);
  ~Module();
  Module(Module&& other) noexcept;
  Module& operator=(Module&& other) noexcept;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The kernel named `name` (its extern "C" name). Throws CudaError if the module lacks it.
  CUfunction function(const std::string& name) const;

 private:
  CUmodule module_ = nullptr;
  CUcontext context_ = nullptr;
};

// Launches `kernel` with one parameter struct passed by value.
template <typename Params>
void launch(CUfunction kernel, const LaunchShape& shape, const Stream& stream, Params params);

void launch_raw(CUfunction kernel, const LaunchShape& shape, const Stream& stream, void** args);

template <typename Params>
void launch(CUfunction kernel, const LaunchShape& shape, const Stream& stream, Params params) {
  void* args[] = {&params};
  launch_raw(kernel, shape, stream, args);
}

}  // namespace tide::driver

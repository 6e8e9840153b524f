// What the stand-in-driven benchmarks (bench_update_phase, bench_iteration) share: the GPU's Adam
// as a kernel that only takes the time a GPU at a given rate would (the CPU must stay free for
// the CPU subgroups it is compared with), and the stand-in driver's control functions.
#pragma once

#include <dlfcn.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "kernels/adam_kernel.h"
#include "standin/standin.h"

namespace tide::bench {

// Params/s of the simulated GPU Adam; set before the first launch.
inline double simulated_gpu_rate = 5e10;

// Registered with tide_standin_register_kernel for kernels::kAdamKernel.
inline void sleeping_adam(const tide_standin_grid* /*grid*/, void** params) {
  const auto* p = static_cast<const kernels::AdamKernelParams*>(params[0]);
  std::uint64_t n = 0;
  for (std::uint32_t i = 0; i < p->subgroup_count; ++i) n += p->subgroups[i].count;
  std::this_thread::sleep_for(
      std::chrono::duration<double>(static_cast<double>(n) / simulated_gpu_rate));
}

// The stand-in driver TIDE_CUDA_DRIVER names, opened for its control functions; exits with
// status 2, naming the benchmark, when it is not set or cannot be loaded.
inline void* open_standin(const char* bench) {
  const char* path = std::getenv("TIDE_CUDA_DRIVER");
  void* handle = path != nullptr ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (handle == nullptr) {
    std::fprintf(stderr, "%s: set TIDE_CUDA_DRIVER to the stand-in driver\n", bench);
    std::exit(2);
  }
  return handle;
}

// A stand-in control function from the loaded driver `handle`; exits with status 2, naming the
// benchmark, when the driver is not the stand-in.
template <typename F>
F standin_fn(void* handle, const char* name, const char* bench) {
  auto* f = reinterpret_cast<F>(dlsym(handle, name));
  if (f == nullptr) {
    std::fprintf(stderr, "%s: needs the stand-in driver (TIDE_CUDA_DRIVER); no %s\n", bench, name);
    std::exit(2);
  }
  return f;
}

}  // namespace tide::bench

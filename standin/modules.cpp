#include "standin/modules.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "kernels/host/grid.h"
#include "kernels/host_kernel.h"
#include "standin/contexts.h"
#include "standin/stats.h"

namespace tide::standin {
namespace {

// A kernel as the stand-in runs it: one of tide's kernels compiled for the host, or a test's
// kernel.
struct Kernel {
  const kernels::HostKernelEntry* source = nullptr;
  tide_standin_kernel test_kernel = nullptr;
  std::size_t param_bytes = 0;

  void run(const kernels::HostGrid& grid, void** params) const {
    if (source != nullptr) {
      try {
        kernels::host::run_grid(grid, source->thread, params[0]);
      } catch (const kernels::host::KernelFault& e) {
        // On a GPU the context would be lost (CUDA_ERROR_ILLEGAL_ADDRESS and the like, from
        // every later call); here the process stops, saying where.
        std::fprintf(stderr, "tide stand-in: kernel %.*s faulted: %s\n",
                     static_cast<int>(source->name.size()), source->name.data(), e.what());
        std::abort();
      }
      return;
    }
    tide_standin_grid g;
    std::memcpy(g.grid, grid.grid, sizeof g.grid);
    std::memcpy(g.block, grid.block, sizeof g.block);
    g.shared_bytes = grid.shared_bytes;
    test_kernel(&g, params);
  }
};

struct Module;

struct Function {
  Module* module;
  Kernel kernel;
};

struct Module {
  const Context* context;
  std::map<std::string, std::unique_ptr<Function>, std::less<>> functions;  // by name
};

struct Registry {
  std::mutex mutex;
  std::unordered_map<CUmodule, std::unique_ptr<Module>> modules;
  std::unordered_map<CUfunction, Function*> functions;  // of the loaded modules
  std::map<std::string, Kernel, std::less<>> test_kernels;
};

Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

// Under the registry's lock.
bool find_kernel(Registry& r, std::string_view name, Kernel* out) {
  if (const auto it = r.test_kernels.find(name); it != r.test_kernels.end()) {
    *out = it->second;
    return true;
  }
  if (const kernels::HostKernelEntry* entry = kernels::find_host_kernel(name)) {
    *out = Kernel{entry, nullptr, entry->param_bytes};
    return true;
  }
  return false;
}

void erase_locked(Registry& r, std::unordered_map<CUmodule, std::unique_ptr<Module>>::iterator it) {
  for (const auto& [name, function] : it->second->functions) {
    r.functions.erase(reinterpret_cast<CUfunction>(function.get()));
  }
  r.modules.erase(it);
}

// The parameter bytes of a launch: from kernelParams[0], or from an `extra` buffer.
CUresult copy_params(const Kernel& kernel, void** params, void** extra,
                     std::shared_ptr<unsigned char[]>* out) {
  const std::size_t n = kernel.param_bytes;
  // max_align_t-aligned, as the struct's own alignment needs.
  *out = std::shared_ptr<unsigned char[]>(new unsigned char[n == 0 ? 1 : n]);
  if (n == 0) return CUDA_SUCCESS;
  if (params != nullptr) {
    if (params[0] == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::memcpy(out->get(), params[0], n);
    return CUDA_SUCCESS;
  }
  if (extra == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const void* buffer = nullptr;
  const std::size_t* size = nullptr;
  for (void** e = extra; *e != CU_LAUNCH_PARAM_END; e += 2) {
    if (e[0] == CU_LAUNCH_PARAM_BUFFER_POINTER) {
      buffer = e[1];
    } else if (e[0] == CU_LAUNCH_PARAM_BUFFER_SIZE) {
      size = static_cast<const std::size_t*>(e[1]);
    } else {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  if (buffer == nullptr || size == nullptr || *size != n) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(out->get(), buffer, n);
  return CUDA_SUCCESS;
}

}  // namespace

CUresult module_load_data(CUmodule* out, const void* image) {
  if (out == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* context = nullptr;
  if (CUresult r = current_context(&context); r != CUDA_SUCCESS) return r;
  auto module = std::make_unique<Module>();
  module->context = context;
  const auto handle = reinterpret_cast<CUmodule>(module.get());
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  r.modules.emplace(handle, std::move(module));
  *out = handle;
  return CUDA_SUCCESS;
}

CUresult module_unload(CUmodule module) {
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  const auto it = r.modules.find(module);
  if (it == r.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
  erase_locked(r, it);
  return CUDA_SUCCESS;
}

CUresult module_get_function(CUfunction* out, CUmodule module, const char* name) {
  if (out == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  const auto it = r.modules.find(module);
  if (it == r.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
  auto& functions = it->second->functions;
  auto found = functions.find(std::string_view(name));
  if (found == functions.end()) {
    Kernel kernel;
    if (!find_kernel(r, name, &kernel)) return CUDA_ERROR_NOT_FOUND;
    auto function = std::make_unique<Function>(Function{it->second.get(), kernel});
    r.functions.emplace(reinterpret_cast<CUfunction>(function.get()), function.get());
    found = functions.emplace(name, std::move(function)).first;
  }
  *out = reinterpret_cast<CUfunction>(found->second.get());
  return CUDA_SUCCESS;
}

CUresult launch_kernel(CUfunction function, const unsigned grid[3], const unsigned block[3],
                       unsigned shared_bytes, CUstream handle, void** params, void** extra,
                       DefaultStream fallback) {
  // The limits the device reports (devices.cpp).
  if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0 || block[0] == 0 || block[1] == 0 ||
      block[2] == 0 || grid[1] > 65535 || grid[2] > 65535 || grid[0] > 2147483647u ||
      block[0] > 1024 || block[1] > 1024 || block[2] > 64 ||
      std::uint64_t{block[0]} * block[1] * block[2] > 1024 || shared_bytes > 232448) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (params != nullptr && extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  Kernel kernel;
  {
    Registry& r = registry();
    const std::lock_guard lock(r.mutex);
    const auto it = r.functions.find(function);
    if (it == r.functions.end()) return CUDA_ERROR_INVALID_HANDLE;
    kernel = it->second->kernel;
  }
  std::shared_ptr<Stream> stream;
  if (CUresult r = resolve_stream(handle, fallback, &stream); r != CUDA_SUCCESS) return r;
  // Copied now: the caller's parameters may be gone by the time the work runs.
  std::shared_ptr<unsigned char[]> bytes;
  if (CUresult r = copy_params(kernel, params, extra, &bytes); r != CUDA_SUCCESS) return r;
  kernels::HostGrid shape{};
  std::memcpy(shape.grid, grid, sizeof shape.grid);
  std::memcpy(shape.block, block, sizeof shape.block);
  shape.shared_bytes = shared_bytes;
  stream->submit([kernel, shape, bytes] {
    void* args[] = {bytes.get()};
    kernel.run(shape, args);
  });
  count(Counter::kKernelLaunches);
  return CUDA_SUCCESS;
}

int register_kernel(const char* name, tide_standin_kernel run, std::size_t param_bytes) {
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  if (run == nullptr) {
    if (const auto it = r.test_kernels.find(std::string_view(name)); it != r.test_kernels.end()) {
      r.test_kernels.erase(it);
    }
  } else {
    r.test_kernels.insert_or_assign(name, Kernel{nullptr, run, param_bytes});
  }
  return CUDA_SUCCESS;
}

void unload_modules_of(const Context& context) {
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  for (auto it = r.modules.begin(); it != r.modules.end();) {
    auto next = std::next(it);
    if (it->second->context == &context) erase_locked(r, it);
    it = next;
  }
}

}  // namespace tide::standin

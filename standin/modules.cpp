#include "standin/modules.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/host/grid.h"
#include "kernels/host_kernel.h"
#include "standin/contexts.h"
#include "standin/copies.h"
#include "standin/device_faults.h"
#include "standin/faults.h"
#include "standin/holds.h"
#include "standin/pending_uses.h"
#include "standin/recording.h"
#include "standin/stats.h"

namespace tide::standin {
namespace {

// Dynamic shared memory a launch may ask for without opting in, as on every GPU since Volta.
constexpr unsigned kDefaultSharedBytes = 48 * 1024;

// A kernel as the stand-in runs it: one of tide's kernels compiled for the host, or a test's
// kernel.
struct Kernel {
  const kernels::HostKernelEntry* source = nullptr;
  tide_standin_kernel test_kernel = nullptr;
  std::size_t param_bytes = 0;

  std::string name() const {
    return source != nullptr ? std::string(source->name) : "a test kernel";
  }

  void run(const kernels::HostGrid& grid, void** params) const {
    if (source != nullptr) {
      try {
        kernels::host::run_grid(grid, source->thread, params[0]);
      } catch (const kernels::host::KernelFault& e) {
        device_fault("kernel " + name() + ": " + e.what());
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
  std::string name;  // as cuModuleGetFunction was given it
};

struct Module {
  const Context* context;
  std::string image;  // a copy: the caller may free its image after loading it, as with CUDA
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

// The bytes of a module image: a fatbin (tide's, kernels/fatbin.h) or an ELF cubin, as long as its
// headers say; anything else is PTX, text up to its NUL. Empty when a header makes no sense. (The
// magic numbers are compared byte by byte: no byte is read past the NUL of a short text.)
std::string_view image_bytes(const void* image) {
  constexpr std::uint64_t kLimit = std::uint64_t{1} << 30;
  const auto* p = static_cast<const unsigned char*>(image);
  auto field = [p](std::size_t offset, auto zero) {
    decltype(zero) value;
    std::memcpy(&value, p + offset, sizeof value);
    return static_cast<std::uint64_t>(value);
  };
  std::uint64_t size = 0;
  if (p[0] == 0x50 && p[1] == 0xed && p[2] == 0x55 && p[3] == 0xba) {
    const std::uint64_t header = field(6, std::uint16_t{});
    const std::uint64_t payload = field(8, std::uint64_t{});
    if (header < 16 || payload > kLimit) return {};
    size = header + payload;
  } else if (p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F') {
    if (p[4] != 2) return {};  // 64-bit ELF only
    const std::uint64_t programs = field(0x20, std::uint64_t{}),
                        sections = field(0x28, std::uint64_t{});
    if (programs > kLimit || sections > kLimit) return {};
    size = std::max({std::uint64_t{64},
                     programs + field(0x36, std::uint16_t{}) * field(0x38, std::uint16_t{}),
                     sections + field(0x3a, std::uint16_t{}) * field(0x3c, std::uint16_t{})});
  } else {
    size = strnlen(static_cast<const char*>(image), kLimit);
    if (size == kLimit) return {};
  }
  return {static_cast<const char*>(image), size};
}

// Whether `image` names `kernel` as a whole identifier (a fatbin's symbol and section names, a
// PTX .entry): cuModuleGetFunction finds only the kernels the module has.
bool names(std::string_view image, std::string_view kernel) {
  auto identifier = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '$';
  };
  for (std::size_t at = image.find(kernel); at != std::string_view::npos;
       at = image.find(kernel, at + 1)) {
    const std::size_t end = at + kernel.size();
    if ((at == 0 || !identifier(image[at - 1])) &&
        (end == image.size() || !identifier(image[end]))) {
      return true;
    }
  }
  return false;
}

// The memory a launch of tide's kernel uses, described for a device fault.
std::string describe(const kernels::KernelRange& range) {
  return (range.write ? "writes " : "reads ") + std::to_string(range.bytes) + " bytes at 0x" + [&] {
    char text[24];
    std::snprintf(text, sizeof text, "%llx", static_cast<unsigned long long>(range.address));
    return std::string(text);
  }();
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
  const std::string_view bytes = image_bytes(image);
  if (bytes.empty()) return CUDA_ERROR_INVALID_IMAGE;
  auto module = std::make_unique<Module>();
  module->context = context;
  module->image = bytes;
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
    if (!names(it->second->image, name) || !find_kernel(r, name, &kernel)) {
      return CUDA_ERROR_NOT_FOUND;
    }
    auto function = std::make_unique<Function>(Function{it->second.get(), kernel, name});
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
      std::uint64_t{block[0]} * block[1] * block[2] > 1024) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Above 48 KiB of dynamic shared memory a kernel must have opted in
  // (cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)), which tide never does.
  if (shared_bytes > kDefaultSharedBytes) return CUDA_ERROR_INVALID_VALUE;
  if (params != nullptr && extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  Kernel kernel;
  const Context* module_context = nullptr;
  tide_standin_op op{};
  op.kind = TIDE_STANDIN_OP_KERNEL;
  {
    Registry& r = registry();
    const std::lock_guard lock(r.mutex);
    const auto it = r.functions.find(function);
    if (it == r.functions.end()) return CUDA_ERROR_INVALID_HANDLE;
    kernel = it->second->kernel;
    module_context = it->second->module->context;
    it->second->name.copy(op.name, sizeof op.name - 1);
  }
  std::shared_ptr<Stream> stream;
  if (CUresult r = resolve_stream(handle, fallback, &stream); r != CUDA_SUCCESS) return r;
  // A module's code is loaded in its context only.
  if (&stream->context() != module_context) return CUDA_ERROR_INVALID_HANDLE;
  // Copied now: the caller's parameters may be gone by the time the work runs.
  std::shared_ptr<unsigned char[]> bytes;
  if (CUresult r = copy_params(kernel, params, extra, &bytes); r != CUDA_SUCCESS) return r;
  kernels::HostGrid shape{};
  std::memcpy(shape.grid, grid, sizeof shape.grid);
  std::memcpy(shape.block, block, sizeof shape.block);
  shape.shared_bytes = shared_bytes;
  // tide's kernels say what memory they use: it must be device memory (or, with HMM, host memory)
  // when the kernel runs, and stays registered as in use until it has run.
  std::vector<kernels::KernelRange> ranges;
  std::shared_ptr<PendingUse> use;
  if (kernel.source != nullptr) {
    ranges = kernel.source->ranges(shape, bytes.get());
    std::vector<UsedRange> used;
    used.reserve(ranges.size());
    for (const kernels::KernelRange& range : ranges) used.push_back({range.address, range.bytes});
    use = std::make_shared<PendingUse>(std::move(used), "a launch of " + kernel.name());
  }
  // Armed launch failures come after every check, so only a launch that would have run fails.
  if (inject_launch_failure()) return CUDA_ERROR_LAUNCH_FAILED;
  op.device = stream->context().device();
  op.stream = stream->id();
  stream->submit([kernel, shape, bytes, ranges, use, recorded = record_submission(op)]() mutable {
    pass_hold(TIDE_STANDIN_OP_KERNEL);
    recorded.started();
    for (const kernels::KernelRange& range : ranges) {
      if (range.bytes != 0 && !is_device_range(range.address, range.bytes, range.write)) {
        device_fault("kernel " + kernel.name() + " " + describe(range) +
                     ", which the device cannot address (not device memory, or not mapped with "
                     "that access; host memory only with TIDE_STANDIN_HMM)");
      }
    }
    void* args[] = {bytes.get()};
    kernel.run(shape, args);
    use.reset();
    recorded.ended();
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

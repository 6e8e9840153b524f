#include "interpose/plt_bindings.h"

#include <dlfcn.h>
#include <link.h>

#include <string>
#include <vector>

#include "interpose/real_dlsym.h"

namespace tide::interpose {
namespace {

void* lookup_in(void* handle, const char* name) {
  if (handle == nullptr) return nullptr;
  void* symbol = real_dlsym()(handle, name);
  return symbol != nullptr && !is_own_address(symbol) ? symbol : nullptr;
}

int collect_object(dl_phdr_info* info, size_t /*size*/, void* names) {
  if (info->dlpi_name != nullptr && info->dlpi_name[0] != '\0') {
    static_cast<std::vector<std::string>*>(names)->emplace_back(info->dlpi_name);
  }
  return 0;
}

void* lookup_anywhere(const char* name) {
  std::vector<std::string> objects;  // collected first: no dlopen inside dl_iterate_phdr
  dl_iterate_phdr(&collect_object, &objects);
  for (const std::string& object : objects) {
    void* handle = dlopen(object.c_str(), RTLD_NOLOAD | RTLD_LAZY);
    if (handle == nullptr) continue;
    void* real = lookup_in(handle, name);
    dlclose(handle);
    if (real != nullptr) return real;
  }
  return nullptr;
}

void* resolve_for_caller(const char* name, void* return_address) {
  void* real = nullptr;
  Dl_info info{};
  if (dladdr(return_address, &info) != 0 && info.dli_fname != nullptr) {
    if (void* caller = dlopen(info.dli_fname, RTLD_NOLOAD | RTLD_LAZY)) {
      real = lookup_in(caller, name);
      dlclose(caller);
    }
  }
  // Called from here, glibc's RTLD_NEXT means: after the preload, in the global scope.
  if (real == nullptr) real = lookup_in(RTLD_NEXT, name);
  // A tail call (`return cudaMalloc(...)` compiled to a jump) leaves the caller's caller as the
  // return address, whose scope may not hold the library: then any loaded object that has it.
  if (real == nullptr) real = lookup_anywhere(name);
  return real;
}

}  // namespace

Binding& caller_binding(PltSite& site, void* return_address) {
  dl_find_object found{};
  const void* object = _dl_find_object(return_address, &found) == 0 ? found.dlfo_link_map : nullptr;
  if (object != nullptr) {
    for (PltSite::Caller& caller : site.callers) {
      const int state = caller.state.load(std::memory_order_acquire);
      if (state == 2 && caller.object == object) return caller.binding;
      if (state == 0) break;
    }
  }
  void* real = resolve_for_caller(site.name, return_address);
  // A miss is not cached: the library may be loaded later.
  if (object != nullptr && real != nullptr) {
    for (PltSite::Caller& caller : site.callers) {
      int expected = 0;
      if (caller.state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
        caller.object = object;
        caller.binding.real.store(real, std::memory_order_relaxed);
        caller.state.store(2, std::memory_order_release);
        return caller.binding;
      }
      if (expected == 2 && caller.object == object) return caller.binding;
    }
  }
  // No cache entry left (or no object): a binding for this call only.
  static constinit thread_local Binding uncached __attribute__((tls_model("initial-exec")));
  uncached.real.store(real, std::memory_order_relaxed);
  uncached.companions_resolved.store(false, std::memory_order_relaxed);
  return uncached;
}

}  // namespace tide::interpose

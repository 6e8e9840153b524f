#include "interpose/bindings.h"

#include <dlfcn.h>

#include <utility>

#include "interpose/hooks.h"
#include "interpose/real_dlsym.h"

namespace tide::interpose {
namespace {

Binding g_bindings[kKindCount][kSlotsPerKind];
std::atomic<std::size_t> g_unbound{0};

// Slot S of Kind K: calls K's body with binding [K][S].
template <Kind K, std::size_t S, typename Fn = typename Entry<K>::Fn>
struct SlotHook;

template <Kind K, std::size_t S, typename R, typename... A>
struct SlotHook<K, S, R (*)(A...)> {
  static R call(A... args) { return Entry<K>::body(g_bindings[index(K)][S], args...); }
};

template <Kind K, std::size_t... S>
void* slot_hook(std::size_t slot, std::index_sequence<S...> /*slots*/) {
  static constexpr typename Entry<K>::Fn kHooks[] = {&SlotHook<K, S>::call...};
  return reinterpret_cast<void*>(kHooks[slot]);
}

void* hook_for(Kind kind, std::size_t slot) {
  switch (kind) {
#define TIDE_SLOT_CASE(kind, result, params) \
  case Kind::kind:                           \
    return slot_hook<Kind::kind>(slot, std::make_index_sequence<kSlotsPerKind>());
    TIDE_HOOKED_FUNCTIONS(TIDE_SLOT_CASE)
#undef TIDE_SLOT_CASE
    case Kind::count:
      break;
  }
  return nullptr;
}

}  // namespace

void* bind(Kind kind, void* real) {
  if (real == nullptr || kind == Kind::count) return nullptr;
  for (std::size_t slot = 0; slot < kSlotsPerKind; ++slot) {
    Binding& b = g_bindings[index(kind)][slot];
    void* current = b.real.load(std::memory_order_acquire);
    if (current == nullptr &&
        b.real.compare_exchange_strong(current, real, std::memory_order_acq_rel)) {
      return hook_for(kind, slot);
    }
    if (current == real) return hook_for(kind, slot);
  }
  g_unbound.fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}

void* intercept_dlsym(void* handle, const char* name) {
  const auto kind = kind_for_symbol(name);
  if (!kind) return nullptr;
  void* real = real_dlsym()(handle, name);
  // Not found: glibc's dlsym answers again, setting dlerror() for the caller.
  if (real == nullptr) return nullptr;
  if (is_own_address(real)) {
    // Found in the preload itself (RTLD_DEFAULT, the main program's scope). That export is a
    // hook if some object after the preload has the function; if none has, the answer without
    // the preload would have been NULL, and a program probing for a loaded driver must get it.
    if (real_dlsym()(RTLD_NEXT, name) == nullptr) return kDlsymNotFound;  // sets dlerror()
    return nullptr;
  }
  return bind(*kind, real);
}

std::size_t unbound_lookups() { return g_unbound.load(std::memory_order_relaxed); }

void* companion_symbol(const void* function, const char* name) {
  Dl_info info{};
  if (function == nullptr || dladdr(function, &info) == 0) return nullptr;
  void* handle =
      info.dli_fname != nullptr ? dlopen(info.dli_fname, RTLD_NOLOAD | RTLD_LAZY) : nullptr;
  // The main program cannot be reopened by its name; its handle searches the global scope.
  if (handle == nullptr) handle = dlopen(nullptr, RTLD_LAZY);
  if (handle == nullptr) return nullptr;
  void* symbol = real_dlsym()(handle, name);
  dlclose(handle);
  return symbol != nullptr && !is_own_address(symbol) ? symbol : nullptr;
}

bool bound_to_standin() {
  for (const auto& kind : g_bindings) {
    for (const Binding& binding : kind) {
      const void* real = binding.real.load(std::memory_order_acquire);
      if (real != nullptr && companion_symbol(real, "tide_standin_stat") != nullptr) return true;
    }
  }
  return false;
}

int current_device(Binding& binding) {
  using CtxGetCurrent = CUresult (*)(CUcontext*);
  using CtxGetDevice = CUresult (*)(CUdevice*);
  if (!binding.companions_resolved.load(std::memory_order_acquire)) {
    void* real = binding.real.load(std::memory_order_acquire);
    binding.ctx_get_current.store(companion_symbol(real, "cuCtxGetCurrent"),
                                  std::memory_order_relaxed);
    binding.ctx_get_device.store(companion_symbol(real, "cuCtxGetDevice"),
                                 std::memory_order_relaxed);
    binding.companions_resolved.store(true, std::memory_order_release);
  }
  // A thread with no current context has no device (its call will fail in the driver): asking
  // cuCtxGetDevice there would be an API error of tide's own in the program's debugger.
  auto current =
      reinterpret_cast<CtxGetCurrent>(binding.ctx_get_current.load(std::memory_order_relaxed));
  CUcontext context = nullptr;
  if (current != nullptr && (current(&context) != CUDA_SUCCESS || context == nullptr)) return 0;
  auto get = reinterpret_cast<CtxGetDevice>(binding.ctx_get_device.load(std::memory_order_relaxed));
  CUdevice device = 0;
  if (get == nullptr || get(&device) != CUDA_SUCCESS) return 0;
  return device;
}

}  // namespace tide::interpose

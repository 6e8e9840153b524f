#include "interpose/real_dlsym.h"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "interpose/bindings.h"
#include "interpose/entry_points.h"

// Read by dlsym_trampoline.S, which jumps to it when the replacement declines.
extern "C" {
__attribute__((visibility("hidden"))) void* tide_real_dlsym_fn = nullptr;
__attribute__((visibility("hidden"))) void* tide_dlsym_replacement(void* handle, const char* name);
}

// Not instrumented by sanitizers: a sanitizer runtime loaded ahead of the preload looks up the
// functions it intercepts with dlsym(RTLD_NEXT, ...) during its own initialisation, before
// instrumented code may run, and those calls come through the preload's dlsym first.
#define TIDE_NO_SANITIZE __attribute__((no_sanitize("address", "undefined", "thread")))

namespace tide::interpose {
namespace {

TIDE_NO_SANITIZE void fail(const char* message) {
  // No stdio: this can run before anything else in the process is initialised.
  const ssize_t ignored = write(STDERR_FILENO, message, std::strlen(message));
  (void)ignored;
  std::abort();
}

// RTLD_NEXT from here never finds the preload's own dlsym.
TIDE_NO_SANITIZE DlsymFn resolve() {
  void* fn = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (fn == nullptr) fn = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  if (fn == nullptr) {
    fail("tide preload: cannot find glibc's dlsym (dlvsym(RTLD_NEXT, \"dlsym\", ...) failed)\n");
  }
  __atomic_store_n(&tide_real_dlsym_fn, fn, __ATOMIC_RELEASE);
  return reinterpret_cast<DlsymFn>(fn);
}

void own_anchor() {}

}  // namespace

TIDE_NO_SANITIZE DlsymFn real_dlsym() {
  void* fn = __atomic_load_n(&tide_real_dlsym_fn, __ATOMIC_ACQUIRE);
  return fn != nullptr ? reinterpret_cast<DlsymFn>(fn) : resolve();
}

bool is_own_address(const void* address) {
  static const void* const own_map = [] {
    dl_find_object found{};
    return _dl_find_object(reinterpret_cast<void*>(&own_anchor), &found) == 0
               ? static_cast<const void*>(found.dlfo_link_map)
               : nullptr;
  }();
  dl_find_object found{};
  return own_map != nullptr && _dl_find_object(const_cast<void*>(address), &found) == 0 &&
         found.dlfo_link_map == own_map;
}

TIDE_NO_SANITIZE void* dlsym_replacement(void* handle, const char* name) {
  real_dlsym();  // the trampoline jumps through tide_real_dlsym_fn when this returns nullptr
  // RTLD_NEXT is relative to the caller, which only glibc's dlsym reached by a jump from the
  // trampoline sees: never intercepted.
  // (maybe_hooked(), spelled out: an instrumented helper must not be called from here.)
  if (name == nullptr || name[0] != 'c' || name[1] != 'u' || handle == RTLD_NEXT) return nullptr;
  return intercept_dlsym(handle, name);
}

}  // namespace tide::interpose

TIDE_NO_SANITIZE void* tide_dlsym_replacement(void* handle, const char* name) {
  return tide::interpose::dlsym_replacement(handle, name);
}

#if !defined(__x86_64__)
// Without the assembly trampoline (x86-64 only, so far), dlsym is a plain function: lookups it
// forwards with RTLD_NEXT then search from the preload's place instead of their caller's.
extern "C" __attribute__((visibility("default"))) void* dlsym(void* handle, const char* name) {
  void* hook = tide_dlsym_replacement(handle, name);
  if (hook == tide::interpose::kDlsymNotFound) return nullptr;
  if (hook != nullptr) return hook;
  return tide::interpose::real_dlsym()(handle, name);
}
#endif

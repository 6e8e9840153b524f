// glibc's dlsym, and which addresses belong to the preload itself.
//
// The preload exports its own `dlsym` (dlsym_trampoline.S): the CUDA runtime finds
// cuGetProcAddress with dlsym on a local handle of libcuda.so.1, which no LD_PRELOAD symbol
// shadows, so the interposer must answer that lookup itself (docs/design/index.md, pitfalls).
// Everything the interposer looks up goes to glibc's dlsym directly, never through its own.
#pragma once

#include <cstdint>

namespace tide::interpose {

using DlsymFn = void* (*)(void*, const char*);

// glibc's dlsym: the next definition after the preload, dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")
// (glibc 2.34 moved dlsym from libdl into libc under that version), else the GLIBC_2.2.5 one.
// Aborts with a message if neither exists: without it, no dlsym in the process can work.
DlsymFn real_dlsym();

// Whether `address` lies in libtide_preload.so.
bool is_own_address(const void* address);

// The hook a dlsym(handle, name) answer should be replaced with, nullptr to let glibc's dlsym
// answer (also for every name the interposer does not hook), or kDlsymNotFound for "NULL" (with
// dlerror() set). Never calls the driver.
void* dlsym_replacement(void* handle, const char* name);

inline void* const kDlsymNotFound = reinterpret_cast<void*>(~std::uintptr_t{0});

}  // namespace tide::interpose

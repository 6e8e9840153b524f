// The CUDA entry points the interposer hooks, and which symbol names have which ABI.
//
// A Kind is one C signature the interposer wraps. Several exported names can share a Kind: the
// legacy-stream and per-thread (_ptsz) variants of the stream-ordered calls have the same
// signature and differ only in the function the driver hands out, which a hook is bound to.
//
// Driver names are versioned: "cuMemAlloc" (the unversioned symbol) is the CUDA 3.1 ABI with
// 32-bit sizes, "cuMemAlloc_v2" the one cuda.h has mapped cuMemAlloc to since. The interposer
// hooks only the ABIs below and passes every other version through untouched, so a caller never
// receives a hook with a newer ABI than the function the driver would have given it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tide::interpose {

enum class Kind : std::uint8_t {
  // Driver: allocation and release of device memory.
  mem_alloc,                  // cuMemAlloc_v2
  mem_alloc_pitch,            // cuMemAllocPitch_v2
  mem_alloc_managed,          // cuMemAllocManaged
  mem_free,                   // cuMemFree_v2
  mem_create,                 // cuMemCreate (virtual memory: physical allocation)
  mem_release,                // cuMemRelease
  mem_map,                    // cuMemMap
  mem_unmap,                  // cuMemUnmap
  mem_alloc_async,            // cuMemAllocAsync, cuMemAllocAsync_ptsz
  mem_free_async,             // cuMemFreeAsync, cuMemFreeAsync_ptsz
  mem_alloc_from_pool_async,  // cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz
  // Driver: what the memory limit changes.
  mem_get_info,      // cuMemGetInfo_v2
  device_total_mem,  // cuDeviceTotalMem_v2
  // Driver: how callers find all of the above.
  get_proc_address_v1,  // cuGetProcAddress (CUDA 11.3 ABI, no symbolStatus)
  get_proc_address_v2,  // cuGetProcAddress_v2
  // Runtime, for attribution (the driver hooks underneath do the accounting).
  rt_malloc,                  // cudaMalloc
  rt_malloc_pitch,            // cudaMallocPitch
  rt_malloc_managed,          // cudaMallocManaged
  rt_malloc_async,            // cudaMallocAsync(_ptsz)
  rt_malloc_from_pool_async,  // cudaMallocFromPoolAsync(_ptsz)
  rt_free,                    // cudaFree
  rt_free_async,              // cudaFreeAsync(_ptsz)
  count
};

inline constexpr std::size_t kKindCount = static_cast<std::size_t>(Kind::count);

constexpr std::size_t index(Kind kind) { return static_cast<std::size_t>(kind); }

// The CUDA name of the function a Kind wraps, e.g. "cuMemAlloc_v2".
std::string_view kind_name(Kind kind);

bool is_runtime(Kind kind);

// dlsym: the Kind of an exact exported symbol name, or nullopt when the name is not hooked.
std::optional<Kind> kind_for_symbol(std::string_view name);

// cuGetProcAddress: the Kind of the function the driver returns for `symbol` (a base name such
// as "cuMemAlloc") at the caller's cudaVersion, or nullopt when that version's ABI is not hooked.
std::optional<Kind> kind_for_proc(std::string_view symbol, int cuda_version);

// The newest CUDA version whose cuda.h this table was checked against (its versioned-name
// #defines). For a newer cudaVersion, a hook is returned only when the driver gives the same
// function as for this version, i.e. when the ABI has not changed since.
inline constexpr int kCheckedThroughVersion = 13000;

// True for names that may be in the table (a cheap first test for every dlsym in the process).
constexpr bool maybe_hooked(const char* name) {
  return name != nullptr && name[0] == 'c' && name[1] == 'u';
}

}  // namespace tide::interpose

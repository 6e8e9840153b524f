#include "interpose/entry_points.h"

namespace tide::interpose {
namespace {

struct SymbolName {
  std::string_view name;
  Kind kind;
};

// Every exported name with a hooked ABI. Legacy names ("cuMemAlloc", "cuMemFree", ...) are absent
// on purpose: they are the 32-bit CUDA 3.1 ABI.
constexpr SymbolName kSymbols[] = {
    {"cuMemAlloc_v2", Kind::mem_alloc},
    {"cuMemAllocPitch_v2", Kind::mem_alloc_pitch},
    {"cuMemAllocManaged", Kind::mem_alloc_managed},
    {"cuMemFree_v2", Kind::mem_free},
    {"cuMemCreate", Kind::mem_create},
    {"cuMemRelease", Kind::mem_release},
    {"cuMemMap", Kind::mem_map},
    {"cuMemUnmap", Kind::mem_unmap},
    {"cuMemAllocAsync", Kind::mem_alloc_async},
    {"cuMemAllocAsync_ptsz", Kind::mem_alloc_async},
    {"cuMemFreeAsync", Kind::mem_free_async},
    {"cuMemFreeAsync_ptsz", Kind::mem_free_async},
    {"cuMemAllocFromPoolAsync", Kind::mem_alloc_from_pool_async},
    {"cuMemAllocFromPoolAsync_ptsz", Kind::mem_alloc_from_pool_async},
    {"cuMemGetInfo_v2", Kind::mem_get_info},
    {"cuDeviceTotalMem_v2", Kind::device_total_mem},
    {"cuGetProcAddress", Kind::get_proc_address_v1},
    {"cuGetProcAddress_v2", Kind::get_proc_address_v2},
    {"cudaMalloc", Kind::rt_malloc},
    {"cudaMallocPitch", Kind::rt_malloc_pitch},
    {"cudaMallocManaged", Kind::rt_malloc_managed},
    {"cudaMallocAsync", Kind::rt_malloc_async},
    {"cudaMallocAsync_ptsz", Kind::rt_malloc_async},
    {"cudaMallocFromPoolAsync", Kind::rt_malloc_from_pool_async},
    {"cudaMallocFromPoolAsync_ptsz", Kind::rt_malloc_from_pool_async},
    {"cudaFree", Kind::rt_free},
    {"cudaFreeAsync", Kind::rt_free_async},
    {"cudaFreeAsync_ptsz", Kind::rt_free_async},
};

struct ProcVersion {
  std::string_view symbol;  // the base name callers pass to cuGetProcAddress
  int since;                // the cudaVersion from which the driver returns this Kind's ABI
  Kind kind;
};

// From cuda.h's versioned-name #defines: which ABI the driver returns for a base name and a
// cudaVersion. A request below `since` gets an older ABI, passed through unhooked.
constexpr ProcVersion kProcVersions[] = {
    {"cuMemAlloc", 3020, Kind::mem_alloc},
    {"cuMemAllocPitch", 3020, Kind::mem_alloc_pitch},
    {"cuMemFree", 3020, Kind::mem_free},
    {"cuMemGetInfo", 3020, Kind::mem_get_info},
    {"cuDeviceTotalMem", 3020, Kind::device_total_mem},
    {"cuMemAllocManaged", 6000, Kind::mem_alloc_managed},
    {"cuMemCreate", 10020, Kind::mem_create},
    {"cuMemRelease", 10020, Kind::mem_release},
    {"cuMemMap", 10020, Kind::mem_map},
    {"cuMemUnmap", 10020, Kind::mem_unmap},
    {"cuMemAllocAsync", 11020, Kind::mem_alloc_async},
    {"cuMemFreeAsync", 11020, Kind::mem_free_async},
    {"cuMemAllocFromPoolAsync", 11020, Kind::mem_alloc_from_pool_async},
    {"cuGetProcAddress", 11030, Kind::get_proc_address_v1},
    {"cuGetProcAddress", 12000, Kind::get_proc_address_v2},
};

}  // namespace

std::string_view kind_name(Kind kind) {
  static constexpr std::string_view kNames[kKindCount] = {
      "cuMemAlloc_v2",
      "cuMemAllocPitch_v2",
      "cuMemAllocManaged",
      "cuMemFree_v2",
      "cuMemCreate",
      "cuMemRelease",
      "cuMemMap",
      "cuMemUnmap",
      "cuMemAllocAsync",
      "cuMemFreeAsync",
      "cuMemAllocFromPoolAsync",
      "cuMemGetInfo_v2",
      "cuDeviceTotalMem_v2",
      "cuGetProcAddress",
      "cuGetProcAddress_v2",
      "cudaMalloc",
      "cudaMallocPitch",
      "cudaMallocManaged",
      "cudaMallocAsync",
      "cudaMallocFromPoolAsync",
      "cudaFree",
      "cudaFreeAsync",
  };
  return index(kind) < kKindCount ? kNames[index(kind)] : "unknown";
}

bool is_runtime(Kind kind) { return index(kind) >= index(Kind::rt_malloc); }

std::optional<Kind> kind_for_symbol(std::string_view name) {
  for (const SymbolName& s : kSymbols) {
    if (s.name == name) return s.kind;
  }
  return std::nullopt;
}

std::optional<Kind> kind_for_proc(std::string_view symbol, int cuda_version) {
  std::optional<Kind> best;
  int best_since = 0;
  bool base_name = false;
  for (const ProcVersion& v : kProcVersions) {
    if (v.symbol != symbol) continue;
    base_name = true;
    if (v.since <= cuda_version && v.since >= best_since) {
      best = v.kind;
      best_since = v.since;
    }
  }
  if (base_name) return best;
  // Not a base name: a driver that resolves an exact versioned name ("cuMemAlloc_v2") returns
  // the ABI the name says, whatever the cudaVersion.
  const auto exact = kind_for_symbol(symbol);
  if (exact && !is_runtime(*exact)) return exact;
  return std::nullopt;
}

}  // namespace tide::interpose

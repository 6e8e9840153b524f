// Virtual memory management: address reservations, physical memory, mappings, access.
//
// A reservation is a PROT_NONE private mapping; physical memory is a memfd of its size (pages
// come on first touch); cuMemMap maps the memfd over part of a reservation (MAP_FIXED), so the
// same physical memory mapped twice shows the same bytes; cuMemSetAccess mprotect()s it;
// cuMemUnmap puts the PROT_NONE reservation back. The rules are CUDA's: 2 MiB granularity for
// sizes, addresses and alignments, offset 0, no mapping over a mapping, access only for whole
// mappings, and physical memory lives until it is both released and unmapped.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

namespace tide::standin {

inline constexpr std::size_t kGranularity = std::size_t{2} << 20;

CUresult mem_get_allocation_granularity(std::size_t* out, const CUmemAllocationProp* prop,
                                        CUmemAllocationGranularity_flags option);
CUresult mem_address_reserve(CUdeviceptr* out, std::size_t size, std::size_t alignment,
                             CUdeviceptr hint, unsigned long long flags);
CUresult mem_address_free(CUdeviceptr ptr, std::size_t size);
CUresult mem_create(CUmemGenericAllocationHandle* out, std::size_t size,
                    const CUmemAllocationProp* prop, unsigned long long flags);
CUresult mem_release(CUmemGenericAllocationHandle handle);
CUresult mem_map(CUdeviceptr ptr, std::size_t size, std::size_t offset,
                 CUmemGenericAllocationHandle handle, unsigned long long flags);
CUresult mem_unmap(CUdeviceptr ptr, std::size_t size);
CUresult mem_set_access(CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc* desc,
                        std::size_t count);

// Whether all of [ptr, ptr + bytes) is mapped and accessible: readable, and writable if `write`.
bool vmm_accessible(std::uintptr_t ptr, std::size_t bytes, bool write);

// Whether any of [ptr, ptr + bytes) lies in address space reserved by cuMemAddressReserve.
bool overlaps_reservation(std::uintptr_t ptr, std::size_t bytes);

struct MappedRange {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  int device = 0;
};
// The mapping holding `ptr`, if any.
bool find_mapping(std::uintptr_t ptr, MappedRange* out);

}  // namespace tide::standin

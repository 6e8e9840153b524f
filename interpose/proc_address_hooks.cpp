// cuGetProcAddress (both ABIs): the driver's answer, replaced by the hook bound to it.
//
// The hook is chosen by the base name and the caller's cudaVersion (entry_points.cpp): the Kind
// whose ABI the driver returns at that version. The binding is to the pointer the driver
// actually returned, so the caller's flags (legacy or per-thread default stream) select the
// function exactly as they would without tide. Anything else (cuGetExportTable, older ABIs, any
// name tide does not hook) comes back untouched.
#include <cuda.h>

#include "interpose/hooks.h"
#include "interpose/interposer.h"
#include "interpose/real_dlsym.h"

namespace tide::interpose {
namespace {

// `requery(version, &fn)` asks the driver again for `symbol` at another version.
template <typename Requery>
void* hook_for(const char* symbol, void* found, int cuda_version, Requery&& requery) {
  const auto kind = kind_for_proc(symbol, cuda_version);
  if (!kind || is_own_address(found)) return found;
  if (cuda_version > kCheckedThroughVersion) {
    // A cudaVersion newer than the table: hook only if the ABI is still the one we know, i.e.
    // the driver gives the same function as for the newest version the table was checked on.
    void* known = nullptr;
    if (!requery(kCheckedThroughVersion, &known) || known != found) return found;
  }
  void* hook = bind(*kind, found);
  return hook != nullptr ? hook : found;
}

}  // namespace

CUresult Entry<Kind::get_proc_address_v2>::body(Binding& b, const char* symbol, void** pfn,
                                                int cuda_version, cuuint64_t flags,
                                                CUdriverProcAddressQueryResult* status) {
  const auto real = b.fn<Fn>();
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult result = real(symbol, pfn, cuda_version, flags, status);
  Interposer::get().count_call(Kind::get_proc_address_v2, result == CUDA_SUCCESS);
  if (result != CUDA_SUCCESS || symbol == nullptr || pfn == nullptr || *pfn == nullptr ||
      (status != nullptr && *status != CU_GET_PROC_ADDRESS_SUCCESS)) {
    return result;
  }
  *pfn = hook_for(symbol, *pfn, cuda_version, [&](int version, void** out) {
    CUdriverProcAddressQueryResult again = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return real(symbol, out, version, flags, &again) == CUDA_SUCCESS &&
           again == CU_GET_PROC_ADDRESS_SUCCESS;
  });
  return result;
}

CUresult Entry<Kind::get_proc_address_v1>::body(Binding& b, const char* symbol, void** pfn,
                                                int cuda_version, cuuint64_t flags) {
  const auto real = b.fn<Fn>();
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult result = real(symbol, pfn, cuda_version, flags);
  Interposer::get().count_call(Kind::get_proc_address_v1, result == CUDA_SUCCESS);
  if (result != CUDA_SUCCESS || symbol == nullptr || pfn == nullptr || *pfn == nullptr) {
    return result;
  }
  *pfn = hook_for(symbol, *pfn, cuda_version, [&](int version, void** out) {
    return real(symbol, out, version, flags) == CUDA_SUCCESS;
  });
  return result;
}

}  // namespace tide::interpose

// Host twin of kernels/cuda/cast.cu.
#include <cstring>

#include "kernels/cast.h"
#include "kernels/host_kernel.h"

namespace tide::kernels {

void cast_host(const HostGrid& /*grid*/, void** params) {
  CastParams p;
  std::memcpy(&p, params[0], sizeof p);
  const auto* src = reinterpret_cast<const float*>(p.src);
  auto* dst = reinterpret_cast<std::uint16_t*>(p.dst);
  for (std::uint64_t i = 0; i < p.count; ++i) dst[i] = cast_element(src[i], p.dst_dtype);
}

}  // namespace tide::kernels

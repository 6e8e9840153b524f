#include "runtime/gradient_stats.h"

#include <cmath>
#include <mutex>

#include "driver/memory.h"
#include "kernels/dtype.h"
#include "kernels/thread_pool.h"

namespace tide::runtime {
namespace {

template <kernels::Dtype D>
void accumulate(const void* data, std::uint64_t begin, std::uint64_t end, GradientStats& out) {
  using Traits = kernels::DtypeTraits<D>;
  const auto* p = static_cast<const typename Traits::Storage*>(data);
  double sum = 0;
  std::uint64_t bad = 0;
  for (std::uint64_t i = begin; i < end; ++i) {
    const float x = Traits::to_float(p[i]);
    if (std::isfinite(x)) {
      sum += static_cast<double>(x) * x;
    } else {
      ++bad;
    }
  }
  out.sum_squares += sum;
  out.nonfinite += bad;
}

}  // namespace

GradientStats gradient_stats(const OptimizerState& state, const GradientOffload& offload) {
  offload.synchronize_all();
  // Gradients kept on the GPU only (gradients_on_gpu, not mirrored) are not in their pinned
  // buffers, which still hold an older step's: brought over first (the buffers are unused for
  // those subgroups).
  for (std::size_t s = 0; s < state.size(); ++s) {
    if (const CUdeviceptr g = offload.device_only_gradient(s); g != 0) {
      driver::copy_to_host(state.grad(s), g, state.params(s) * state.grad_bytes());
    }
  }
  std::vector<GradientPiece> pieces;
  pieces.reserve(state.size());
  for (std::size_t s = 0; s < state.size(); ++s) pieces.push_back({state.grad(s), state.params(s)});
  return gradient_stats(pieces, state.options().grad_dtype);
}

GradientStats gradient_stats(const std::vector<GradientPiece>& pieces, kernels::Dtype dtype) {
  kernels::ThreadPool& pool = kernels::cpu_pool();
  const unsigned threads = pool.size();
  GradientStats total;
  std::mutex mutex;
  for (const GradientPiece& piece : pieces) {
    const std::uint64_t n = piece.count;
    const void* grad = piece.data;
    pool.run(threads, [&](unsigned t) {
      const std::uint64_t begin = n * t / threads, end = n * (t + 1) / threads;
      GradientStats part;
      switch (dtype) {
        case kernels::Dtype::kFloat32:
          accumulate<kernels::Dtype::kFloat32>(grad, begin, end, part);
          break;
        case kernels::Dtype::kBFloat16:
          accumulate<kernels::Dtype::kBFloat16>(grad, begin, end, part);
          break;
        case kernels::Dtype::kFloat16:
          accumulate<kernels::Dtype::kFloat16>(grad, begin, end, part);
          break;
      }
      std::lock_guard lock(mutex);
      total.sum_squares += part.sum_squares;
      total.nonfinite += part.nonfinite;
    });
  }
  return total;
}

}  // namespace tide::runtime

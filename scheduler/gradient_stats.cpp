#include "scheduler/gradient_stats.h"

#include <cmath>
#include <mutex>

#include "kernels/dtype.h"
#include "kernels/thread_pool.h"

namespace tide::scheduler {
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
  kernels::ThreadPool& pool = kernels::cpu_pool();
  const unsigned threads = pool.size();
  GradientStats total;
  std::mutex mutex;
  for (std::size_t s = 0; s < state.size(); ++s) {
    const std::uint64_t n = state.params(s);
    const void* grad = state.grad(s);
    pool.run(threads, [&](unsigned t) {
      const std::uint64_t begin = n * t / threads, end = n * (t + 1) / threads;
      GradientStats part;
      switch (state.options().grad_dtype) {
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

}  // namespace tide::scheduler

// The CPU Adam step: validation, choice of instruction set, and the split over threads.
#include "kernels/cpu_adam.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/cpu_variant.h"
#include "kernels/thread_pool.h"

namespace tide::kernels {
namespace {

// Threads take the work in chunks of this many elements, so that a thread slowed down by other
// work on the machine does not hold the others up. 256 Ki elements are 1 MiB of each fp32
// buffer: wake-up and hand-out costs vanish next to that, and chunk edges fall on cache lines
// of any 64-byte-aligned buffer, so two threads never write the same line.
constexpr std::size_t kChunk = std::size_t{1} << 18;
// Quantized moments: a chunk is whole quantization blocks, so one thread owns each block.
static_assert(kChunk % kQuantBlock == 0);

bool is_dtype(Dtype d) {
  return d == Dtype::kFloat32 || d == Dtype::kBFloat16 || d == Dtype::kFloat16;
}

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("tide: " + message);
}

void require_aligned(const void* p, unsigned bytes, const char* name) {
  require(reinterpret_cast<std::uintptr_t>(p) % bytes == 0,
          std::string(name) + " is not aligned to its element size (" + std::to_string(bytes) +
              " bytes)");
}

const CpuKernels& kernels_for(const CpuAdamOptions& options) {
  return cpu_kernels(options.force_isa ? options.isa : default_cpu_isa());
}

// Runs body(begin, end) over [0, count) in chunks on up to options.threads threads.
template <typename Body>
void parallel_chunks(std::size_t count, const CpuAdamOptions& options, Body&& body) {
  const std::size_t chunks = (count + kChunk - 1) / kChunk;
  ThreadPool& pool = cpu_pool();
  const unsigned wanted = options.threads == 0 ? pool.size() : options.threads;
  const auto threads = static_cast<unsigned>(std::min<std::size_t>(wanted, chunks));
  if (threads <= 1) {
    if (count > 0) body(std::size_t{0}, count);
    return;
  }
  std::atomic<std::size_t> next{0};
  pool.run(threads, [&](unsigned) {
    for (std::size_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
         c = next.fetch_add(1, std::memory_order_relaxed)) {
      body(c * kChunk, std::min(count, (c + 1) * kChunk));
    }
  });
}

std::uint64_t count_nonfinite_with(const CpuKernels& k, const void* grad, Dtype dtype,
                                   std::size_t count, const CpuAdamOptions& options) {
  std::atomic<std::uint64_t> total{0};
  parallel_chunks(count, options, [&](std::size_t begin, std::size_t end) {
    total.fetch_add(k.count_nonfinite(grad, dtype, begin, end), std::memory_order_relaxed);
  });
  return total.load();
}

}  // namespace

void validate(const AdamSubgroup& s) {
  require(is_dtype(s.grad_dtype), "unknown gradient dtype");
  require(s.state_format == StateFormat::kDtype || s.state_format == StateFormat::kBlockQ8,
          "unknown moment format");
  const bool quantized = s.state_format == StateFormat::kBlockQ8;
  require(quantized || s.state_dtype == Dtype::kFloat32 || s.state_dtype == Dtype::kBFloat16,
          "moments must be fp32 or bf16");
  require(s.param_copy == nullptr || s.copy_dtype == Dtype::kBFloat16 ||
              s.copy_dtype == Dtype::kFloat16,
          "the weight copy must be bf16 or fp16");
  const bool bf16_master = s.master_dtype == Dtype::kBFloat16;
  require(s.master_dtype == Dtype::kFloat32 || bf16_master, "master weights must be fp32 or bf16");
  require(!bf16_master || !quantized,
          "bf16 master weights with 8-bit moments are not supported (use fp32 or bf16 moments)");
  require(!bf16_master || s.param_copy == nullptr,
          "bf16 master weights are the model's weights: no weight copy (param_copy must be null)");
  const bool stochastic = s.moment_rounding == MomentRounding::kStochastic;
  require(stochastic || s.moment_rounding == MomentRounding::kNearest, "unknown moment rounding");
  require(!stochastic || (!quantized && s.state_dtype == Dtype::kBFloat16),
          "stochastic rounding applies to bf16 moments only (fp32 moments are not rounded, 8-bit "
          "moments have their own rounding)");
  require(!stochastic || !bf16_master,
          "stochastic rounding of the moments is not supported with bf16 master weights");
  if (s.count == 0) return;
  require(s.grad != nullptr && s.exp_avg != nullptr && s.exp_avg_sq != nullptr,
          "null subgroup buffer (grad, param, exp_avg and exp_avg_sq are required)");
  require_aligned(s.grad, dtype_size(s.grad_dtype), "grad");
  if (bf16_master) {
    require(s.param_bf16 != nullptr && s.param_comp != nullptr,
            "null subgroup buffer (bf16 master weights need param_bf16 and param_comp)");
    require_aligned(s.param_bf16, 2, "param_bf16");
    require_aligned(s.param_comp, 2, "param_comp");
  } else {
    require(s.param != nullptr,
            "null subgroup buffer (grad, param, exp_avg and exp_avg_sq are required)");
    require_aligned(s.param, 4, "param");
  }
  if (quantized) {
    require(s.exp_avg_scale != nullptr && s.exp_avg_sq_scale != nullptr,
            "null scale buffer (8-bit moments need exp_avg_scale and exp_avg_sq_scale)");
    // A block never straddles subgroups (kernels/quant8.h): a subgroup at an offset of its
    // tensor that is not a multiple of the block shows as codes off the block boundary.
    for (const auto& [codes, name] :
         {std::pair{s.exp_avg, "exp_avg"}, std::pair{s.exp_avg_sq, "exp_avg_sq"}}) {
      require(reinterpret_cast<std::uintptr_t>(codes) % kQuantBlock == 0,
              std::string("8-bit ") + name + " codes do not start at a " +
                  std::to_string(kQuantBlock) +
                  "-byte boundary: a subgroup of quantized moments must start at a multiple of " +
                  std::to_string(kQuantBlock) + " elements (one quantization block) of its tensor");
    }
    require_aligned(s.exp_avg_scale, 4, "exp_avg_scale");
    require_aligned(s.exp_avg_sq_scale, 4, "exp_avg_sq_scale");
  } else {
    require_aligned(s.exp_avg, dtype_size(s.state_dtype), "exp_avg");
    require_aligned(s.exp_avg_sq, dtype_size(s.state_dtype), "exp_avg_sq");
  }
  if (s.param_copy != nullptr) require_aligned(s.param_copy, 2, "param_copy");
}

AdamResult cpu_adam_step(const AdamSubgroup& s, const AdamHyper& hyper,
                         const CpuAdamOptions& options) {
  validate(s);
  const AdamCoefficients terms = adam_coefficients(hyper);
  const CpuKernels& k = kernels_for(options);
  AdamResult result;
  if (options.skip_subgroup_on_nonfinite) {
    result.nonfinite = count_nonfinite_with(k, s.grad, s.grad_dtype, s.count, options);
    if (result.nonfinite != 0) {
      result.applied = false;
      return result;
    }
  }
  std::atomic<std::uint64_t> rejected{0};
  parallel_chunks(s.count, options, [&](std::size_t begin, std::size_t end) {
    rejected.fetch_add(k.adam(terms, s, begin, end), std::memory_order_relaxed);
  });
  result.nonfinite = rejected.load();
  return result;
}

std::uint64_t cpu_count_nonfinite(const void* grad, Dtype dtype, std::size_t count,
                                  const CpuAdamOptions& options) {
  require(is_dtype(dtype), "unknown dtype");
  if (count == 0) return 0;
  require(grad != nullptr, "null buffer");
  require_aligned(grad, dtype_size(dtype), "buffer");
  return count_nonfinite_with(kernels_for(options), grad, dtype, count, options);
}

void cpu_cast(const float* src, void* dst, Dtype dst_dtype, std::size_t count,
              const CpuAdamOptions& options) {
  require(dst_dtype == Dtype::kBFloat16 || dst_dtype == Dtype::kFloat16,
          "casts go to bf16 or fp16");
  if (count == 0) return;
  require(src != nullptr && dst != nullptr, "null buffer");
  require_aligned(src, 4, "source");
  require_aligned(dst, 2, "destination");
  const CpuKernels& k = kernels_for(options);
  parallel_chunks(count, options, [&](std::size_t begin, std::size_t end) {
    k.cast(src, dst, dst_dtype, begin, end);
  });
}

}  // namespace tide::kernels

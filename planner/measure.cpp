#include "planner/measure.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "allocator/pinned/arena.h"
#include "driver/context.h"
#include "driver/memory.h"
#include "driver/stream.h"
#include "kernels/adam_gpu.h"
#include "kernels/cpu_adam.h"
#include "kernels/dtype.h"
#include "planner/host_memory.h"

namespace tide::planner {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Pinned host buffers of one subgroup, released with the arena.
struct HostSubgroup {
  explicit HostSubgroup(allocator::pinned::PinnedArena& arena, std::uint64_t n)
      : arena_(arena), n_(n) {
    state = static_cast<float*>(arena.allocate(12 * n));
    grad = arena.allocate(2 * n);
    copy = arena.allocate(2 * n);
    std::memset(state, 0, 12 * n);
    std::memset(grad, 0, 2 * n);  // bf16 zeros: finite
    std::memset(copy, 0, 2 * n);
  }
  ~HostSubgroup() {
    arena_.deallocate(state, 12 * n_);
    arena_.deallocate(grad, 2 * n_);
    arena_.deallocate(copy, 2 * n_);
  }
  kernels::AdamSubgroup adam() const {
    kernels::AdamSubgroup s;
    s.grad = grad;
    s.param = state;
    s.exp_avg = state + n_;
    s.exp_avg_sq = state + 2 * n_;
    s.param_copy = copy;
    s.count = n_;
    s.grad_dtype = kernels::Dtype::kBFloat16;
    return s;
  }
  allocator::pinned::PinnedArena& arena_;
  std::uint64_t n_;
  float* state;
  void* grad;
  void* copy;
};

// Pinned buffers of one subgroup in a state format (nullopt: fp32 state) with bf16 gradients of
// varied values, fp32 or bf16 master weights likewise, zero moments, and a bf16 weight copy (none
// with bf16 master weights: they are the model's weights). Released with the arena.
class FormatSubgroup {
 public:
  FormatSubgroup(allocator::pinned::PinnedArena& arena, std::uint64_t n,
                 std::optional<UpdateFormat> format)
      : arena_(arena) {
    s_.count = n;
    s_.grad_dtype = kernels::Dtype::kBFloat16;
    auto* grad = static_cast<std::uint16_t*>(take(2 * n));
    for (std::uint64_t i = 0; i < n; ++i) {
      grad[i] = kernels::float_to_bf16(1e-3f * static_cast<float>(static_cast<int>(i % 97) - 48));
    }
    s_.grad = grad;
    auto weight = [](std::uint64_t i) {
      return 1e-2f * static_cast<float>(static_cast<int>(i % 31) - 15);
    };
    const bool bf16_master =
        format == UpdateFormat::bf16_master || format == UpdateFormat::bf16_master_bf16_moments;
    if (bf16_master) {
      s_.master_dtype = kernels::Dtype::kBFloat16;
      s_.param_bf16 = static_cast<std::uint16_t*>(take(2 * n));
      s_.param_comp = static_cast<std::uint16_t*>(take(2 * n));
      for (std::uint64_t i = 0; i < n; ++i) s_.param_bf16[i] = kernels::float_to_bf16(weight(i));
    } else {
      s_.param = static_cast<float*>(take(4 * n));
      for (std::uint64_t i = 0; i < n; ++i) s_.param[i] = weight(i);
      s_.param_copy = take(2 * n);
    }
    if (format == UpdateFormat::q8_moments) {
      s_.state_format = kernels::StateFormat::kBlockQ8;
      s_.exp_avg = take(n, kernels::kQuantBlock);
      s_.exp_avg_sq = take(n, kernels::kQuantBlock);
      s_.exp_avg_scale = static_cast<float*>(take(4 * kernels::quant_blocks(n)));
      s_.exp_avg_sq_scale = static_cast<float*>(take(4 * kernels::quant_blocks(n)));
    } else {
      const bool bf16 =
          format == UpdateFormat::bf16_moments || format == UpdateFormat::bf16_master_bf16_moments;
      s_.state_dtype = bf16 ? kernels::Dtype::kBFloat16 : kernels::Dtype::kFloat32;
      s_.exp_avg = take((bf16 ? 2 : 4) * n);
      s_.exp_avg_sq = take((bf16 ? 2 : 4) * n);
    }
    kernels::validate(s_);
  }
  ~FormatSubgroup() {
    for (const auto& [p, bytes] : buffers_) arena_.deallocate(p, bytes);
  }
  FormatSubgroup(const FormatSubgroup&) = delete;
  FormatSubgroup& operator=(const FormatSubgroup&) = delete;
  const kernels::AdamSubgroup& adam() const { return s_; }

 private:
  void* take(std::size_t bytes, std::size_t alignment = 0) {
    void* p = arena_.allocate(bytes, alignment);
    buffers_.emplace_back(p, bytes);
    std::memset(p, 0, bytes);
    return p;
  }
  allocator::pinned::PinnedArena& arena_;
  std::vector<std::pair<void*, std::size_t>> buffers_;
  kernels::AdamSubgroup s_;
};

// Seconds of CPU time the calling thread spent in f().
template <typename F>
double thread_cpu_seconds(F&& f) {
  timespec a{}, b{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
  f();
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
  return static_cast<double>(b.tv_sec - a.tv_sec) +
         1e-9 * static_cast<double>(b.tv_nsec - a.tv_nsec);
}

template <typename F>
double best_of(int repeats, F&& once) {
  double best = 1e300;
  for (int i = 0; i < repeats; ++i) best = std::min(best, once());
  return best;
}

// f() while copies run back to back in both directions, from a thread of their own: the load the
// CPU update shares host memory bandwidth with in an update phase. The `bytes` at `host` are split
// in two: host→GPU copies read the first half (into `d_in`, on s1) while GPU→host copies write the
// second (from `d_out`, on s2), so that the two never touch the same bytes at once. An error of
// the copies is thrown once f() returned. `copied`, if given, counts the bytes the copies moved
// (both directions, each time both are done).
template <typename F>
auto while_copying(void* host, driver::DeviceBuffer& d_in, driver::DeviceBuffer& d_out,
                   std::uint64_t bytes, driver::Stream& s1, driver::Stream& s2, F&& f,
                   std::atomic<std::uint64_t>* copied = nullptr) {
  const std::uint64_t half = bytes / 2;
  auto* in = static_cast<std::byte*>(host);
  std::byte* out = in + half;
  std::atomic<bool> stop{false};
  std::exception_ptr copy_error;
  const CUcontext context = driver::current_context();  // the streams'
  std::thread copier([&] {
    try {
      driver::bind_this_thread(context);
      while (!stop.load()) {
        driver::copy_to_device_async(d_in.get(), in, half, s1);
        driver::copy_to_host_async(out, d_out.get(), half, s2);
        s1.synchronize();
        s2.synchronize();
        if (copied != nullptr) copied->fetch_add(2 * half);
      }
    } catch (...) {
      copy_error = std::current_exception();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  try {
    auto result = f();
    stop = true;
    copier.join();
    if (copy_error) std::rethrow_exception(copy_error);
    return result;
  } catch (...) {
    if (!stop.exchange(true)) copier.join();
    throw;
  }
}

}  // namespace

CpuCost measure_cpu_cost(std::uint64_t params, const kernels::CpuAdamOptions& options,
                         int repeats) {
  if (params < 1024 || repeats < 1 || options.threads != 1) {
    throw std::invalid_argument(
        "tide: measure_cpu_cost: at least 1024 parameters, one repeat, and one thread");
  }
  allocator::pinned::PinnedArena arena;
  HostSubgroup a(arena, params), b(arena, params);
  const std::uint64_t bytes = 12 * params;
  const kernels::AdamHyper hyper;
  CpuCost c;
  for (int i = 0; i <= repeats; ++i) {  // the first warms the pages
    const double update =
        thread_cpu_seconds([&] { kernels::cpu_adam_step(a.adam(), hyper, options); });
    const double move = thread_cpu_seconds([&] { std::memcpy(b.state, a.state, bytes); });
    if (i == 0) continue;
    c.update = std::max(c.update, static_cast<double>(params) / std::max(update, 1e-9));
    c.memcpy = std::max(c.memcpy, static_cast<double>(bytes) / std::max(move, 1e-9));
  }
  return c;
}

RankRates measure_rank_rates(std::uint64_t params, int repeats,
                             const std::function<void()>& ready) {
  if (params < 1024 || repeats < 1) {
    throw std::invalid_argument("tide: measure_rank_rates: at least 1024 parameters, one repeat");
  }
  allocator::pinned::PinnedArena arena;
  HostSubgroup a(arena, params), b(arena, params);
  const std::uint64_t bytes = 12 * params;
  const kernels::AdamHyper hyper;
  auto update = [&] {
    const Clock::time_point t = Clock::now();
    kernels::cpu_adam_step(a.adam(), hyper);
    return std::max(1e-9, seconds_since(t));
  };
  auto move = [&] {
    const Clock::time_point t = Clock::now();
    std::memcpy(b.state, a.state, bytes);
    return std::max(1e-9, seconds_since(t));
  };
  update();  // the first touches the pages
  move();
  if (ready) ready();
  RankRates r;
  r.cpu_update = static_cast<double>(params) / best_of(repeats, update);
  r.memory = static_cast<double>(bytes) / best_of(repeats, move);
  return r;
}

CpuFormatRates measure_cpu_formats(std::uint64_t params, int repeats,
                                   const kernels::CpuAdamOptions& options,
                                   const std::function<void()>& ready) {
  if (params < 1024 || repeats < 1) {
    throw std::invalid_argument("tide: measure_cpu_formats: at least 1024 parameters, one repeat");
  }
  allocator::pinned::PinnedArena arena;
  // fp32 state first, then the formats in UpdateFormat order.
  std::vector<std::unique_ptr<FormatSubgroup>> subgroups;
  subgroups.push_back(std::make_unique<FormatSubgroup>(arena, params, std::nullopt));
  for (const UpdateFormatInfo& info : kUpdateFormats) {
    subgroups.push_back(std::make_unique<FormatSubgroup>(arena, params, info.format));
  }
  const kernels::AdamHyper hyper;
  auto once = [&](const FormatSubgroup& s) {
    const Clock::time_point t = Clock::now();
    kernels::cpu_adam_step(s.adam(), hyper, options);
    return std::max(1e-9, seconds_since(t));
  };
  for (const auto& s : subgroups) once(*s);  // warm: pages, the thread pool
  if (ready) ready();
  std::vector<double> best(subgroups.size(), 1e300);
  for (int round = 0; round < repeats; ++round) {
    for (std::size_t i = 0; i < subgroups.size(); ++i) {
      best[i] = std::min(best[i], once(*subgroups[i]));
    }
  }
  const double nd = static_cast<double>(params);
  CpuFormatRates out;
  out.fp32 = nd / best[0];
  for (std::size_t i = 0; i < kUpdateFormatCount; ++i) out.format[i] = nd / best[i + 1];
  return out;
}

CpuFormatRates measure_cpu_formats_while_copying(std::uint64_t params, int repeats,
                                                 const kernels::CpuAdamOptions& options) {
  if (params < 1024 || repeats < 1) {
    throw std::invalid_argument(
        "tide: measure_cpu_formats_while_copying: at least 1024 parameters, one repeat");
  }
  const std::uint64_t bytes = 12 * params;
  allocator::pinned::PinnedArena arena;
  HostSubgroup source(arena, params);
  driver::DeviceBuffer d_in(bytes), d_out(bytes);
  driver::Stream s1, s2;
  return while_copying(source.state, d_in, d_out, bytes, s1, s2,
                       [&] { return measure_cpu_formats(params, repeats, options); });
}

CpuFormatRates slowest(std::span<const CpuFormatRates> ranks) {
  if (ranks.empty()) throw std::invalid_argument("tide: CPU update by format: no measurements");
  CpuFormatRates out = ranks.front();
  for (const CpuFormatRates& r : ranks) {
    out.fp32 = std::min(out.fp32, r.fp32);
    for (std::size_t i = 0; i < kUpdateFormatCount; ++i) {
      out.format[i] = std::min(out.format[i], r.format[i]);
    }
  }
  return out;
}

namespace {

// For each format, its rate over fp32 state's in `s`, checked.
std::array<double, kUpdateFormatCount> ratios(const CpuFormatRates& s, const char* when) {
  std::array<double, kUpdateFormatCount> out{};
  for (const UpdateFormatInfo& info : kUpdateFormats) {
    const double factor = s.format[static_cast<std::size_t>(info.format)] / s.fp32;
    if (!plausible_cpu_update_factor(factor)) {
      throw std::runtime_error("tide: the CPU update with " + std::string(info.description) + when +
                               " measured " + std::to_string(factor) +
                               "x fp32 state's, outside the plausible " +
                               std::to_string(kMinCpuUpdateFactor) + " to " +
                               std::to_string(kMaxCpuUpdateFactor) + ": measure again");
    }
    out[static_cast<std::size_t>(info.format)] = factor;
  }
  return out;
}

}  // namespace

CpuUpdateFactors cpu_update_factors(std::span<const CpuFormatRates> ranks,
                                    const std::optional<CpuFormatRates>& contended) {
  const CpuFormatRates alone = slowest(ranks);
  CpuUpdateFactors factors;
  factors.factor = ratios(alone, "");
  if (contended) {
    // A rate while copying is never above the same rate alone (as measure_rates'
    // cpu_update_contended): on a busy machine a quiet moment must not make the copies look free.
    CpuFormatRates c = *contended;
    c.fp32 = std::min(c.fp32, alone.fp32);
    for (std::size_t i = 0; i < kUpdateFormatCount; ++i)
      c.format[i] = std::min(c.format[i], alone.format[i]);
    factors.contended = ratios(c, " while copies ran");
  }
  return factors;
}

kernels::CpuAdamOptions cpu_adam_options(const MeasureOptions& options) {
  kernels::CpuAdamOptions cpu_options{.threads = options.cpu_threads};
  if (options.cpu_isa) {
    cpu_options.force_isa = true;
    cpu_options.isa = *options.cpu_isa;
  }
  return cpu_options;
}

Rates measure_rates(const MeasureOptions& options) {
  if (options.params < 1024 || options.repeats < 1) {
    throw std::invalid_argument("tide: measure_rates: at least 1024 parameters and one repeat");
  }
  const std::uint64_t n = options.params;
  const std::uint64_t bytes = 12 * n;
  const double nd = static_cast<double>(n), bytesd = static_cast<double>(bytes);
  allocator::pinned::PinnedArena arena;
  HostSubgroup a(arena, n), b(arena, n);
  driver::DeviceBuffer d_in(bytes), d_out(bytes), d_grad(2 * n), d_copy(2 * n), counters(8);
  driver::Stream s1, s2;
  kernels::AdamHyper hyper;
  Rates r;
  auto report = [&](RateKind kind) {
    if (options.progress) options.progress(kind, rate_of(r, kind));
  };

  const kernels::CpuAdamOptions cpu_options = cpu_adam_options(options);
  auto cpu_once = [&] {
    const auto t0 = Clock::now();
    kernels::cpu_adam_step(a.adam(), hyper, cpu_options);
    return seconds_since(t0);
  };
  cpu_once();  // warm: pages, the thread pool
  r.cpu_update = nd / best_of(options.repeats, cpu_once);
  report(RateKind::cpu_update);

  auto copy_once = [&](bool h2d, bool d2h) {
    const auto t0 = Clock::now();
    if (h2d) driver::copy_to_device_async(d_in.get(), b.state, bytes, s1);
    if (d2h) driver::copy_to_host_async(a.state, d_out.get(), bytes, s2);
    s1.synchronize();
    s2.synchronize();
    return seconds_since(t0);
  };
  copy_once(true, true);
  r.h2d = bytesd / best_of(options.repeats, [&] { return copy_once(true, false); });
  report(RateKind::h2d);
  r.d2h = bytesd / best_of(options.repeats, [&] { return copy_once(false, true); });
  report(RateKind::d2h);
  // Both at once: each direction's rate is its bytes over the time both took.
  const double duplex = best_of(options.repeats, [&] { return copy_once(true, true); });
  r.h2d_duplex = std::min(r.h2d, bytesd / duplex);
  r.d2h_duplex = std::min(r.d2h, bytesd / duplex);
  report(RateKind::h2d_duplex);
  report(RateKind::d2h_duplex);

  // The CPU update while copies of another subgroup's state run in both directions.
  const double contended = while_copying(b.state, d_in, d_out, bytes, s1, s2,
                                         [&] { return best_of(options.repeats, cpu_once); });
  r.cpu_update_contended = std::min(r.cpu_update, nd / contended);
  report(RateKind::cpu_update_contended);

  // Host memory: the Adam-pattern pass alone, then while copies run in both directions, its
  // bytes and the copies' over the pass's time (no higher than alone, as the CPU update).
  {
    HostMemoryPass pass(options.host_memory_bytes, options.cpu_threads);
    pass.run();  // warm
    r.host_memory = pass.bytes() / best_of(options.repeats, [&] { return pass.run(); });
    report(RateKind::host_memory);
    std::atomic<std::uint64_t> copied{0};
    const double busiest = while_copying(
        b.state, d_in, d_out, bytes, s1, s2,
        [&] {
          double best = 0;
          for (int i = 0; i < options.repeats; ++i) {
            const std::uint64_t before = copied.load();
            const double seconds = pass.run();
            const auto moved = static_cast<double>(copied.load() - before);
            best = std::max(best, (pass.bytes() + moved) / seconds);
          }
          return best;
        },
        &copied);
    r.host_memory_contended = std::min(r.host_memory, busiest);
    report(RateKind::host_memory_contended);
  }

  // The fused kernel over the subgroup in device memory.
  {
    driver::copy_to_device(d_in.get(), a.state, bytes);
    driver::copy_to_device(d_grad.get(), a.grad, 2 * n);
    const kernels::AdamGpu adam;
    kernels::AdamGpuSubgroup g;
    g.grad = d_grad.get();
    g.param = d_in.get();
    g.exp_avg = d_in.get() + 4 * n;
    g.exp_avg_sq = d_in.get() + 8 * n;
    g.param_copy = d_copy.get();
    g.count = n;
    auto gpu_once = [&] {
      driver::Event start(driver::Event::Timing::kEnabled), end(driver::Event::Timing::kEnabled);
      start.record(s1);
      adam.step({&g, 1}, kernels::AdamGpuDtypes{}, hyper, counters.get(), s1);
      end.record(s1);
      end.synchronize();
      return std::max(1e-9, end.elapsed_ms(start) / 1e3);
    };
    gpu_once();
    r.gpu_update = nd / best_of(options.repeats, gpu_once);
    report(RateKind::gpu_update);
  }
  validate(r, "measured");
  return r;
}

}  // namespace tide::planner

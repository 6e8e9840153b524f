// bench_cpu_adam_q8: the CPU Adam step with 8-bit block-wise moments (kernels/quant8.h), and with
// bf16 master weights (kernels/adam_math.h, adam_master_element), against the same step with fp32
// state, and all against the host's memory bandwidth in the bytes each actually moves
// (`make bench BENCH=cpu_adam_q8`). One JSON line per case, after one with the
// bandwidth (build/bin/tide_membw, same threads, run first).
//
// Both cases are the offloaded step: bf16 gradients in, fp32 master weights updated, bf16 weights
// out. Bytes per parameter: fp32 moments 28 (2 gradient, 4 + 4 weight, 8 + 8 moments, 2 copy);
// 8-bit moments 16.06 (2 gradient, 4 + 4 weight, 2 + 2 codes, 2 copy, 2 · 8 / 256 scales).
// bf16 master weights have no copy (the bf16 weight is the model's): 26 with fp32 moments
// (2 gradient, 2 + 2 weight, 2 + 2 compensation, 8 + 8 moments) and 18 with bf16 moments.
// The 8-bit case runs with each instruction set forced (scalar, AVX2, AVX-512 where the CPU has
// them) and the fp32 case with the default one. Repetitions go round-robin over the cases (so
// that load that comes and goes hits all alike); `seconds` is the best, `median_seconds` the
// median, and the 8-bit lines give their speed-up over the fp32 case, best over best and paired
// (the median over repetitions of fp32 time over 8-bit time in the same repetition).
//
// usage: bench_cpu_adam_q8 [--params N] [--reps R]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/membw_runner.h"
#include "kernels/cpu_adam.h"
#include "kernels/dtype.h"
#include "kernels/quant8.h"
#include "kernels/thread_pool.h"

namespace {

using tide::kernels::AdamHyper;
using tide::kernels::AdamSubgroup;
using tide::kernels::CpuAdamOptions;
using tide::kernels::CpuIsa;
using tide::kernels::Dtype;

template <typename T>
struct Freer {
  void operator()(T* p) const { std::free(p); }
};
template <typename T>
using Array = std::unique_ptr<T[], Freer<T>>;

// Page-aligned (so 256-byte aligned, as 8-bit codes must be), touched.
template <typename T>
Array<T> allocate(std::size_t n) {
  void* p = std::aligned_alloc(4096, (n * sizeof(T) + 4095) / 4096 * 4096);
  if (p == nullptr) {
    std::fprintf(stderr, "bench_cpu_adam_q8: out of memory\n");
    std::exit(1);
  }
  std::memset(p, 0, n * sizeof(T));
  return Array<T>(static_cast<T*>(p));
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// tide_membw's "gbps" (next to this program), or 0 if it cannot be run.
double measured_bandwidth(unsigned threads, std::string& line) {
  return tide::bench::run_membw("--threads " + std::to_string(threads), line);
}

enum class Format { kFp32, kQ8, kBf16Master, kBf16MasterBf16State };

double bytes_per_param(Format f) {
  switch (f) {
    case Format::kQ8:
      return 16.0 + 2.0 * 8.0 / static_cast<double>(tide::kernels::kQuantBlock);
    case Format::kBf16Master:
      return 26.0;
    case Format::kBf16MasterBf16State:
      return 18.0;
    case Format::kFp32:
      break;
  }
  return 28.0;
}

struct Case {
  std::string name;
  Format format;
  CpuIsa isa;
  bool force;
  std::vector<double> seconds;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t params = 100'000'000;
  int reps = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--params") == 0) params = std::strtoull(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
  }
  const unsigned threads = tide::kernels::cpu_pool().size();
  std::string membw;
  const double gbps = measured_bandwidth(threads, membw);
  std::printf("{\"bench\":\"cpu_adam_q8\",\"impl\":\"bandwidth\",\"threads\":%u,\"gbps\":%.2f}\n",
              threads, gbps);
  std::fflush(stdout);

  const std::size_t blocks = tide::kernels::quant_blocks(params);
  auto grad = allocate<std::uint16_t>(params);
  auto param = allocate<float>(params);
  auto copy = allocate<std::uint16_t>(params);
  auto m32 = allocate<float>(params);
  auto v32 = allocate<float>(params);
  auto m8 = allocate<std::uint8_t>(params);
  auto v8 = allocate<std::uint8_t>(params);
  auto sm = allocate<float>(blocks);
  auto sv = allocate<float>(blocks);
  auto w16 = allocate<std::uint16_t>(params);
  auto c16 = allocate<std::uint16_t>(params);
  auto m16 = allocate<std::uint16_t>(params);
  auto v16 = allocate<std::uint16_t>(params);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::size_t i = 0; i < params; ++i) {
    grad[i] = tide::kernels::float_to_bf16(normal(rng));
    param[i] = normal(rng);
    m32[i] = 0.1f * normal(rng);
    v32[i] = 1e-3f * (1.0f + std::abs(normal(rng)));
    w16[i] = tide::kernels::float_to_bf16(param[i]);
    m16[i] = tide::kernels::float_to_bf16(m32[i]);
    v16[i] = tide::kernels::float_to_bf16(v32[i]);
    m8[i] = static_cast<std::uint8_t>(rng());
    v8[i] = static_cast<std::uint8_t>(rng());
  }
  for (std::size_t b = 0; b < blocks; ++b) sm[b] = 0.3f, sv[b] = 3e-3f;

  std::vector<Case> cases{{"adam_fp32_state", Format::kFp32, CpuIsa::kScalar, false, {}}};
  for (CpuIsa isa : tide::kernels::kCpuIsas) {
    if (tide::kernels::cpu_supports(isa)) {
      cases.push_back({"adam_8bit_state", Format::kQ8, isa, true, {}});
      cases.push_back({"adam_bf16_master", Format::kBf16Master, isa, true, {}});
    }
  }
  cases.push_back(
      {"adam_bf16_master_bf16_state", Format::kBf16MasterBf16State, CpuIsa::kScalar, false, {}});
  AdamHyper h;
  h.weight_decay = 0.01;
  for (int r = 0; r <= reps; ++r) {  // repetition 0 warms up
    for (Case& c : cases) {
      AdamSubgroup s;
      s.grad = grad.get();
      s.param = param.get();
      s.param_copy = copy.get();
      s.count = params;
      s.grad_dtype = Dtype::kBFloat16;
      s.copy_dtype = Dtype::kBFloat16;
      if (c.format == Format::kBf16Master || c.format == Format::kBf16MasterBf16State) {
        s.master_dtype = Dtype::kBFloat16;
        s.param = nullptr;
        s.param_copy = nullptr;
        s.param_bf16 = w16.get();
        s.param_comp = c16.get();
      }
      if (c.format == Format::kBf16MasterBf16State) {
        s.state_dtype = Dtype::kBFloat16;
        s.exp_avg = m16.get();
        s.exp_avg_sq = v16.get();
      } else if (c.format == Format::kQ8) {
        s.state_format = tide::kernels::StateFormat::kBlockQ8;
        s.exp_avg = m8.get();
        s.exp_avg_sq = v8.get();
        s.exp_avg_scale = sm.get();
        s.exp_avg_sq_scale = sv.get();
      } else {
        s.exp_avg = m32.get();
        s.exp_avg_sq = v32.get();
      }
      CpuAdamOptions o;
      o.force_isa = c.force;
      o.isa = c.isa;
      h.step = r + 1;
      const double t0 = now();
      tide::kernels::cpu_adam_step(s, h, o);
      const double t = now() - t0;
      if (r > 0) c.seconds.push_back(t);
    }
  }
  const Case& base = cases.front();
  const double base_best = *std::min_element(base.seconds.begin(), base.seconds.end());
  for (const Case& c : cases) {
    const double best = *std::min_element(c.seconds.begin(), c.seconds.end());
    const double bytes = bytes_per_param(c.format);
    const double rate = static_cast<double>(params) / best;
    std::vector<double> paired;
    for (std::size_t r = 0; r < c.seconds.size(); ++r) {
      paired.push_back(base.seconds[r] / c.seconds[r]);
    }
    std::printf(
        "{\"bench\":\"cpu_adam_q8\",\"case\":\"%s\",\"isa\":\"%s\",\"params\":%zu,\"threads\":%u,"
        "\"seconds\":%.5f,\"median_seconds\":%.5f,\"params_per_s\":%.4g,\"bytes_per_param\":%.2f,"
        "\"bound_params_per_s\":%.4g,\"fraction_of_bandwidth\":%.3f,\"speedup_over_fp32_state\":"
        "%.3f,\"paired_speedup_over_fp32_state\":%.3f}\n",
        c.name.c_str(),
        std::string(c.force ? tide::kernels::isa_name(c.isa)
                            : tide::kernels::isa_name(tide::kernels::default_cpu_isa()))
            .c_str(),
        params, threads, best, median(c.seconds), rate, bytes, gbps * 1e9 / bytes,
        gbps > 0 ? rate * bytes / (gbps * 1e9) : 0.0, base_best / best, median(paired));
  }
  return 0;
}

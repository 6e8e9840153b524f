// Shared pieces of the executor's tests: a model whose parameters live in (stand-in) device
// memory, its optimizer state, gradients produced on the device, and the reference update (the
// CPU kernel run directly on a copy of the state).
#pragma once

#include <gtest/gtest.h>

#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "allocator/device/caching_allocator.h"
#include "allocator/memory_resource.h"
#include "driver/context.h"
#include "driver/memory.h"
#include "driver/stream.h"
#include "kernels/adam_kernel.h"
#include "kernels/cpu_adam.h"
#include "kernels/dtype.h"
#include "runtime/executor.h"
#include "runtime/optimizer_state.h"
#include "tests/allocator/device_standin.h"

namespace tide::runtime::testing {

using kernels::Dtype;

inline float value_at(std::uint64_t seed, std::uint64_t i, float scale) {
  std::uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull ^ (i * 0xBF58476D1CE4E5B9ull);
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return scale * (static_cast<float>(x % 20001) / 10000.0f - 1.0f);
}

// Element e of a moment buffer of `dtype` (fp32, or bf16 bit patterns), as a float.
inline float moment_at(const void* m, Dtype dtype, std::uint64_t e) {
  if (dtype == Dtype::kFloat32) return static_cast<const float*>(m)[e];
  return kernels::bf16_to_float(static_cast<const std::uint16_t*>(m)[e]);
}
inline void set_moment(void* m, Dtype dtype, std::uint64_t e, float value) {
  if (dtype == Dtype::kFloat32) {
    static_cast<float*>(m)[e] = value;
  } else {
    static_cast<std::uint16_t*>(m)[e] = kernels::float_to_bf16(value);
  }
}

// A model of `sizes` subgroups; subgroup i is split into `slices_of(i)` parameter tensors.
struct Model {
  // `init` false: zero state (timing tests, where the values do not matter). `state_dtype`: the
  // moments' dtype; `format` kBlockQ8: 8-bit moments instead (codes and scales from the seed).
  // `slice_gap`: elements between a subgroup's tensors in device memory (the p-th starts p gaps
  // after its offset), so that they need not sit at the state's offsets modulo anything.
  Model(std::vector<std::uint64_t> sizes, std::size_t split_every = 0, std::size_t pieces = 3,
        bool init = true, Dtype state_dtype = Dtype::kFloat32,
        kernels::StateFormat format = kernels::StateFormat::kDtype, std::uint64_t slice_gap = 0)
      : sizes_(std::move(sizes)) {
    std::vector<SubgroupSpec> specs(sizes_.size());
    for (std::size_t i = 0; i < sizes_.size(); ++i) {
      const std::uint64_t n = sizes_[i];
      params.emplace_back((n + pieces * slice_gap) * 2);
      grads.emplace_back(n * 2);
      specs[i].params = n;
      const std::size_t k = (split_every && i % split_every == 0 && n >= pieces) ? pieces : 1;
      for (std::size_t p = 0; p < k; ++p) {
        const std::uint64_t begin = n * p / k, end = n * (p + 1) / k;
        specs[i].slices.push_back(
            ParamSlice{begin, end - begin, params[i].get() + 2 * (begin + p * slice_gap)});
      }
    }
    StateOptions options;
    options.state_dtype = state_dtype;
    options.state_format = format;
    state = std::make_unique<OptimizerState>(std::move(specs), options);
    for (std::size_t i = 0; init && i < sizes_.size(); ++i) {
      for (std::uint64_t b = 0; state->quantized() && b < kernels::quant_blocks(sizes_[i]); ++b) {
        state->exp_avg_scale(i)[b] = std::abs(value_at(i + 300, b, 0.01f));
        state->exp_avg_sq_scale(i)[b] = std::abs(value_at(i + 400, b, 0.001f));
      }
      for (std::uint64_t e = 0; e < sizes_[i]; ++e) {
        state->param(i)[e] = value_at(i, e, 1.0f);
        if (state->quantized()) {
          static_cast<std::uint8_t*>(state->exp_avg(i))[e] =
              static_cast<std::uint8_t>(value_at(i + 100, e, 127.0f) + 128.0f);
          static_cast<std::uint8_t*>(state->exp_avg_sq(i))[e] =
              static_cast<std::uint8_t>(value_at(i + 200, e, 127.0f) + 128.0f);
          continue;
        }
        set_moment(state->exp_avg(i), state_dtype, e, value_at(i + 100, e, 0.01f));
        set_moment(state->exp_avg_sq(i), state_dtype, e, std::abs(value_at(i + 200, e, 0.001f)));
      }
    }
  }

  // Gradients of step `step` written to device memory (as the backward pass would produce them).
  std::vector<std::vector<std::uint16_t>> make_gradients(int step) {
    std::vector<std::vector<std::uint16_t>> g(sizes_.size());
    for (std::size_t i = 0; i < sizes_.size(); ++i) {
      g[i].resize(sizes_[i]);
      for (std::uint64_t e = 0; e < sizes_[i]; ++e) {
        g[i][e] = kernels::float_to_bf16(value_at(1000 * step + i, e, 0.5f));
      }
      driver::copy_to_device(grads[i].get(), g[i].data(), sizes_[i] * 2);
    }
    return g;
  }

  // Offloads every subgroup's device gradient, in two pieces each (as two tensors would).
  void offload_all(Executor& executor, CUstream producer = nullptr) {
    for (std::size_t i = 0; i < sizes_.size(); ++i) {
      const std::uint64_t n = sizes_[i], half = n / 2;
      if (half) executor.offload().offload(i, 0, grads[i].get(), half, Dtype::kBFloat16, producer);
      executor.offload().offload(i, half, grads[i].get() + 2 * half, n - half, Dtype::kBFloat16,
                                 producer);
    }
  }

  // Subgroup i's weights as the model holds them, slice by slice.
  std::vector<std::uint16_t> device_params(std::size_t i) const {
    std::vector<std::uint16_t> out(sizes_[i]);
    for (const ParamSlice& slice : state->spec(i).slices) {
      driver::copy_to_host(out.data() + slice.offset, slice.device_ptr, slice.count * 2);
    }
    return out;
  }

  std::vector<std::uint64_t> sizes_;
  std::vector<driver::DeviceBuffer> params;  // bf16 model parameters
  std::vector<driver::DeviceBuffer> grads;   // bf16 gradients, as backward leaves them
  std::unique_ptr<OptimizerState> state;
};

// The reference: the CPU kernel run directly, subgroup by subgroup, on host copies (the moments
// as raw bytes of the state's dtype; 8-bit moments' codes at a kQuantBlock-byte boundary of their
// vectors, `skip` bytes in, and their scales).
struct Reference {
  explicit Reference(const OptimizerState& s)
      : state_dtype(s.options().state_dtype),
        quantized(s.quantized()),
        bf16_master(s.bf16_master()) {
    for (std::size_t i = 0; i < s.size(); ++i) {
      const std::uint64_t n = s.params(i);
      const auto* mb = static_cast<const char*>(s.exp_avg(i));
      const auto* vb = static_cast<const char*>(s.exp_avg_sq(i));
      // The slot's first 4n bytes: the fp32 master, or bf16 weights then their compensation.
      std::memcpy(p.emplace_back(n).data(), s.param(i), 4 * n);
      const std::size_t pad = quantized ? kernels::kQuantBlock : 0;
      for (auto [out, from] : {std::pair{&m, mb}, std::pair{&v, vb}}) {
        std::vector<char>& bytes = out->emplace_back(n * s.moment_bytes() + pad);
        const std::size_t skip =
            pad == 0 ? 0 : (pad - reinterpret_cast<std::uintptr_t>(bytes.data()) % pad) % pad;
        std::copy(from, from + n * s.moment_bytes(), bytes.data() + skip);
        (out == &m ? skip_m : skip_v).push_back(skip);
      }
      if (quantized) {
        const std::uint64_t blocks = kernels::quant_blocks(n);
        sm.emplace_back(s.exp_avg_scale(i), s.exp_avg_scale(i) + blocks);
        sv.emplace_back(s.exp_avg_sq_scale(i), s.exp_avg_sq_scale(i) + blocks);
      }
      copy.emplace_back(n);
    }
  }
  std::uint64_t step(const std::vector<std::vector<std::uint16_t>>& grads,
                     const kernels::AdamHyper& hyper) {
    std::uint64_t nonfinite = 0;
    for (std::size_t i = 0; i < p.size(); ++i) {
      kernels::AdamSubgroup sub;
      sub.grad = grads[i].data();
      const std::uint64_t n = p[i].size();
      if (bf16_master) {
        sub.master_dtype = Dtype::kBFloat16;
        sub.param_bf16 = reinterpret_cast<std::uint16_t*>(p[i].data());
        sub.param_comp = sub.param_bf16 + n;
      } else {
        sub.param = p[i].data();
        sub.param_copy = copy[i].data();
      }
      sub.exp_avg = m[i].data() + skip_m[i];
      sub.exp_avg_sq = v[i].data() + skip_v[i];
      if (quantized) {
        sub.state_format = kernels::StateFormat::kBlockQ8;
        sub.exp_avg_scale = sm[i].data();
        sub.exp_avg_sq_scale = sv[i].data();
      }
      sub.count = n;
      sub.grad_dtype = Dtype::kBFloat16;
      sub.state_dtype = state_dtype;
      nonfinite += kernels::cpu_adam_step(sub, hyper).nonfinite;
      // bf16 master weights are the model's parameters themselves.
      if (bf16_master) std::memcpy(copy[i].data(), sub.param_bf16, 2 * n);
    }
    return nonfinite;
  }
  Dtype state_dtype;
  bool quantized;
  bool bf16_master;
  std::vector<std::vector<float>> p;
  std::vector<std::vector<char>> m, v;
  std::vector<std::size_t> skip_m, skip_v;
  std::vector<std::vector<float>> sm, sv;  // 8-bit moments' scales
  std::vector<std::vector<std::uint16_t>> copy;
};

inline void expect_matches(const Model& model, const Reference& ref) {
  for (std::size_t i = 0; i < ref.p.size(); ++i) {
    const std::uint64_t n = ref.p[i].size();
    ASSERT_EQ(0, std::memcmp(model.state->param(i), ref.p[i].data(), n * 4)) << "param " << i;
    const std::size_t bytes = n * model.state->moment_bytes();
    ASSERT_EQ(0, std::memcmp(model.state->exp_avg(i), ref.m[i].data() + ref.skip_m[i], bytes))
        << "exp_avg " << i;
    ASSERT_EQ(0, std::memcmp(model.state->exp_avg_sq(i), ref.v[i].data() + ref.skip_v[i], bytes))
        << "exp_avg_sq " << i;
    if (ref.quantized) {
      const std::size_t blocks = ref.sm[i].size();
      ASSERT_EQ(0, std::memcmp(model.state->exp_avg_scale(i), ref.sm[i].data(), 4 * blocks))
          << "exp_avg scales " << i;
      ASSERT_EQ(0, std::memcmp(model.state->exp_avg_sq_scale(i), ref.sv[i].data(), 4 * blocks))
          << "exp_avg_sq scales " << i;
    }
    ASSERT_EQ(model.device_params(i), ref.copy[i]) << "device weights " << i;
  }
}

// The executor under tide's allocator on the stand-in device, whose capacity the test sets: at
// its end the model goes, the allocator's cache is emptied and the capacity restored.
struct AllocatorDeviceTest : ::testing::Test {
  void TearDown() override {
    model.reset();
    if (allocator != nullptr) allocator->empty_cache();
    standin.set_capacity(capacity);
  }

  const driver::CurrentContext context;
  allocator::testing::DeviceStandin standin;
  std::unique_ptr<Model> model;
  allocator::device::CachingAllocator* allocator = nullptr;
  const std::uint64_t capacity = standin.capacity();
};

inline kernels::AdamHyper hyper(int step) {
  kernels::AdamHyper h;
  h.lr = 1e-3 * step;
  h.weight_decay = 0.01;
  h.step = step;
  return h;
}

// Rates that make the planner use the GPU (tests of placement force their own).
inline planner::Rates test_rates() {
  planner::Rates r;
  r.cpu_update = 1e8;
  r.cpu_update_contended = 9e7;
  r.h2d = r.d2h = 2e9;
  r.h2d_duplex = r.d2h_duplex = 1.8e9;
  r.gpu_update = 1e10;
  return r;
}

// Options of tests that step a fixed plan: test_rates(), and the stand-in's measured times must
// not change the placement from one step to the next.
inline constexpr std::uint64_t kTestGpuChunk = 1024;

inline ExecutorOptions options_for_test() {
  ExecutorOptions options;
  options.rates = test_rates();
  options.refine = false;  // the same plan at every step
  // Every GPU subgroup of the tests' sizes in several chunks, the last one partial.
  options.gpu_chunk_params = kTestGpuChunk;
  return options;
}

// Resident subgroups (runtime/residency.h) in memory from `memory`: the headroom a test gives
// is what may be held.
inline ExecutorOptions resident_options(allocator::DeviceMemoryResource& memory) {
  ExecutorOptions options = options_for_test();
  options.residency = true;
  options.memory = &memory;
  return options;
}

// A mixed plan: kMixedSubgroups subgroups of kMixedParams on one lane, two resident and two
// copied in (a slow CPU: all on the GPU), with mixed_headroom(): room for five resident
// subgroups (slot and kept gradient) and a lane, of which the join limit (50%) admits two; the
// lane fits beside them.
constexpr std::size_t kMixedSubgroups = 4;
constexpr std::uint64_t kMixedParams = 4096;
inline ExecutorOptions mixed_options(allocator::DeviceMemoryResource& memory) {
  ExecutorOptions options = resident_options(memory);
  options.planner.max_buffers = 1;
  options.residency_hysteresis = 0.5;
  options.rates->cpu_update = options.rates->cpu_update_contended = 1e6;
  return options;
}
inline std::uint64_t mixed_headroom(const OptimizerState& state) {
  const std::uint64_t slot = state.slot_bytes(0);
  return 5 * (slot + kMixedParams * 2) + slot + kMixedParams * 4;
}

// Step 1 of a resident executor with `headroom` (room for every state: they all join; the
// reference steps too), then step 2's gradients offloaded; returns them, for the reference.
inline std::vector<std::vector<std::uint16_t>> step_with_room_then_offload(Model& model,
                                                                           Executor& executor,
                                                                           Reference& ref,
                                                                           std::uint64_t headroom) {
  auto grads = model.make_gradients(1);
  model.offload_all(executor);
  executor.run(hyper(1), Policy::automatic_policy(), headroom);
  ref.step(grads, hyper(1));
  grads = model.make_gradients(2);
  model.offload_all(executor);
  return grads;
}

// A stand-in "GPU" whose Adam kernel takes count / rate seconds of sleep and computes nothing:
// for timing tests only, so that the host twin's arithmetic does not compete with the CPU
// update for this machine's cores as a real GPU never would.
inline double& simulated_gpu_rate() {
  static double rate = 5e9;
  return rate;
}
inline void sleeping_adam(const tide_standin_grid*, void** params) {
  const auto* p = static_cast<const kernels::AdamKernelParams*>(params[0]);
  std::uint64_t n = 0;
  for (std::uint32_t i = 0; i < p->subgroup_count; ++i) n += p->subgroups[i].count;
  std::this_thread::sleep_for(
      std::chrono::duration<double>(static_cast<double>(n) / simulated_gpu_rate()));
}

// Replaces the stand-in's Adam kernel by sleeping_adam (for the process).
inline void use_sleeping_gpu(double params_per_s) {
  simulated_gpu_rate() = params_per_s;
  const char* path = std::getenv("TIDE_CUDA_DRIVER");
  ASSERT_NE(path, nullptr);
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);  // kept open: the kernel stays registered
  ASSERT_NE(handle, nullptr);
  auto reg = reinterpret_cast<int (*)(const char*, tide_standin_kernel, size_t)>(
      dlsym(handle, "tide_standin_register_kernel"));
  ASSERT_NE(reg, nullptr);
  ASSERT_EQ(reg(kernels::kAdamKernel, &sleeping_adam, sizeof(kernels::AdamKernelParams)), 0);
}

}  // namespace tide::runtime::testing

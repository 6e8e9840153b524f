// Whole training iterations (forward, backward with gradient offload, update) on the stand-in
// driver, under the offloading schemes tide is compared with, in the same run on the same
// workload (`make bench BENCH=iteration`). One JSON line per configuration and variant:
//   {"bench":"iteration","variant":"published","config":"tide","iteration_s":X,"forward_s":...}
//
// Everything but the GPU's compute and the PCIe links is tide's real code: the model's
// activations, gradients and parameters are blocks of tide's caching allocator (whose telemetry
// gives the headroom), gradients go to pinned host memory through GradientOffload, the update
// phase is tide's executor (planner, GPU pipeline, CPU Adam on real pinned memory). The GPU's
// work is simulated on its streams: forward and backward layers are timed stream work
// (tide_standin_busy: they occupy the compute stream, not a CPU), the fused Adam kernel sleeps
// for its time at the GPU's rate, and copies run on the stand-in's simulated links (one per
// direction).
//
// The published case (20B parameters on 4×H100, per rank 5e9 parameters in 50 subgroups of 1e8,
// docs/design/index.md), scaled to this machine keeping its ratios: the CPU update runs on one
// thread with the scalar kernel (as bench_update_phase does, so that its rate is stable) at r
// params/s of CPU time; with σ = r / 2.2e9 (the published CPU rate per rank), the links run at 25
// GB/s·σ and the GPU's Adam at 5e10·σ, so that every rate keeps its ratio to the CPU's. --params P
// (default 1e8) in 50 subgroups; time then runs τ = (P / 5e9) / σ times the published time:
// forward 0.55 s·τ and backward 1.10 s·τ of GPU compute (the published iteration, 2.95 s, less its
// 1.30 s update phase, split 1:2), over 25 layers. Device memory keeps the published bytes per
// parameter: 80 GB → 16 B/param of capacity, 10 GB of bf16 parameters (2), 6 GB of context and
// communication buffers (1.2), activations peaking at 30 GB (6), and memory outside tide's
// allocator sized so that the update phase's headroom is the published 48 GB (9.6 B/param).
//
// Configurations (same run, rounds interleaved: A B C ... A B C ...; the best round is kept):
//   zero_offload            gradients copied to the host, waited for, after the whole backward
//                           pass; every subgroup updated on the CPU (ZeRO-Offload-style)
//   zero_offload_published  the same with the blocking gradient path as slow as the published
//                           baseline's: its forward and backward took 5.0 s (7.27 s less its 2.27 s
//                           update), 3.35 s more than with asynchronous offload, which moving 10 GB
//                           of bf16 gradients at 25 GB/s (0.4 s) does not explain (DeepSpeed copies
//                           per bucket, synchronously, and converts on the CPU); here its copies
//                           run at the rate that gives those 3.35 s (1e10 B / 3.35 s, scaled)
//   dos_k2 ... dos_k6       gradients offloaded asynchronously during backward (the GPU
//                           subgroups' kept on the GPU); one GPU subgroup every K (DOS-style);
//                           "dos_best" marks the fastest K
//   twin_flow_0.25, _0.5    the same with a static fraction of the subgroups on the GPU, through
//                           the same pipeline (Twin-Flow-style; the real Twin-Flow keeps that
//                           fraction's state resident on the GPU, which is not simulated)
//   tide                    the same with each update phase planned from the headroom tide's
//                           allocator forecasts at zero_grad(), every iteration, and resident
//                           subgroups where memory allows (ExecutorOptions::residency, as
//                           TIDE_RESIDENCY's default). At the published ratios the whole state
//                           does not fit, but part of it would: the held headroom (about 3.5
//                           B/param) takes 9 of the 50 subgroups (14 B/param each with its kept
//                           gradient, after a lane), which would leave no room for the copied-in
//                           subgroups' kept gradients and lanes and send the others to the CPU:
//                           slower, so the executor keeps none resident there
//   tide_no_residency       tide without resident subgroups (published, fits and partial
//                           variants)
// Static configurations (dos, twin_flow) plan with a headroom measured once, before the rounds
// (tide's forecast then); every configuration runs through its own executor.
//
// Variant "varying": the same rates and sizes, but the update phase's free memory alternates
// from one iteration to the next between a roomy state (2.4 B/param: every placement fits) and
// a tight one (1.2 B/param: K=2's kept gradients do not fit), through memory outside tide's
// allocator (another tenant of the GPU whose use alternates, e.g. with the sequence lengths of
// its batches; activations are small here so that both fit). tide plans each iteration from what
// its allocator sees; each static configuration runs twice, planned with the roomy state's
// headroom ("@roomy": in tight iterations its allocations fail and it falls back to the CPU, and
// the executor caps its later plans) and with the tight one's ("@tight": it leaves the roomy
// iterations' extra memory unused, or does not fit at all and runs on the CPU). A round is one
// iteration in each state. ZeRO-Offload-style is left out there (its update uses no GPU memory).
//
// Variant "fits": the optimizer state fits the memory free through the whole iteration. The
// device has 32 B/param instead of 16 (the other variants give the extra 16 B/param to memory
// outside tide's allocator, so that their free memory is the published one), with the published
// weights, context buffers, activations and outside memory: the update phase has 25.6 B/param
// free and the held headroom (what stays free through forward and backward) is about 19 B/param,
// room for 12 B/param of fp32 state, the resident subgroups' kept bf16 gradients (2) and a lane.
// Configurations: "no_offload", the floor: the state on the GPU, no gradient offload, and an
// update that is the GPU Adam's time over all parameters (timed stream work, P / the GPU's rate),
// no copies; zero_offload and zero_offload_published as above; dos_k2 for reference; "tide" (its
// state becomes resident in its first iterations, before the rounds: the allocator must have
// seen an iteration) and tide_no_residency. Its targets (issue 28): tide / no_offload <= 1.15 and
// zero_offload / tide >= 3 (both ZeRO-Offload-style lines are compared). The stand-in's device
// memory is host memory and its device-to-device copies a CPU memcpy: the state copied in on
// joining costs real CPU time once (before the rounds), the resident subgroups' gradients kept on
// the GPU during backward cost a memcpy each, and so does writing their new bf16 weights to the
// model after each resident update; their state crosses no link. Every line has
// "resident_subgroups" (after the best round's update) and "resident_subgroups_min" (over the
// rounds); resident state is evicted at the end of each variant. In the varying variants,
// resident state taken in a roomy iteration can make the other tenant's allocation fail when
// its use grows (tide's reclaimer serves only allocations through tide's allocator): the
// benchmark then says so on stderr, evicts it and goes on; the summary line counts these
// ("tenant_allocations_failed").
//
// Variant "partial": as "fits", but the other tenant takes kPartialExtra of the 16 extra
// B/param: about half the subgroups can be resident beside the lanes and kept gradients the rest
// need (a capped real GPU's regime). The published variant's configurations, ZeRO-Offload-style
// left out; the target is the published one (tide within 3% of the best static configuration).
//
// Variant "shapes": as "partial", but each iteration's activations differ, as with sequence
// lengths that vary from batch to batch: up to kShapeJitter more or less than the partial
// variant's, the same sizes in the same order for every configuration. A round is
// kShapeIterations iterations (the forecast of what stays free then misses now and then, and
// resident state meets pressure in the passes: evictions, cache releases), and the ratios are of
// the median rounds. Configurations: dos_k2, dos_k3 (the partial variant's best static ones),
// tide_no_residency and tide; the target is the partial one.
//
// Each line's by_memory_state also has the allocator's driver allocations and frees, retries
// (allocations served only by giving its cache back) and waits for all streams in that iteration
// (a real driver charges for each: mappings, a device synchronize; the stand-in barely does), and
// the update phase's busy times: the GPU's kernels, the copies each way and the CPU's updates.
//
// Each line also has the performance model's prediction of every phase (forward: the layers'
// compute; backward: planner/iteration_model.h; update: the plan the executor's planner, the one
// `tide plan` runs, makes for that headroom with the rates measured at the start) and measured
// over predicted.
#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "allocator/device/device_registry.h"
#include "bench/simulated_gpu.h"
#include "driver/context.h"
#include "driver/error.h"
#include "driver/memory.h"
#include "driver/stream.h"
#include "kernels/adam_kernel.h"
#include "kernels/cpu_adam.h"
#include "planner/iteration_model.h"
#include "planner/measure.h"
#include "runtime/executor.h"
#include "standin/standin.h"

namespace {

using namespace tide;
using namespace tide::planner;
using namespace tide::runtime;
using allocator::device::CachingAllocator;
using Clock = std::chrono::steady_clock;

// The published case, per rank (docs/design/index.md).
constexpr double kPubParams = 5e9;
constexpr double kPubCpuRate = 2.2e9;
constexpr double kPubLink = 25e9;
constexpr double kPubGpuRate = 5e10;
constexpr double kPubForward = 0.55;
constexpr double kPubBackward = 1.10;
constexpr double kPubBlockingGradient = 3.35;  // s: 5.0 s of forward+backward less 1.65 s
constexpr std::size_t kSubgroups = 50;
constexpr int kLayers = 25;
// Device memory, bytes per parameter (80 GB, 10 GB, 6 GB, 30 GB, 48 GB free in the update).
constexpr double kCapacity = 16, kParamBytes = 2, kHeld = 1.2, kActivations = 6, kFree = 9.6;
// The simulated device's capacity: the "fits" variant's (the other variants' 16 B/param are
// shaped by memory outside tide's allocator, 16 B/param more of it).
constexpr double kFitsCapacity = 32;
// The "partial" variant gives the other tenant this much of the 16 extra B/param: about half the
// state fits the held headroom beside the lanes and kept gradients the other half needs.
constexpr double kPartialExtra = 12;
constexpr double kMargin = 0.02;  // TIDE_HEADROOM_MARGIN's default
// The "shapes" variant: iterations per round, and how far each one's activations are from the
// partial variant's (a fraction, either way).
constexpr int kShapeIterations = 8;
constexpr double kShapeJitter = 0.2;

// The "shapes" variant's activations in iteration i of a configuration's sequence, over the
// partial variant's: in [1 - kShapeJitter, 1 + kShapeJitter], the same for every configuration.
double shape_factor(std::uint64_t i) {
  const std::uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ULL;  // Fibonacci hashing: well spread
  return 1.0 + kShapeJitter * (2.0 * static_cast<double>(h >> 11) / 0x1p53 - 1.0);
}

using bench::sleeping_adam;

template <typename F>
F standin_fn(void* handle, const char* name) {
  return bench::standin_fn<F>(handle, name, "bench_iteration");
}

int (*g_busy)(void*, double, const char*) = nullptr;
int (*g_set_bandwidth)(double, double) = nullptr;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// none: no gradient offload and the update on the GPU over all parameters, state on the GPU
// (the "fits" variant's floor).
enum class Offload { async, blocking, blocking_published, none };

struct Config {
  std::string name;
  Offload offload = Offload::async;
  Policy policy;
  bool static_headroom = true;  // false: the headroom tide's allocator forecasts, every iteration
  // A static configuration's headroom: the one tide saw in this memory state before the rounds
  // (0: the first, roomy one; 1: the tight one of the varying variant).
  std::size_t planned_for = 0;
  bool residency = false;  // ExecutorOptions::residency
};

// One iteration: its phases, what its update phase ran, and the headroom it was planned with.
struct Measured {
  double forward = 0, backward = 0, update = 0;
  double iteration() const { return forward + backward + update; }
  std::size_t gpu_subgroups = 0, buffers = 0, fallback = 0;
  std::uint64_t headroom = 0, headroom_used = 0;  // headroom_used: the plan's GPU bytes
  std::uint64_t headroom_cap = 0;  // the executor's cap on later plans after a fallback (0: none)
  std::size_t resident = 0;        // resident subgroups after the update phase
  // Pressure on resident state in the passes before the update phase (PhaseReport::pressure):
  // subgroups taken home inside an allocation, and the allocator's cache releases.
  std::size_t evicted = 0;
  std::uint64_t cache_releases = 0;
  // The allocator's driver calls and retries in the iteration: a real driver charges for each
  // (a mapping, a synchronization), the stand-in barely does.
  std::uint64_t device_allocs = 0, device_frees = 0, alloc_retries = 0, syncs = 0;
  // The update phase's streams' busy time (PhaseReport: kernels, copies each way) and the CPU's.
  double gpu_busy = 0, h2d_busy = 0, d2h_busy = 0, cpu_busy = 0;
  planner::Plan planned;  // the executor's plan (with its resident subgroups)
};

// The model's memory and work on the "GPU", and the optimizer state on the host.
struct Iteration {
  std::uint64_t params = 0, subgroup = 0;
  std::vector<LayerTimes> layers;  // forward order
  double link = 0;                 // bytes/s each way
  double blocking_published_link = 0;
  double gpu_rate = 0;  // the GPU Adam's params/s
};

class Trainer {
 public:
  Trainer(const Iteration& w, CachingAllocator& allocator)
      : w_(w), allocator_(allocator), state_(specs(), StateOptions{}) {}
  ~Trainer() {
    for (void* p : params_) allocator_.deallocate(p, w_.subgroup * 2, compute_.get());
    if (held_ != nullptr) allocator_.deallocate(held_, held_bytes_, compute_.get());
  }

  OptimizerState& state() { return state_; }
  // A block of tide's allocator, or the end of the benchmark: the workload does not fit.
  void* allocate(std::size_t bytes) {
    void* p = allocator_.allocate(bytes, compute_.get());
    if (p == nullptr) {
      std::fprintf(stderr, "bench_iteration: out of device memory allocating %zu bytes\n", bytes);
      std::exit(1);
    }
    return p;
  }
  void hold(std::uint64_t bytes) {
    held_bytes_ = bytes;
    held_ = allocate(bytes);
  }
  void set_activation_bytes(double bytes) { activation_bytes_ = bytes; }

  // One iteration under `config` with `executor`; `static_headroom` for a static configuration.
  Measured iteration(const Config& config, Executor& executor, std::uint64_t static_headroom) {
    const allocator::device::AllocatorStats before = allocator_.stats();
    Measured m = run_iteration(config, executor, static_headroom);
    const allocator::device::AllocatorStats after = allocator_.stats();
    m.device_allocs = after.num_device_alloc - before.num_device_alloc;
    m.device_frees = after.num_device_free - before.num_device_free;
    m.alloc_retries = after.num_alloc_retries - before.num_alloc_retries;
    m.syncs = after.num_sync_all_streams - before.num_sync_all_streams;
    return m;
  }

 private:
  Measured run_iteration(const Config& config, Executor& executor, std::uint64_t static_headroom) {
    using telemetry_mark = allocator::telemetry::Mark;
    Measured m;
    const auto layers = static_cast<std::size_t>(kLayers);
    const std::uint64_t per_layer = w_.params / layers;
    const auto activation = static_cast<std::size_t>(activation_bytes_ / kLayers);
    std::vector<void*> acts(layers, nullptr);
    // zero_grad(), as tide.torch does it: with gradients kept on the GPU the plan is made now,
    // so that the backward pass sends its GPU subgroups' gradients to the GPU buffers it holds.
    const auto t0 = Clock::now();  // the plan's time counts in the forward pass's
    // tide prepares with what may be held through the forward and backward passes (its kept
    // gradients are); a static configuration keeps its gradients within its update headroom.
    const allocator::telemetry::HeadroomForecast forecast = allocator_.headroom();
    m.headroom = config.static_headroom ? static_headroom : forecast.headroom;
    const bool none = config.offload == Offload::none;
    if (config.offload == Offload::async)
      executor.prepare(config.policy, config.static_headroom ? m.headroom : forecast.held_headroom);
    allocator_.mark(telemetry_mark::kForward);
    for (std::size_t l = 0; l < layers; ++l) {
      acts[l] = allocate(activation);
      check(g_busy(compute_.get(), w_.layers[l].forward_s, "forward"));
    }
    compute_.synchronize();
    const auto t1 = Clock::now();
    allocator_.mark(telemetry_mark::kBackward);
    GradientOffload& offload = executor.offload();
    std::vector<std::pair<void*, std::size_t>> grads;  // kept until the end (blocking)
    for (std::size_t l = layers; l-- > 0;) {
      check(g_busy(compute_.get(), w_.layers[l].backward_s, "backward"));
      const std::uint64_t first = l * per_layer,
                          count = l + 1 == layers ? w_.params - first : per_layer;
      // The layer's gradient: a block of the allocator, copied as it is (the stand-in's device
      // memory starts as zeros; a memset here would run on the compute stream's worker, a CPU
      // cost a GPU does not have, and the Adam kernels take as long whatever the values).
      void* grad = allocate(count * 2);
      allocator_.deallocate(acts[l], activation, compute_.get());
      if (none) {
        allocator_.deallocate(grad, count * 2, compute_.get());  // read in place by the update
      } else if (config.offload == Offload::async) {
        offload_layer(offload, first, count, grad);
        allocator_.record_stream(grad, offload.stream().get());
        allocator_.deallocate(grad, count * 2, compute_.get());
      } else {
        grads.emplace_back(grad, count);
      }
    }
    compute_.synchronize();
    if (config.offload == Offload::blocking || config.offload == Offload::blocking_published) {
      // ZeRO-Offload-style: after the whole backward pass, every gradient to the host, waited for.
      if (config.offload == Offload::blocking_published) {
        check(g_set_bandwidth(w_.link / 1e9, w_.blocking_published_link / 1e9));
      }
      for (std::size_t i = 0; i < grads.size(); ++i) {
        const std::size_t l = layers - 1 - i;
        offload_layer(offload, l * per_layer, grads[i].second, grads[i].first);
      }
      offload.synchronize_all();
      if (config.offload == Offload::blocking_published) {
        check(g_set_bandwidth(w_.link / 1e9, w_.link / 1e9));
      }
      for (auto [grad, count] : grads) allocator_.deallocate(grad, count * 2, compute_.get());
    }
    offload.synchronize_all();
    const auto t2 = Clock::now();
    allocator_.mark(telemetry_mark::kUpdate);
    m.forward = seconds(t0, t1);
    m.backward = seconds(t1, t2);
    if (none) {
      // The GPU's Adam over every parameter, its state on the GPU: no copy, only its time.
      check(g_busy(compute_.get(), static_cast<double>(w_.params) / w_.gpu_rate, "adam"));
      compute_.synchronize();
      m.update = seconds(t2, Clock::now());
      m.gpu_subgroups = w_.params / w_.subgroup;
      allocator_.mark(telemetry_mark::kIterationEnd);
      return m;
    }
    kernels::AdamHyper hyper;
    hyper.step = ++step_;
    const PhaseReport& r = executor.run(hyper, config.policy, m.headroom);
    const auto t3 = Clock::now();
    executor.release_buffers();
    allocator_.mark(telemetry_mark::kIterationEnd);
    m.update = seconds(t2, t3);
    // Updated on the GPU, resident subgroups included (ran lists only those copied in).
    m.gpu_subgroups = static_cast<std::size_t>(
        std::count(r.devices.begin(), r.devices.end(), planner::Device::gpu));
    m.buffers = r.ran.buffers;
    m.fallback = r.fallback_subgroups;
    m.headroom_used = r.ran.gpu_bytes();
    m.headroom_cap = r.headroom_cap;
    m.resident = r.resident_subgroups;
    m.evicted = r.pressure.evicted_subgroups;
    m.cache_releases = r.pressure.cache_releases;
    m.planned = r.planned;
    m.gpu_busy = r.gpu_seconds;
    m.h2d_busy = r.h2d_seconds;
    m.d2h_busy = r.d2h_seconds;
    m.cpu_busy = r.cpu_seconds;
    return m;
  }

  static void check(int r) {
    if (r != 0) {
      std::fprintf(stderr, "bench_iteration: stand-in control call failed (%d)\n", r);
      std::exit(1);
    }
  }
  std::vector<SubgroupSpec> specs() {
    std::vector<SubgroupSpec> specs(w_.params / w_.subgroup);
    for (SubgroupSpec& s : specs) {
      params_.push_back(allocate(w_.subgroup * 2));
      s.params = w_.subgroup;
      s.slices.push_back(ParamSlice{0, w_.subgroup, reinterpret_cast<CUdeviceptr>(params_.back())});
    }
    return specs;
  }
  // The gradients of parameters [first, first + count), at `grad`, to their subgroups.
  void offload_layer(GradientOffload& offload, std::uint64_t first, std::uint64_t count,
                     void* grad) {
    for (std::uint64_t at = first; at < first + count;) {
      const std::uint64_t s = at / w_.subgroup, offset = at % w_.subgroup;
      const std::uint64_t n = std::min(first + count - at, w_.subgroup - offset);
      offload.offload(s, offset, reinterpret_cast<CUdeviceptr>(grad) + (at - first) * 2, n,
                      kernels::Dtype::kBFloat16, compute_.get());
      at += n;
    }
  }

  const Iteration& w_;
  CachingAllocator& allocator_;
  driver::Stream compute_;
  std::vector<void*> params_;
  void* held_ = nullptr;
  std::uint64_t held_bytes_ = 0;
  double activation_bytes_ = 0;
  OptimizerState state_;
  std::int64_t step_ = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  double total = 1e8;
  int rounds = 5;
  std::string variants = "published,varying,varying_tight,fits,partial,shapes";
  int best_k = 0;  // the varying variants run K=2 and the published variant's best K (or this)
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--params") && i + 1 < argc) {
      total = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--variants") && i + 1 < argc) {
      variants = argv[++i];
    } else if (!std::strcmp(argv[i], "--best-k") && i + 1 < argc) {
      best_k = std::atoi(argv[++i]);
    } else {
      std::fprintf(
          stderr,
          "usage: bench_iteration [--params N (1e8), in 50 subgroups] [--rounds N (5)] "
          "[--variants published,varying,varying_tight,fits,partial,shapes] [--best-k K (2-6):\n"
          "the varying variants' best K without the published variant]\n");
      return 2;
    }
  }
  // From 5e7: subgroups of at least 1e6 parameters, whose 2 MB of bf16 weights are large blocks
  // of the allocator (small ones share 2 MiB segments, which the tight memory of the varying
  // variant has no room for).
  if (!(total >= 5e7 && total <= 1e10)) {
    std::fprintf(stderr, "bench_iteration: --params between 5e7 and 1e10\n");
    return 2;
  }
  setenv("TIDE_CPU_THREADS", "1", 1);  // before the CPU pool exists
  void* handle = bench::open_standin("bench_iteration");
  g_set_bandwidth = standin_fn<int (*)(double, double)>(handle, "tide_standin_set_bandwidth");
  g_busy = standin_fn<int (*)(void*, double, const char*)>(handle, "tide_standin_busy");
  auto set_capacity = standin_fn<int (*)(int, std::uint64_t)>(handle, "tide_standin_set_capacity");
  auto device_memory = standin_fn<int (*)(int, std::uint64_t*, std::uint64_t*, std::uint64_t*)>(
      handle, "tide_standin_device_memory");
  auto register_kernel = standin_fn<int (*)(const char*, tide_standin_kernel, size_t)>(
      handle, "tide_standin_register_kernel");

  Iteration w;
  w.subgroup = static_cast<std::uint64_t>(total / kSubgroups);
  w.params = w.subgroup * kSubgroups;
  const auto P = static_cast<double>(w.params);

  const driver::CurrentContext context(0);
  if (set_capacity(0, static_cast<std::uint64_t>(kFitsCapacity * P)) != 0) return 1;
  register_kernel(kernels::kAdamKernel, &sleeping_adam, sizeof(kernels::AdamKernelParams));
  kernels::CpuAdamOptions cpu_options{.threads = 1};
  cpu_options.force_isa = true;
  cpu_options.isa = kernels::CpuIsa::kScalar;
  const auto [cpu_per_s, memcpy_per_s] = measure_cpu_cost(std::uint64_t{4} << 20, cpu_options);
  const double sigma = cpu_per_s / kPubCpuRate;
  const double tau = (P / kPubParams) / sigma;
  // The stand-in's copies are a memcpy and then a sleep until the simulated link would be done:
  // a link above a third of the memcpy rate would keep the copy threads busy enough, both ways,
  // to take the CPU update's core on a 2-core machine. Capped there (said below and in every
  // line: "link_over_published_ratio").
  w.link = std::min(kPubLink * sigma, memcpy_per_s / 3);
  w.blocking_published_link =
      w.link * (2 * kPubParams / kPubLink) / kPubBlockingGradient;  // its 3.35 s, scaled
  bench::simulated_gpu_rate = kPubGpuRate * sigma;
  w.gpu_rate = bench::simulated_gpu_rate;
  g_set_bandwidth(w.link / 1e9, w.link / 1e9);
  for (int l = 0; l < kLayers; ++l) {
    w.layers.push_back({kPubForward * tau / kLayers, kPubBackward * tau / kLayers,
                        static_cast<std::uint64_t>(2 * P / kLayers)});
  }
  std::fprintf(stderr,
               "machine: CPU update %.3g params/s (1 thread, scalar) and memcpy %.2f GB/s per CPU "
               "second; published case x sigma %.4f: links %.2f GB/s (published ratio %.2f), GPU "
               "Adam %.3g params/s; %.3g params in %zu subgroups: time x tau %.3f (forward %.3f s, "
               "backward %.3f s of GPU compute)\n",
               cpu_per_s, memcpy_per_s / 1e9, sigma, w.link / 1e9, kPubLink * sigma / 1e9,
               bench::simulated_gpu_rate, P, kSubgroups, tau, kPubForward * tau,
               kPubBackward * tau);

  CachingAllocator& allocator = allocator::device::device_allocator(0);
  Trainer trainer(w, allocator);
  trainer.hold(static_cast<std::uint64_t>(kHeld * P));

  MeasureOptions mo;
  mo.params = std::uint64_t{4} << 20;
  mo.cpu_threads = 1;
  mo.cpu_isa = kernels::CpuIsa::kScalar;
  mo.repeats = 5;  // the best of 5: noise on a shared machine only slows a run down
  mo.host_memory_bytes = std::uint64_t{64} << 20;  // 256 MiB in all: past the caches, quickly
  auto measure = [&](const char* when) {
    const Rates r = measure_rates(mo);
    std::fprintf(stderr,
                 "rates measured %s: CPU update %.3g params/s (%.3g while copying), host-to-GPU "
                 "%.2f GB/s (%.2f both ways), GPU-to-host %.2f GB/s (%.2f both ways), GPU update "
                 "%.3g params/s\n",
                 when, r.cpu_update, r.cpu_update_contended, r.h2d / 1e9, r.h2d_duplex / 1e9,
                 r.d2h / 1e9, r.d2h_duplex / 1e9, r.gpu_update);
    return r;
  };
  Rates rates = measure("at the start");
  const char* machine = "stand-in, 1 CPU update thread (scalar), simulated GPU compute and links";

  std::vector<Config> configs = {
      {"zero_offload", Offload::blocking, Policy::all_cpu()},
      {"zero_offload_published", Offload::blocking_published, Policy::all_cpu()}};
  for (std::size_t k = 2; k <= 6; ++k) {
    configs.push_back({"dos_k" + std::to_string(k), Offload::async, Policy::every(k)});
  }
  configs.push_back({"twin_flow_0.25", Offload::async, Policy::first(kSubgroups / 4)});
  configs.push_back({"twin_flow_0.5", Offload::async, Policy::first(kSubgroups / 2)});
  // The varying variant's static configurations planned for its tight memory state, with
  // executors of their own (an executor caps later plans after a fallback).
  for (std::size_t i = 2, n = configs.size(); i < n; ++i) {
    Config tight = configs[i];
    configs[i].name += "@roomy";
    tight.name += "@tight";
    tight.planned_for = 1;
    configs.push_back(tight);
  }
  // The fits variant's floor, and tide as it was before resident subgroups (the published and
  // fits variants). tide, last (it measures the static configurations' headroom), with resident
  // subgroups where memory allows (TIDE_RESIDENCY's default).
  configs.push_back({"no_offload", Offload::none, Policy::all_gpu()});
  configs.push_back({"tide_no_residency", Offload::async, Policy::automatic_policy(), false});
  configs.push_back({"tide", Offload::async, Policy::automatic_policy(), false, 0, true});

  std::vector<std::unique_ptr<Executor>> executors;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    ExecutorOptions o;
    o.rates = rates;
    // Static configurations keep their gradients on the GPU (Deep Optimizer States does); tide
    // where its model predicts it pays (the default).
    o.gradients_on_gpu = configs[i].offload != Offload::async ? KeptGradients::no
                         : configs[i].static_headroom         ? KeptGradients::yes
                                                              : KeptGradients::automatic;
    o.residency = configs[i].residency;
    o.cpu_threads = 1;
    o.cpu_isa = kernels::CpuIsa::kScalar;
    executors.push_back(std::make_unique<Executor>(trainer.state(), o));
  }
  // The model's plan for a configuration and headroom, with the rates measured before the
  // variant's rounds (the executor's planner as `tide plan` runs it, from executors that never
  // refine them).
  std::vector<std::unique_ptr<Executor>> predictors;
  auto predict_with = [&](const Rates& r) {
    predictors.clear();
    for (bool on_gpu : {false, true}) {
      ExecutorOptions o;
      o.rates = r;
      o.gradients_on_gpu = on_gpu ? KeptGradients::yes : KeptGradients::no;
      o.refine = false;
      predictors.push_back(std::make_unique<Executor>(trainer.state(), o));
    }
  };
  auto predicted_plan = [&](const Config& c, std::uint64_t headroom) {
    return predictors[c.offload == Offload::async ? 1 : 0]->plan_for(c.policy, headroom);
  };
  // The backward pass with a plan: a static configuration's GPU subgroups' gradients stay on
  // the GPU (KeptGradients::yes); tide's reach pinned memory too (automatic), but for those of
  // resident subgroups.
  auto predicted_backward = [&](const Config& c, const Plan& plan) {
    const bool blocking = c.offload != Offload::async;
    std::vector<std::size_t> gpu_only;
    if (!blocking && c.static_headroom) gpu_only = plan.gpu_order;
    if (!blocking && !c.static_headroom) {
      for (std::size_t s = 0; s < plan.subgroups.size(); ++s) {
        if (plan.subgroups[s].resident) gpu_only.push_back(s);
      }
    }
    const std::vector<std::uint64_t> sizes(kSubgroups, w.subgroup);
    const std::vector<std::uint64_t> bytes =
        host_gradient_bytes(sizes, w.layers.size(), 2, gpu_only);
    std::vector<LayerTimes> layers = w.layers;
    for (std::size_t l = 0; l < layers.size(); ++l) layers[l].gradient_bytes = bytes[l];
    return predict_backward(
        layers, c.offload == Offload::blocking_published ? w.blocking_published_link : w.link,
        blocking);
  };
  std::string best_dos = best_k >= 2 && best_k <= 6 ? "dos_k" + std::to_string(best_k) : "";

  auto run_variant = [&](const std::string& variant) {
    const bool varying = variant.starts_with("varying"), fits = variant == "fits",
               shapes = variant == "shapes", partial = variant == "partial" || shapes;
    if (variant != "published") rates = measure(("before the " + variant + " variant").c_str());
    predict_with(rates);
    // Memory outside tide's allocator, bytes per parameter: the published headroom, or
    // alternating between a roomy one (ten subgroups' fp32 state, 2.4 B/param: room for every
    // placement here, e.g. K=2's 25 kept gradients and 2 buffers) and a tight one: "varying",
    // half that (12 kept gradients and 2 buffers fit, K=2's 25 do not, even with 1 buffer);
    // "varying_tight", 0.65 B/param (none of the static placements fits: K=6's 9 kept gradients
    // and 1 buffer need 0.6 B/param of the 0.56 the executor plans with). The executor plans
    // with 12/14 of the headroom when it keeps gradients on the GPU: the new bf16 weights need a
    // staging area there.
    const double buffer = 12.0 * static_cast<double>(w.subgroup) / P;
    const double tight = variant == "varying_tight" ? 0.65 : 5 * buffer;
    // The device has kFitsCapacity: all but the fits variant give the other tenant the extra
    // 16 B/param, so that their free memory is the published one (the fits variant: 16 B/param
    // more, 25.6 B/param in the update phase, under which 12 B/param of fp32 state fit).
    auto outside_for = [&](double free) {
      const double extra = fits ? 0 : partial ? kPartialExtra : kFitsCapacity - kCapacity;
      return extra + kCapacity - (free + kParamBytes + kHeld) / (1 - kMargin);
    };
    const std::vector<double> outside =
        varying ? std::vector<double>{outside_for(10 * buffer), outside_for(tight)}
                : std::vector<double>{outside_for(kFree)};
    trainer.set_activation_bytes((varying ? 0.05 : kActivations) * P);
    // The published variant: every configuration once (static ones with the headroom measured
    // before the rounds, "@roomy"). The varying one: ZeRO-Offload-style left out (no GPU memory
    // in its update), K = 2 and the best K, each static configuration planned for either state.
    // The fits variant: the floor (no_offload), ZeRO-Offload-style, K = 2, tide with and without
    // resident subgroups.
    std::vector<std::size_t> chosen;
    for (std::size_t i = 0; i < configs.size(); ++i) {
      const Config& c = configs[i];
      if (c.planned_for >= outside.size()) continue;
      if (c.offload == Offload::none && !fits) continue;
      if (c.name == "tide_no_residency" && varying) continue;
      if (fits) {
        if (c.offload == Offload::async && c.static_headroom && c.name != "dos_k2@roomy") continue;
        chosen.push_back(i);
        continue;
      }
      if ((varying || partial) && c.offload != Offload::async) continue;
      if (shapes && c.static_headroom && c.name != "dos_k2@roomy" && c.name != "dos_k3@roomy") {
        continue;
      }
      if (varying && c.name.starts_with("dos_k") && !c.name.starts_with("dos_k2@") &&
          !c.name.starts_with(best_dos + "@")) {
        continue;
      }
      chosen.push_back(i);
    }
    std::optional<driver::DeviceBuffer> tenant;
    int tenant_failures = 0;  // the other tenant's allocations that resident state made fail
    std::size_t tenant_state = outside.size();  // none yet
    // Before each iteration: the other tenant's memory for it (tide's cache given back first,
    // so that the tenant can have it).
    auto set_outside = [&](std::size_t state) {
      if (state == tenant_state) return;
      allocator.empty_cache();
      tenant.reset();
      if (std::getenv("BENCH_DEBUG")) {
        std::uint64_t used = 0, cap = 0;
        device_memory(0, &used, nullptr, &cap);
        std::fprintf(
            stderr,
            "state %zu: device used %.1f MB of %.1f, tide reserved %.1f live %.1f, tenant %.1f\n",
            state, static_cast<double>(used) / 1e6, static_cast<double>(cap) / 1e6,
            static_cast<double>(allocator.usage().reserved) / 1e6,
            static_cast<double>(allocator.usage().live) / 1e6, outside[state] * P / 1e6);
      }
      try {
        tenant.emplace(static_cast<std::size_t>(outside[state] * P));
      } catch (const driver::CudaError&) {
        // Resident state, sized from a forecast that cannot see the other tenant grow, holds
        // what it needs now (tide's reclaimer serves only allocations through tide's
        // allocator). Reported, and given back so that the variant goes on.
        std::uint64_t resident = 0;
        for (std::size_t i = 0; i < configs.size(); ++i) {
          resident += executors[i]->residency().bytes();
          executors[i]->evict();
        }
        ++tenant_failures;
        std::fprintf(stderr,
                     "bench_iteration: the other tenant could not get %.1f MB while tide held "
                     "%.1f MB of resident state: evicted\n",
                     outside[state] * P / 1e6, static_cast<double>(resident) / 1e6);
        allocator.empty_cache();
        tenant.emplace(static_cast<std::size_t>(outside[state] * P));
      }
      tenant_state = state;
    };
    // The headroom tide sees in each memory state, and the static configurations' headroom:
    // measured once, in the first (roomy) state, as tide sees it (after an iteration in the
    // other state: the forecast needs an update phase seen).
    std::vector<std::uint64_t> seen(outside.size(), 0);
    for (std::size_t k = outside.size(); k-- > 0;) {
      for (int twice = 0; twice < 2; ++twice) {
        set_outside(k);
        seen[k] = trainer.iteration(configs.back(), *executors.back(), 0).headroom;
      }
    }
    const std::vector<std::uint64_t> static_headroom = seen;
    // Per configuration, per round, per memory state.
    using Round = std::vector<Measured>;
    auto mean = [](const Round& r, double Measured::*field) {
      double sum = 0;
      for (const Measured& m : r) sum += m.*field;
      return sum / static_cast<double>(r.size());
    };
    auto round_s = [&](const Round& r) {
      return mean(r, &Measured::forward) + mean(r, &Measured::backward) +
             mean(r, &Measured::update);
    };
    std::map<std::size_t, std::vector<Round>> runs;
    for (int round = -1; round < rounds; ++round) {  // round -1: warm-up
      for (std::size_t i : chosen) {
        Round r;
        for (std::size_t k = 0; k < outside.size(); ++k) {
          set_outside(k);
          for (int j = 0; j < (shapes ? kShapeIterations : 1); ++j) {
            if (shapes) {
              const std::uint64_t n = static_cast<std::uint64_t>(round + 1) * kShapeIterations + j;
              trainer.set_activation_bytes(kActivations * P * shape_factor(n));
            }
            r.push_back(trainer.iteration(configs[i], *executors[i],
                                          static_headroom[configs[i].planned_for]));
          }
          if (!configs[i].static_headroom) seen[k] = r.back().headroom;
        }
        if (round >= 0) runs[i].push_back(std::move(r));
      }
    }
    // Resident state goes home: the next variant starts from none.
    for (std::size_t i : chosen) {
      if (configs[i].residency) executors[i]->evict();
    }
    tenant.reset();
    allocator.empty_cache();

    // The best round per configuration (noise on a shared machine only slows a run down), and
    // the median; "dos_best" is the fastest K.
    std::map<std::size_t, Round> best;
    std::map<std::size_t, double> med;
    for (auto& [i, v] : runs) {
      best[i] = *std::min_element(v.begin(), v.end(), [&](const Round& a, const Round& b) {
        return round_s(a) < round_s(b);
      });
      std::vector<double> times;
      for (const Round& r : v) times.push_back(round_s(r));
      med[i] = median(times);
    }
    if (variant == "published") {
      double fastest = 1e300;
      for (std::size_t i : chosen) {
        if (configs[i].name.starts_with("dos_k") && round_s(best[i]) < fastest) {
          fastest = round_s(best[i]);
          best_dos = configs[i].name.substr(0, configs[i].name.find('@'));
        }
      }
    }
    double zero = 0, zero_published = 0, best_static = 1e300, tide_s = 0, floor_s = 0,
           tide_no_residency_s = 0;
    std::string best_static_name;
    for (std::size_t i : chosen) {
      // With varying shapes a round's pressure is part of what is measured: the median round.
      const double t = shapes ? med[i] : round_s(best[i]);
      if (configs[i].name == "zero_offload") zero = t;
      if (configs[i].name == "zero_offload_published") zero_published = t;
      if (configs[i].name == "no_offload") floor_s = t;
      if (configs[i].name == "tide_no_residency") tide_no_residency_s = t;
      if (configs[i].name == "tide") {
        tide_s = t;
      } else if (configs[i].static_headroom && configs[i].offload == Offload::async &&
                 t < best_static) {
        best_static = t;
        best_static_name =
            varying ? configs[i].name : configs[i].name.substr(0, configs[i].name.find('@'));
      }
    }
    for (std::size_t i : chosen) {
      const Config& c = configs[i];
      const Round& b = best[i];
      const double forward = predict_forward(w.layers);
      double backward = 0, update = 0;
      std::string states;
      for (std::size_t k = 0; k < b.size(); ++k) {
        // The headroom tide saw in that memory state; a static configuration plans with its own.
        const std::uint64_t headroom =
            c.static_headroom ? static_headroom[c.planned_for] : seen[shapes ? 0 : k];
        // With resident subgroups: the plan the executor made (the predictors have none).
        const Plan plan = c.residency ? b[k].planned : predicted_plan(c, headroom);
        double predicted = plan.predicted.phase_s, predicted_bw = 0;
        if (c.offload == Offload::none) {
          predicted = P / w.gpu_rate;
          std::vector<LayerTimes> layers = w.layers;
          for (LayerTimes& l : layers) l.gradient_bytes = 0;
          predicted_bw = predict_backward(layers, w.link, false);
        } else {
          predicted_bw = predicted_backward(c, plan);
        }
        update += predicted / static_cast<double>(b.size());
        backward += predicted_bw / static_cast<double>(b.size());
        char one[1024];
        std::snprintf(one, sizeof one,
                      "%s{\"headroom_bytes\":%llu,\"plan_gpu_bytes\":%llu,\"gpu_subgroups\":%zu,"
                      "\"buffers\":%zu,\"fallback_subgroups\":%zu,\"headroom_cap_bytes\":%llu,"
                      "\"resident_subgroups\":%zu,\"iteration_s\":%.4f,"
                      "\"update_s\":%.4f,\"predicted_update_s\":%.4f,\"device_allocs\":%llu,"
                      "\"device_frees\":%llu,\"alloc_retries\":%llu,\"sync_all_streams\":%llu,"
                      "\"gpu_busy_s\":%.4f,\"h2d_busy_s\":%.4f,\"d2h_busy_s\":%.4f,"
                      "\"cpu_busy_s\":%.4f}",
                      k ? "," : "", static_cast<unsigned long long>(b[k].headroom),
                      static_cast<unsigned long long>(b[k].headroom_used), b[k].gpu_subgroups,
                      b[k].buffers, b[k].fallback,
                      static_cast<unsigned long long>(b[k].headroom_cap), b[k].resident,
                      b[k].iteration(), b[k].update, predicted,
                      static_cast<unsigned long long>(b[k].device_allocs),
                      static_cast<unsigned long long>(b[k].device_frees),
                      static_cast<unsigned long long>(b[k].alloc_retries),
                      static_cast<unsigned long long>(b[k].syncs), b[k].gpu_busy, b[k].h2d_busy,
                      b[k].d2h_busy, b[k].cpu_busy);
        states += one;
      }
      const double f = mean(b, &Measured::forward), bw = mean(b, &Measured::backward),
                   u = mean(b, &Measured::update);
      char extra[1024] = "";
      if (c.name == "tide") {
        // Targets (issue 19): within 3% of the best static configuration at the published
        // ratios and strictly faster when memory varies; 2.2x the ZeRO-Offload-style iteration.
        const double target = varying ? 1.0 : 1.03;
        const double over = tide_s / best_static;
        std::snprintf(extra, sizeof extra,
                      ",\"over_best_static\":%.3f,\"best_static\":\"%s\","
                      "\"over_best_static_target\":%.2f,\"over_best_static_met\":%s",
                      over, best_static_name.c_str(), target,
                      (varying ? over < target : over <= target) ? "true" : "false");
        if (zero > 0) {
          const std::size_t used = std::strlen(extra);
          std::snprintf(extra + used, sizeof extra - used,
                        ",\"speedup_over_zero_offload\":%.3f,"
                        "\"speedup_over_zero_offload_published\":%.3f,\"speedup_target\":%.1f",
                        zero / tide_s, zero_published / tide_s, fits ? 3.0 : 2.2);
        }
        if (floor_s > 0) {
          // Issue 28: with the state fitting the held headroom, within 15% of the floor, and 3x
          // the ZeRO-Offload-style iteration.
          const std::size_t used = std::strlen(extra);
          std::snprintf(extra + used, sizeof extra - used,
                        ",\"over_no_offload\":%.3f,\"over_no_offload_target\":1.15,"
                        "\"over_no_offload_met\":%s,\"speedup_over_zero_offload_met\":%s,"
                        "\"speedup_over_zero_offload_published_met\":%s",
                        tide_s / floor_s, tide_s / floor_s <= 1.15 ? "true" : "false",
                        zero / tide_s >= 3 ? "true" : "false",
                        zero_published / tide_s >= 3 ? "true" : "false");
        }
        if (tide_no_residency_s > 0) {
          const std::size_t used = std::strlen(extra);
          std::snprintf(extra + used, sizeof extra - used, ",\"over_tide_no_residency\":%.3f",
                        tide_s / tide_no_residency_s);
        }
      }
      std::size_t resident_min = SIZE_MAX, evicted = 0, pressed = 0, iterations = 0;
      for (const Round& r : runs[i]) {
        for (const Measured& m : r) {
          resident_min = std::min(resident_min, m.resident);
          evicted += m.evicted;
          pressed += m.evicted + m.cache_releases > 0 ? 1 : 0;
          ++iterations;
        }
      }
      {
        // Over every round: the iterations whose passes met pressure from resident state.
        const std::size_t used = std::strlen(extra);
        std::snprintf(extra + used, sizeof extra - used,
                      ",\"resident_subgroups\":%zu,\"resident_subgroups_min\":%zu,"
                      "\"pressured_iterations\":%zu,\"evicted_subgroups\":%zu,"
                      "\"iterations_timed\":%zu",
                      b.back().resident, resident_min, pressed, evicted, iterations);
      }
      const std::string base = c.name.substr(0, c.name.find('@'));
      const std::string dos_best = base == best_dos ? ",\"dos_best\":true" : "";
      const char* planned = c.offload == Offload::none ? "none"
                            : !c.static_headroom       ? "forecast every iteration"
                            : !varying                 ? "measured once"
                            : c.planned_for == 0       ? "the roomy state's"
                                                       : "the tight state's";
      std::printf(
          "{\"bench\":\"iteration\",\"variant\":\"%s\",\"config\":\"%s\",\"headroom\":\"%s\","
          "\"iteration_s\":%.4f,"
          "\"iteration_median_s\":%.4f,\"forward_s\":%.4f,\"backward_s\":%.4f,\"update_s\":%.4f,"
          "\"predicted_iteration_s\":%.4f,\"predicted_forward_s\":%.4f,"
          "\"predicted_backward_s\":%.4f,\"predicted_update_s\":%.4f,"
          "\"forward_over_predicted\":%.3f,\"backward_over_predicted\":%.3f,"
          "\"update_over_predicted\":%.3f,\"by_memory_state\":[%s],\"subgroups\":%zu,"
          "\"params\":%.3g,\"time_scale\":%.4f,\"link_gbps\":%.3f,"
          "\"link_over_published_ratio\":%.3f,\"cpu_update_params_per_s\":%.3g,"
          "\"cpu_update_contended_params_per_s\":%.3g,\"rounds\":%d%s%s,\"machine\":\"%s\"}\n",
          variant.c_str(), (varying ? c.name : base).c_str(), planned, round_s(b), med[i], f, bw, u,
          forward + backward + update, forward, backward, update, f / forward, bw / backward,
          u / update, states.c_str(), kSubgroups, P, tau, w.link / 1e9, w.link / (kPubLink * sigma),
          rates.cpu_update, rates.cpu_update_contended, rounds, extra, dos_best.c_str(), machine);
      std::fflush(stdout);
    }
    // The summary: the ratios the targets check (fits: issue 28's; and everywhere tide without
    // resident subgroups runs, whether they cost anything where they do not engage).
    std::string summary = ",\"tide_iteration_s\":" + std::to_string(tide_s) +
                          ",\"tide_over_best_static\":" + std::to_string(tide_s / best_static);
    if (floor_s > 0) {
      summary += ",\"tide_over_no_offload\":" + std::to_string(tide_s / floor_s) +
                 ",\"tide_over_no_offload_met\":" + (tide_s / floor_s <= 1.15 ? "true" : "false");
    }
    if (zero > 0) {
      const double target = fits ? 3.0 : 2.2;
      summary +=
          ",\"zero_offload_over_tide\":" + std::to_string(zero / tide_s) +
          ",\"zero_offload_over_tide_met\":" + (zero / tide_s >= target ? "true" : "false") +
          ",\"zero_offload_published_over_tide\":" + std::to_string(zero_published / tide_s) +
          ",\"zero_offload_published_over_tide_met\":" +
          (zero_published / tide_s >= target ? "true" : "false") +
          ",\"zero_offload_over_tide_target\":" + std::to_string(target);
    }
    if (tide_no_residency_s > 0) {
      summary += ",\"tide_over_tide_no_residency\":" + std::to_string(tide_s / tide_no_residency_s);
    }
    summary += ",\"tenant_allocations_failed\":" + std::to_string(tenant_failures);
    std::printf("{\"bench\":\"iteration\",\"variant\":\"%s\",\"summary\":true%s}\n",
                variant.c_str(), summary.c_str());
    std::fflush(stdout);
  };
  for (const char* v : {"published", "varying", "varying_tight", "fits", "partial", "shapes"}) {
    for (std::size_t at = 0; (at = variants.find(v, at)) != std::string::npos; at += 1) {
      const std::size_t end = at + std::strlen(v);
      if ((at == 0 || variants[at - 1] == ',') &&
          (end == variants.size() || variants[end] == ',')) {
        run_variant(v);
        break;
      }
    }
  }
  return 0;
}

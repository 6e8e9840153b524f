// tide is a guest in the process (driver/context.h). Driven through libtide.so's C ABI by a caller
// that plays the CUDA runtime's part (runtime.h), every tide call leaves the calling thread with
// the context it had (the runtime's, another device's, or none), the runtime's streams, events
// and memory keep working, no call is made without a context, and once tide's objects are gone
// the primary contexts hold the references the runtime gave them: tide released what it retained,
// exactly.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "tests/abi/runtime.h"
#include "tests/capi_step.h"
#include "tide/tide.h"

namespace tide::abi::testing {
namespace {

// A small model whose bf16 parameters and gradients are the runtime's device memory.
struct Model {
  std::vector<std::uint64_t> sizes{3000, 5000, 4096, 100};
  std::vector<CUdeviceptr> params, grads;

  Model(Runtime& runtime) {
    for (std::uint64_t n : sizes) {
      params.push_back(runtime.allocate(2 * n, 0x3c));  // bf16 0x3c3c
      grads.push_back(runtime.allocate(2 * n, 0x3b));
    }
  }
};

tide_optimizer* create(const Model& model, int device = 0) {
  tide_optimizer_options options;
  options = tide_optimizer_options_default();
  options.device = device;
  std::vector<tide_param_slice> slices;
  for (std::size_t i = 0; i < model.sizes.size(); ++i) {
    slices.push_back({i, 0, model.sizes[i], model.params[i]});
  }
  tide_optimizer* opt = nullptr;
  EXPECT_EQ(tide_optimizer_create(model.sizes.data(), model.sizes.size(), slices.data(),
                                  slices.size(), &options, nullptr, &opt),
            TIDE_OK)
      << tide_last_error();
  return opt;
}

void offload(tide_optimizer* opt, const Model& model, CUstream stream) {
  for (std::size_t i = 0; i < model.sizes.size(); ++i) {
    EXPECT_EQ(tide_optimizer_offload_gradient(opt, i, 0, model.grads[i], model.sizes[i],
                                              TIDE_BFLOAT16, stream),
              TIDE_OK)
        << tide_last_error();
  }
}

// One step with `policy`; it must run as planned, with no fault redone on the CPU.
tide_step_result step(tide_optimizer* opt, tide_placement_policy policy, std::int64_t n = 1) {
  const tide_adam_hyper hyper{1e-3, 0.9, 0.999, 1e-8, 0.01, 1.0, n, 1, 0};
  tide_step_result report = tide_step_result_default();
  EXPECT_EQ(tide::test::step_once(opt, &hyper, &policy, std::uint64_t{1} << 30, &report), TIDE_OK)
      << tide_last_error();
  EXPECT_EQ(report.rolled_forward, 0u) << tide_last_error();
  EXPECT_EQ(report.fallback_subgroups, 0u);
  return report;
}

constexpr tide_placement_policy kPolicies[] = {{TIDE_PLACEMENT_CPU, 0},
                                               {TIDE_PLACEMENT_GPU, 0},
                                               {TIDE_PLACEMENT_INTERLEAVE, 2},
                                               {TIDE_PLACEMENT_AUTO, 0}};

// From its first optimizer on, tide holds one reference to the device's primary context for the
// process's life (its pooled streams live as long: driver/stream_pool.h). Taken here, before a
// test's baseline.
void let_tide_take_its_reference(Runtime& runtime) {
  Model model(runtime);
  tide_optimizer* opt = create(model);
  EXPECT_EQ(tide_optimizer_destroy(opt), TIDE_OK);
}

// What must be as it was once tide's objects are gone: the references (tide's one included), no
// release without a retain, no call without a context, no stream used after its end.
struct Baseline {
  explicit Baseline(Runtime& runtime) {
    let_tide_take_its_reference(runtime);
    at = standin_stats();
  }

  tide_standin_stats at{};

  void expect_restored() const {
    const tide_standin_stats now = standin_stats();
    EXPECT_EQ(now.primary_ctx_references, at.primary_ctx_references);
    EXPECT_EQ(now.primary_ctx_retains - at.primary_ctx_retains,
              now.primary_ctx_releases - at.primary_ctx_releases);
    EXPECT_EQ(now.unretained_releases, at.unretained_releases);
    EXPECT_EQ(now.calls_without_context, at.calls_without_context);
    EXPECT_EQ(now.destroyed_stream_uses, at.destroyed_stream_uses);
  }
};

// One optimizer's whole life through the C ABI on this thread — the device's memory asked,
// made, fed gradients produced on `producer`, two steps with `policy`, its buffers given back,
// its weights written, destroyed — with `observer.usable_here(expected)` after every call.
void live_one_optimizer(const Model& model, const Runtime& observer, CUstream producer,
                        CUcontext expected, tide_placement_policy policy) {
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  EXPECT_EQ(tide_device_memory(0, &free_bytes, &total), TIDE_OK);
  EXPECT_TRUE(observer.usable_here(expected));
  tide_optimizer* opt = create(model);
  ASSERT_NE(opt, nullptr);
  EXPECT_TRUE(observer.usable_here(expected));
  for (std::int64_t n = 1; n <= 2; ++n) {
    offload(opt, model, producer);
    EXPECT_TRUE(observer.usable_here(expected));
    double sum_squares = 0;
    EXPECT_EQ(tide_optimizer_grad_stats(opt, &sum_squares, nullptr), TIDE_OK);
    EXPECT_TRUE(observer.usable_here(expected));
    const tide_step_result report = step(opt, policy, n);
    if (policy.kind == TIDE_PLACEMENT_GPU) {
      EXPECT_EQ(report.gpu_subgroups, model.sizes.size());
    }
    EXPECT_TRUE(observer.usable_here(expected));
  }
  EXPECT_EQ(tide_optimizer_release_buffers(opt), TIDE_OK);
  EXPECT_EQ(tide_optimizer_write_params(opt), TIDE_OK);
  EXPECT_TRUE(observer.usable_here(expected));
  EXPECT_EQ(tide_optimizer_destroy(opt), TIDE_OK);
  EXPECT_TRUE(observer.usable_here(expected));
}

TEST(Guest, EveryPlacementLeavesTheRuntimeAsItWas) {
  Runtime runtime;
  Model model(runtime);
  const Baseline baseline(runtime);
  for (const tide_placement_policy& policy : kPolicies) {
    SCOPED_TRACE("placement " + std::to_string(policy.kind));
    live_one_optimizer(model, runtime, runtime.stream(), runtime.context(), policy);
    baseline.expect_restored();
  }
}

// A thread the runtime never served (a Python thread that has not touched CUDA): tide's calls
// work there and leave it with no context.
TEST(Guest, ACallerWithoutAContextIsLeftWithoutOne) {
  Runtime runtime;
  Model model(runtime);
  const Baseline baseline(runtime);
  std::thread bare(
      [&] { live_one_optimizer(model, runtime, runtime.stream(), nullptr, kPolicies[2]); });
  bare.join();
  EXPECT_TRUE(runtime.usable_here(runtime.context()));
  baseline.expect_restored();
}

// The caller works on device 1 (its context current) and tide's optimizer on device 0: the
// caller's device stays current through every call.
TEST(Guest, ACallerOnAnotherDeviceKeepsItsContext) {
  Runtime zero(0);
  Model model(zero);
  Runtime one(1);  // current on this thread from here on
  const Baseline baseline(zero);
  live_one_optimizer(model, one, zero.stream(), one.context(), kPolicies[1]);
  baseline.expect_restored();
}

// Made on one thread, stepped on another the runtime serves, destroyed on a third that has no
// context (a garbage collector's).
TEST(Guest, AnOptimizerMovesBetweenThreads) {
  Runtime runtime;
  Model model(runtime);
  const Baseline baseline(runtime);
  tide_optimizer* opt = create(model);
  std::thread stepper([&] {
    runtime.enter();
    for (std::int64_t n = 1; n <= 2; ++n) {
      offload(opt, model, runtime.stream());
      step(opt, kPolicies[3], n);
      EXPECT_TRUE(runtime.usable_here(runtime.context()));
    }
  });
  stepper.join();
  std::thread collector([&] {
    EXPECT_EQ(tide_optimizer_destroy(opt), TIDE_OK);
    EXPECT_TRUE(runtime.usable_here(nullptr));
  });
  collector.join();
  EXPECT_TRUE(runtime.usable_here(runtime.context()));
  baseline.expect_restored();
}

TEST(Guest, RefusedCallsChangeNothing) {
  Runtime runtime;
  Model model(runtime);
  const Baseline baseline(runtime);
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  EXPECT_NE(tide_device_memory(7, &free_bytes, &total), TIDE_OK);
  EXPECT_TRUE(runtime.usable_here(runtime.context()));
  tide_optimizer_options options;
  options = tide_optimizer_options_default();
  std::vector<tide_param_slice> slices;
  for (std::size_t i = 0; i < model.sizes.size(); ++i) {
    slices.push_back({i, 0, model.sizes[i], model.params[i]});
  }
  tide_optimizer* opt = nullptr;
  for (auto bad : {+[](tide_optimizer_options& o) { o.device = 7; },
                   +[](tide_optimizer_options& o) { o.state_dtype = 99; },
                   +[](tide_optimizer_options& o) { o.cpu_threads = -1; }}) {
    tide_optimizer_options o = options;
    bad(o);
    EXPECT_NE(tide_optimizer_create(model.sizes.data(), model.sizes.size(), slices.data(),
                                    slices.size(), &o, nullptr, &opt),
              TIDE_OK);
    EXPECT_TRUE(runtime.usable_here(runtime.context()));
  }
  opt = create(model);
  const tide_adam_hyper bad_hyper{-1.0, 0.9, 0.999, 1e-8, 0.0, 1.0, 1, 1, 0};
  offload(opt, model, runtime.stream());
  EXPECT_NE(tide::test::step_once(opt, &bad_hyper, nullptr, 1 << 30, nullptr), TIDE_OK);
  EXPECT_TRUE(runtime.usable_here(runtime.context()));
  EXPECT_EQ(tide_optimizer_destroy(opt), TIDE_OK);
  baseline.expect_restored();
}

// With tide's allocator in the process (PyTorch's, through use_allocator), an optimizer's update
// buffers come from its cache and go back there tagged with the optimizer's streams, and PyTorch
// marks gradients with record_stream on its offload stream. After that optimizer has lived and
// died, the gradient's free and the next optimizer's steps must find those streams alive: on the
// first real GPU they were destroyed, and the next step crashed or failed with
// CUDA_ERROR_INVALID_CONTEXT / CONTEXT_IS_DESTROYED.
TEST(Guest, NoStreamOfAnOptimizerThatDiedIsUsedAfterIt) {
  Runtime runtime;
  Model model(runtime);
  void* warm = tide_alloc(1 << 20, 0, runtime.stream());  // tide's allocator of device 0
  ASSERT_NE(warm, nullptr) << tide_last_error();
  tide_free(warm, 1 << 20, 0, runtime.stream());
  const Baseline baseline(runtime);
  tide_optimizer* first = create(model);
  void* grad = tide_alloc(4096, 0, runtime.stream());
  ASSERT_NE(grad, nullptr) << tide_last_error();
  void* side = nullptr;
  ASSERT_EQ(tide_optimizer_offload_stream(first, &side), TIDE_OK);
  EXPECT_EQ(tide_alloc_record_stream(grad, side), TIDE_OK);  // what tide.torch does per gradient
  offload(first, model, runtime.stream());
  step(first, kPolicies[1]);  // every subgroup through headroom buffers of tide's allocator
  EXPECT_EQ(tide_optimizer_destroy(first), TIDE_OK);
  tide_free(grad, 4096, 0, runtime.stream());  // the gradient outlived the optimizer
  tide_optimizer* next = create(model);
  for (std::int64_t n = 1; n <= 2; ++n) {
    offload(next, model, runtime.stream());
    const tide_step_result report = step(next, kPolicies[1], n);
    EXPECT_EQ(report.gpu_subgroups, model.sizes.size());
  }
  EXPECT_EQ(tide_optimizer_destroy(next), TIDE_OK);
  EXPECT_EQ(tide_alloc_empty_cache(0), TIDE_OK);
  EXPECT_TRUE(runtime.usable_here(runtime.context()));
  baseline.expect_restored();
}

// The allocator PyTorch calls: from the runtime's threads with its streams, freed on a thread
// without a context (a tensor dropped by a garbage collector), its cache emptied from another.
TEST(Guest, TheAllocatorKeepsEveryCallersContext) {
  Runtime runtime;
  const tide_standin_stats before = standin_stats();
  void* a = tide_alloc(4 << 20, 0, runtime.stream());
  void* b = tide_alloc(4096, 0, runtime.stream());
  ASSERT_NE(a, nullptr) << tide_last_error();
  ASSERT_NE(b, nullptr) << tide_last_error();
  EXPECT_TRUE(runtime.usable_here(runtime.context()));
  CUstream other = nullptr;
  ASSERT_EQ(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  EXPECT_EQ(tide_alloc_record_stream(a, other), TIDE_OK);
  std::thread collector([&] {
    tide_free(a, 4 << 20, 0, runtime.stream());
    tide_free(b, 4096, 0, runtime.stream());
    EXPECT_TRUE(runtime.usable_here(nullptr));
    EXPECT_EQ(tide_alloc_empty_cache(0), TIDE_OK);
    EXPECT_TRUE(runtime.usable_here(nullptr));
  });
  collector.join();
  EXPECT_EQ(tide_alloc_empty_cache(0), TIDE_OK);
  tide_alloc_stats stats = tide_alloc_stats_default();
  EXPECT_EQ(tide_alloc_get_stats(0, &stats), TIDE_OK);
  EXPECT_EQ(stats.allocated_bytes[0].current, 0u);
  EXPECT_TRUE(runtime.usable_here(runtime.context()));
  EXPECT_EQ(cuStreamDestroy(other), CUDA_SUCCESS);
  const tide_standin_stats after = standin_stats();
  EXPECT_EQ(after.unretained_releases, before.unretained_releases);
  EXPECT_EQ(after.calls_without_context, before.calls_without_context);
  EXPECT_EQ(after.destroyed_stream_uses, before.destroyed_stream_uses);
  // The allocator keeps its share of the context for the process's life: one reference more.
  EXPECT_LE(after.primary_ctx_references, before.primary_ctx_references + 1);
}

}  // namespace
}  // namespace tide::abi::testing

// Overlap in the update phase, proved by the order of events, never by durations: the stand-in
// driver records every copy and kernel launch (stream, addresses, submitted/started/ended on the
// steady clock) and holds chosen kinds of work until the test lets them through; the executor
// reports when each CPU subgroup's update ran, on the same clock. A hold keeps one piece of GPU
// work from finishing for as long as the test needs, so what the design lets run meanwhile is
// seen to run meanwhile on a machine of any speed, however loaded.
//
// What the design guarantees, and is asserted:
// - Pipelining (two buffers, so two lanes): the next GPU subgroup's copy-in (state and gradient)
//   needs neither the last subgroup's update nor its copy-out; the subgroup after that reuses a
//   buffer, so its copy-in waits for that buffer's copy-out, never for an update on the other
//   lane. With the updates let through one at a time, the copy-in of subgroup i+1 is seen to
//   complete while the update of subgroup i is held; with the copy-outs held, the copy-in and
//   update of subgroup 1 complete while subgroup 0's copy-out is in flight. Whatever runs, no
//   copy-in overwrites a buffer while its copy-out or the write of its new weights still reads
//   it.
// - Chunks (ExecutorOptions::gpu_chunk_params): a subgroup's first chunk is updated and copied
//   out while the copy-in of its later chunks is held, so the link waits for one chunk, not one
//   subgroup, at each end of the pipeline.
// - CPU subgroups do not wait for the GPU side: with every copy-out held, every CPU subgroup is
//   updated and its weights uploaded while the first GPU subgroup's copy-out is in flight
//   (submitted, not done). The GPU side does not wait for the CPU side: the first GPU copy-in is
//   submitted before the first CPU subgroup's weights are.
// - A resident update copies nothing out of its lane: the copied-in subgroup after it on the lane
//   comes in and is updated while every device-to-host copy (the resident one's counter too) is
//   held. Resident updates follow each other with no commit between them, likewise.
// What it does not guarantee, and is only printed: that a CPU update is still running when a
// GPU copy starts. The CPU worker and the coordinating thread start together; the stand-in can
// hold GPU work back but nothing can hold the CPU side, so on a loaded machine the CPU side may
// finish before the coordinator submits its first copy.
//
// The states waited for need no held work, so a correct executor reaches each of them on any
// machine; kHangGuard only bounds how long a broken one (that never gets there) takes to fail.
// The copies are simulated at a modest bandwidth (sleeps) and the GPU update is the kernel's own
// source run on the host: the phase's results are checked against the reference too.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "allocator/memory_resource.h"
#include "kernels/adam_kernel.h"
#include "standin/standin.h"
#include "tests/runtime/executor_fixture.h"

namespace tide::runtime::testing {
namespace {

constexpr std::uint64_t kParams = 1 << 15;
constexpr std::uint64_t kHeadroom = std::uint64_t{1} << 30;
constexpr auto kHangGuard = std::chrono::seconds(60);

using Ops = std::vector<tide_standin_op>;

std::int64_t ns(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

template <typename T>
std::uint64_t address(const T* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

// The stand-in's recording and holds, through the library the driver layer loaded.
class Control {
 public:
  Control() {
    const char* path = std::getenv("TIDE_CUDA_DRIVER");
    if (path == nullptr) throw std::runtime_error("TIDE_CUDA_DRIVER is not set");
    void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);  // kept open, as the driver layer keeps it
    if (handle == nullptr) throw std::runtime_error(std::string("dlopen: ") + dlerror());
    load(handle, record_, "tide_standin_record");
    load(handle, recorded_, "tide_standin_recorded");
    load(handle, hold_, "tide_standin_hold");
    load(handle, release_, "tide_standin_release");
    load(handle, set_bandwidth_, "tide_standin_set_bandwidth");
  }

  void record(std::size_t capacity) const { check(record_(capacity), "record"); }
  Ops ops() const {
    std::size_t n = 0;
    check(recorded_(nullptr, 0, &n, nullptr), "recorded");
    Ops out(n);
    check(recorded_(out.data(), out.size(), &n, nullptr), "recorded");
    out.resize(std::min(n, out.size()));
    return out;
  }
  void hold(unsigned kinds) const { check(hold_(kinds), "hold"); }
  void release(unsigned kinds, std::uint64_t count) const {
    check(release_(kinds, count), "release");
  }
  void release_all() const {
    release_(
        TIDE_STANDIN_OP_H2D | TIDE_STANDIN_OP_D2H | TIDE_STANDIN_OP_D2D | TIDE_STANDIN_OP_KERNEL,
        TIDE_STANDIN_RELEASE_ALL);
  }
  void set_bandwidth(double gbps) const { check(set_bandwidth_(gbps, gbps), "set_bandwidth"); }
  void clear_bandwidth() const noexcept { set_bandwidth_(0, 0); }

  // Waits until `reached(ops())`; false after kHangGuard.
  template <typename Reached>
  bool wait_until(Reached reached) const {
    const auto give_up = std::chrono::steady_clock::now() + kHangGuard;
    while (!reached(ops())) {
      if (std::chrono::steady_clock::now() > give_up) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

 private:
  template <typename F>
  static void load(void* handle, F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(handle, name));
    if (f == nullptr) throw std::runtime_error(std::string("no ") + name);
  }
  static void check(int r, const char* what) {
    if (r != 0) throw std::runtime_error(std::string("tide_standin_") + what + " failed");
  }

  int (*record_)(std::size_t) = nullptr;
  int (*recorded_)(tide_standin_op*, std::size_t, std::size_t*, std::uint64_t*) = nullptr;
  int (*hold_)(unsigned) = nullptr;
  int (*release_)(unsigned, std::uint64_t) = nullptr;
  int (*set_bandwidth_)(double, double) = nullptr;
};

const Control& control() {
  static const Control c;
  return c;
}

// Recorded operations of the phase, by what they carry.
const tide_standin_op* find(const Ops& ops, unsigned kind, std::uint64_t dst, std::uint64_t src) {
  for (const tide_standin_op& op : ops) {
    if (op.kind == kind && (dst == 0 || op.dst == dst) && (src == 0 || op.src == src)) return &op;
  }
  return nullptr;
}
bool ended(const tide_standin_op* op) { return op != nullptr && op->end_ns != 0; }

std::vector<const tide_standin_op*> updates(const Ops& ops) {
  std::vector<const tide_standin_op*> out;
  for (const tide_standin_op& op : ops) {
    if (op.kind == TIDE_STANDIN_OP_KERNEL && std::string(op.name) == kernels::kAdamKernel) {
      out.push_back(&op);
    }
  }
  return out;
}

std::string describe(const Ops& ops) {
  std::string out;
  if (ops.empty()) return out;
  std::int64_t t0 = ops.front().submit_ns;
  for (const tide_standin_op& op : ops) t0 = std::min(t0, op.submit_ns);
  auto us = [t0](std::int64_t t) { return t == 0 ? -1.0 : static_cast<double>(t - t0) / 1e3; };
  for (const tide_standin_op& op : ops) {
    const char* kind = op.kind == TIDE_STANDIN_OP_H2D   ? "h2d"
                       : op.kind == TIDE_STANDIN_OP_D2H ? "d2h"
                       : op.kind == TIDE_STANDIN_OP_D2D ? "d2d"
                                                        : "kernel";
    char line[200];
    std::snprintf(line, sizeof line,
                  "  %-6s stream %#llx %8llu bytes  submitted %9.0f  started %9.0f  ended %9.0f "
                  "us\n",
                  kind, static_cast<unsigned long long>(op.stream),
                  static_cast<unsigned long long>(op.bytes), us(op.submit_ns), us(op.start_ns),
                  us(op.end_ns));
    out += line;
  }
  return out;
}

// A model of `subgroups` subgroups whose gradients are in pinned memory and whose executor is
// ready: nothing the phase does before its first copy waits for work a hold may keep.
struct ReadyModel {
  explicit ReadyModel(std::size_t subgroups, std::uint64_t chunk = kDefaultGpuChunkParams)
      : model(std::vector<std::uint64_t>(subgroups, kParams)), ref(*model.state) {
    standin.set_bandwidth(1);  // sleeping copies, about 0.4 ms for a subgroup's state
    ExecutorOptions options;
    options.rates = test_rates();
    options.refine = false;
    options.cpu_threads = 1;
    options.planner.max_buffers = 2;
    options.gpu_chunk_params = chunk;
    executor = std::make_unique<Executor>(*model.state, options);
    grads = model.make_gradients(1);
    model.offload_all(*executor);
    executor->ready(hyper(1));
    for (std::size_t s = 0; s < subgroups; ++s) state_before.push_back(model.state->param(s));
  }
  ~ReadyModel() { standin.clear_bandwidth(); }

  // Where subgroup s's state was copied in from, and its gradient.
  std::uint64_t state_in(std::size_t s) const { return address(state_before[s]); }
  std::uint64_t grad_in(std::size_t s) const { return address(model.state->grad(s)); }
  // Where its new state was copied out to (committed: its state after the phase).
  std::uint64_t state_out(std::size_t s) const { return address(model.state->param(s)); }
  // The CPU subgroup's new weights, uploaded to the model.
  std::uint64_t weights(std::size_t s) const { return address(model.state->weight_copy(s)); }

  const Control& standin = control();
  const driver::CurrentContext context;
  Model model;
  Reference ref;
  std::unique_ptr<Executor> executor;
  std::vector<std::vector<std::uint16_t>> grads;
  std::vector<const float*> state_before;
};

// Executor::run on a thread of its own, while the test holds and lets through the driver's work.
// Every hold ends before the join, whatever happened to the test.
class PhaseThread {
 public:
  PhaseThread(Executor& executor, const Policy& policy, int step = 1,
              std::uint64_t headroom = kHeadroom)
      : thread_([this, &executor, policy, step, headroom] {
          try {
            report_ = executor.run(hyper(step), policy, headroom);
          } catch (...) {
            error_ = std::current_exception();
          }
        }) {}
  ~PhaseThread() {
    control().release_all();
    if (thread_.joinable()) thread_.join();
  }
  PhaseThread(const PhaseThread&) = delete;
  PhaseThread& operator=(const PhaseThread&) = delete;

  const PhaseReport& join() {
    control().release_all();
    if (thread_.joinable()) thread_.join();
    if (error_) std::rethrow_exception(error_);
    return report_;
  }

 private:
  PhaseReport report_;
  std::exception_ptr error_;
  std::thread thread_;
};

// No copy-in overwrites device memory that a copy submitted before it still reads: a GPU
// buffer's copy-out, or the write of the new weights from it to the model.
void expect_no_copy_in_overwrites_what_is_read(const Ops& ops) {
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const tide_standin_op& in = ops[i];
    if (in.kind != TIDE_STANDIN_OP_H2D) continue;
    for (std::size_t j = 0; j < i; ++j) {
      const tide_standin_op& read = ops[j];
      if (read.kind != TIDE_STANDIN_OP_D2H && read.kind != TIDE_STANDIN_OP_D2D) continue;
      if (read.src < in.dst + in.bytes && in.dst < read.src + read.bytes) {
        EXPECT_LE(read.end_ns, in.start_ns) << "operations " << j << " and " << i << ":\n"
                                            << describe(ops);
      }
    }
  }
}

void expect_complete(const Ops& ops) {
  for (const tide_standin_op& op : ops) ASSERT_NE(op.end_ns, 0) << describe(ops);
}

std::size_t count_ended(const Ops& ops, unsigned kind) {
  return static_cast<std::size_t>(std::count_if(
      ops.begin(), ops.end(),
      [kind](const tide_standin_op& op) { return op.kind == kind && op.end_ns != 0; }));
}

TEST(ExecutorOverlap, AChunkIsUpdatedAndCopiedOutWhileTheNextChunksAreStillComingIn) {
  constexpr std::size_t kChunks = 4;
  // A chunk's copy-in: the master weights and the two moments, then the gradient.
  constexpr std::size_t kInPerChunk = 4;
  constexpr std::size_t kOutPerChunk = 3;  // its master weights and moments
  ReadyModel s(1, kParams / kChunks);
  control().record(4096);
  control().hold(TIDE_STANDIN_OP_H2D);
  PhaseThread phase(*s.executor, Policy::all_gpu());
  control().release(TIDE_STANDIN_OP_H2D, kInPerChunk);  // the first chunk only
  const bool first_out = control().wait_until([&](const Ops& ops) {
    const auto k = updates(ops);
    return !k.empty() && ended(k[0]) && count_ended(ops, TIDE_STANDIN_OP_D2H) >= kOutPerChunk;
  });
  const Ops held = control().ops();
  EXPECT_TRUE(first_out) << "the first chunk was not updated and copied out while the other "
                            "chunks' copy-in was held:\n"
                         << describe(held);
  EXPECT_EQ(count_ended(held, TIDE_STANDIN_OP_H2D), kInPerChunk) << describe(held);
  const auto held_updates = updates(held);
  EXPECT_EQ(std::count_if(held_updates.begin(), held_updates.end(), ended), 1) << describe(held);
  const PhaseReport& report = phase.join();
  const Ops ops = control().ops();
  control().record(0);
  expect_complete(ops);
  EXPECT_EQ(updates(ops).size(), kChunks);  // one launch per chunk
  EXPECT_EQ(report.devices[0], planner::Device::gpu);
  EXPECT_TRUE(report.fault.empty()) << report.fault;
  s.ref.step(s.grads, hyper(1));
  expect_matches(s.model, s.ref);
}

// However small the chunks asked for, a subgroup is at most kMaxGpuChunks launches.
TEST(ExecutorOverlap, ASubgroupIsAtMostTheMostChunks) {
  ReadyModel s(1, kernels::kQuantBlock);  // would be 128 chunks
  static_assert(kParams / kernels::kQuantBlock > kMaxGpuChunks);
  control().record(4096);
  const PhaseReport report = s.executor->run(hyper(1), Policy::all_gpu(), kHeadroom);
  const Ops ops = control().ops();
  control().record(0);
  expect_complete(ops);
  EXPECT_EQ(updates(ops).size(), kMaxGpuChunks);
  EXPECT_TRUE(report.fault.empty()) << report.fault;
  s.ref.step(s.grads, hyper(1));
  expect_matches(s.model, s.ref);
}

TEST(ExecutorOverlap, TheNextGpuSubgroupIsCopiedInWhileTheLastOnesUpdateIsHeld) {
  ReadyModel s(6);
  const planner::Plan plan = s.executor->plan_for(Policy::all_gpu(), kHeadroom);
  ASSERT_EQ(plan.gpu_order.size(), 6u);
  ASSERT_EQ(plan.buffers, 2u);
  const std::vector<std::size_t>& g = plan.gpu_order;
  control().record(4096);
  control().hold(TIDE_STANDIN_OP_KERNEL);
  PhaseThread phase(*s.executor, Policy::all_gpu());
  // Update i is let through only once subgroup i+1 is wholly copied in.
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (i + 1 < g.size()) {
      const bool copied = control().wait_until([&](const Ops& ops) {
        return ended(find(ops, TIDE_STANDIN_OP_H2D, 0, s.state_in(g[i + 1]))) &&
               ended(find(ops, TIDE_STANDIN_OP_H2D, 0, s.grad_in(g[i + 1])));
      });
      EXPECT_TRUE(copied) << "GPU subgroup " << i + 1 << " (of " << g.size()
                          << ") was not copied in while the update of subgroup " << i
                          << " was held:\n"
                          << describe(control().ops());
      if (!copied) break;
    }
    control().release(TIDE_STANDIN_OP_KERNEL, 1);
  }
  const PhaseReport& report = phase.join();
  const Ops ops = control().ops();
  control().record(0);
  expect_complete(ops);

  ASSERT_EQ(report.ran.gpu_order, g);
  const auto kernels = updates(ops);
  ASSERT_EQ(kernels.size(), g.size());  // launched in GPU order, one per subgroup
  for (std::size_t i = 0; i + 1 < g.size(); ++i) {
    const tide_standin_op* state = find(ops, TIDE_STANDIN_OP_H2D, 0, s.state_in(g[i + 1]));
    const tide_standin_op* grad = find(ops, TIDE_STANDIN_OP_H2D, 0, s.grad_in(g[i + 1]));
    ASSERT_TRUE(state && grad);
    EXPECT_LT(state->start_ns, kernels[i]->end_ns) << i;
    EXPECT_LE(grad->end_ns, kernels[i]->start_ns) << i;
    // Its own update follows its copy-in; its copy-out its update.
    const tide_standin_op* out = find(ops, TIDE_STANDIN_OP_D2H, s.state_out(g[i + 1]), 0);
    ASSERT_NE(out, nullptr);
    EXPECT_LE(grad->end_ns, kernels[i + 1]->start_ns);
    EXPECT_LE(kernels[i + 1]->end_ns, out->start_ns);
  }
  expect_no_copy_in_overwrites_what_is_read(ops);
  EXPECT_EQ(report.nonfinite, s.ref.step(s.grads, hyper(1)));
  expect_matches(s.model, s.ref);
}

TEST(ExecutorOverlap, TheNextGpuSubgroupIsCopiedInAndUpdatedWhileTheLastOnesCopyOutIsHeld) {
  ReadyModel s(4);
  const planner::Plan plan = s.executor->plan_for(Policy::all_gpu(), kHeadroom);
  ASSERT_EQ(plan.buffers, 2u);
  const std::vector<std::size_t>& g = plan.gpu_order;
  control().record(4096);
  control().hold(TIDE_STANDIN_OP_D2H);
  PhaseThread phase(*s.executor, Policy::all_gpu());
  const bool updated = control().wait_until([&](const Ops& ops) {
    return ended(find(ops, TIDE_STANDIN_OP_H2D, 0, s.grad_in(g[1]))) && updates(ops).size() >= 2 &&
           ended(updates(ops)[1]);
  });
  EXPECT_TRUE(updated) << "GPU subgroup 1 was not copied in and updated while the copy-out of "
                          "subgroup 0 was held:\n"
                       << describe(control().ops());
  const PhaseReport& report = phase.join();
  const Ops ops = control().ops();
  control().record(0);
  expect_complete(ops);

  ASSERT_EQ(report.ran.gpu_order, g);
  const tide_standin_op* out0 = find(ops, TIDE_STANDIN_OP_D2H, s.state_out(g[0]), 0);
  const tide_standin_op* in1 = find(ops, TIDE_STANDIN_OP_H2D, 0, s.state_in(g[1]));
  ASSERT_TRUE(out0 && in1);
  EXPECT_LT(out0->submit_ns, in1->end_ns);  // in flight: submitted before, ended after
  EXPECT_LE(updates(ops)[1]->end_ns, out0->start_ns) << describe(ops);
  expect_no_copy_in_overwrites_what_is_read(ops);
  EXPECT_EQ(report.nonfinite, s.ref.step(s.grads, hyper(1)));
  expect_matches(s.model, s.ref);
}

TEST(ExecutorOverlap, CpuSubgroupsRunWhileGpuCopiesAreInFlight) {
  ReadyModel s(8);
  const planner::Plan plan = s.executor->plan_for(Policy::every(2), kHeadroom);
  ASSERT_EQ(plan.gpu_order.size(), 4u);
  ASSERT_EQ(plan.cpu_order.size(), 4u);
  control().record(4096);
  control().hold(TIDE_STANDIN_OP_D2H);
  PhaseThread phase(*s.executor, Policy::every(2));
  const bool uploaded = control().wait_until([&](const Ops& ops) {
    return std::all_of(plan.cpu_order.begin(), plan.cpu_order.end(), [&](std::size_t c) {
      return ended(find(ops, TIDE_STANDIN_OP_H2D, 0, s.weights(c)));
    });
  });
  EXPECT_TRUE(uploaded) << "the CPU subgroups were not updated while the GPU copy-outs were held:\n"
                        << describe(control().ops());
  const PhaseReport& report = phase.join();
  const Ops ops = control().ops();
  control().record(0);
  expect_complete(ops);

  ASSERT_EQ(report.ran.gpu_order, plan.gpu_order);
  const std::size_t g0 = plan.gpu_order.front();
  const tide_standin_op* in0 = find(ops, TIDE_STANDIN_OP_H2D, 0, s.state_in(g0));
  const tide_standin_op* out0 = find(ops, TIDE_STANDIN_OP_D2H, s.state_out(g0), 0);
  ASSERT_TRUE(in0 && out0);
  std::size_t strictly = 0;  // CPU updates still running when the first GPU copy started
  for (std::size_t c : plan.cpu_order) {
    const PhaseReport::Span& span = report.cpu_spans[c];
    const tide_standin_op* upload = find(ops, TIDE_STANDIN_OP_H2D, 0, s.weights(c));
    ASSERT_NE(upload, nullptr);
    ASSERT_LT(ns(span.start), ns(span.end));
    EXPECT_LE(ns(span.end), upload->submit_ns);  // the weights go up once updated
    // Updated and uploaded while the first GPU subgroup's copy-out was in flight.
    EXPECT_LT(out0->submit_ns, upload->end_ns) << c;
    EXPECT_LT(upload->end_ns, out0->start_ns) << c;
    EXPECT_LT(ns(span.end), out0->start_ns) << c;
    // The GPU side started without waiting for the CPU side.
    EXPECT_LT(in0->submit_ns, upload->submit_ns) << c;
    if (ns(span.end) > in0->start_ns) ++strictly;
  }
  std::printf("%zu of %zu CPU updates were still running when the first GPU copy started\n",
              strictly, plan.cpu_order.size());
  EXPECT_EQ(report.nonfinite, s.ref.step(s.grads, hyper(1)));
  expect_matches(s.model, s.ref);
}

// Resident updates follow each other on the device: each one's new weights are written behind
// its kernel, not once the host has seen it done, so one lane holds them all back to back. With
// every kernel held, all of the phase's resident updates are seen submitted. Before, each waited
// for the host to commit the last one (a driver callback and a wake-up): on an H200 the update
// phase of 25 resident subgroups took 12.3 ms, twice torch's fused AdamW.
TEST(ExecutorOverlap, ResidentUpdatesAreSubmittedWithoutWaitingForTheLastOnesCommit) {
  constexpr std::size_t kSubgroups = 4;
  const driver::CurrentContext context;
  allocator::DriverResource memory;
  Model model(std::vector<std::uint64_t>(kSubgroups, kParams));
  Reference ref(*model.state);
  ExecutorOptions options = resident_options(memory);
  options.planner.max_buffers = 1;  // one lane
  Executor executor(*model.state, options);
  const auto grads = step_with_room_then_offload(model, executor, ref, kHeadroom);
  ASSERT_EQ(executor.last_report().resident_subgroups, kSubgroups);
  executor.ready(hyper(2));
  control().record(4096);
  control().hold(TIDE_STANDIN_OP_KERNEL);
  PhaseThread phase(executor, Policy::automatic_policy(), 2);
  const bool all =
      control().wait_until([](const Ops& ops) { return updates(ops).size() >= kSubgroups; });
  const Ops held = control().ops();
  EXPECT_TRUE(all) << "the resident updates were not all submitted while the first was held:\n"
                   << describe(held);
  const PhaseReport& report = phase.join();
  const Ops ops = control().ops();
  control().record(0);
  expect_complete(ops);
  ASSERT_TRUE(report.fault.empty()) << report.fault;
  EXPECT_EQ(updates(ops).size(), kSubgroups);
  for (std::size_t s = 0; s < kSubgroups; ++s) {
    EXPECT_TRUE(report.planned.subgroups[s].resident) << s;
    EXPECT_EQ(report.devices[s], planner::Device::gpu) << s;
  }
  EXPECT_TRUE(report.unwritten.empty());
  ref.step(grads, hyper(2));
  executor.sync_state(/*written=*/false);
  expect_matches(model, ref);  // the device weights too
}

// A plan that mixes resident and copied-in subgroups on one lane: the copied-in subgroup after
// a resident one reuses the lane's buffer once the resident kernel is done with it. It does not
// wait for the resident update's counters to reach the host, a copy that queues on the
// device-to-host stream behind other lanes' copy-outs. With every device-to-host copy held, the
// first copied-in subgroup's state comes in and is updated.
TEST(ExecutorOverlap, ACopyInAfterAResidentUpdateWaitsForItsKernelNotItsCopyOut) {
  const driver::CurrentContext context;
  allocator::DriverResource memory;
  Model model(std::vector<std::uint64_t>(kMixedSubgroups, kMixedParams));
  Reference ref(*model.state);
  Executor executor(*model.state, mixed_options(memory));
  const std::uint64_t headroom = mixed_headroom(*model.state);
  const auto grads = step_with_room_then_offload(model, executor, ref, headroom);
  ASSERT_EQ(executor.last_report().resident_subgroups, 2u);
  executor.ready(hyper(2));
  control().record(4096);
  control().hold(TIDE_STANDIN_OP_D2H);
  PhaseThread phase(executor, Policy::automatic_policy(), 2, headroom);
  // The first copied-in subgroup's kernel is the third update; its state's copy-in precedes it.
  const bool updated = control().wait_until([](const Ops& ops) {
    const auto u = updates(ops);
    return std::count_if(u.begin(), u.end(), ended) >= 3;
  });
  const Ops held = control().ops();
  EXPECT_TRUE(updated) << "the copied-in subgroup waited for the resident one's copy-out:\n"
                       << describe(held);
  const PhaseReport& report = phase.join();
  const Ops ops = control().ops();
  control().record(0);
  expect_complete(ops);
  expect_no_copy_in_overwrites_what_is_read(ops);
  // But after the resident kernel before them on the lane (which may read its gradient there):
  // the copied-in subgroups' copy-ins are the only ones (the resident gradients were kept).
  const auto kernels = updates(ops);
  ASSERT_GE(kernels.size(), 3u);
  for (const tide_standin_op& op : ops) {
    if (op.kind == TIDE_STANDIN_OP_H2D) {
      EXPECT_GE(op.start_ns, kernels[1]->end_ns) << describe(ops);
    }
  }
  ASSERT_TRUE(report.fault.empty()) << report.fault;
  std::size_t resident = 0, copied = 0;
  for (std::size_t s = 0; s < kMixedSubgroups; ++s) {
    ASSERT_EQ(report.devices[s], planner::Device::gpu) << s;
    (report.planned.subgroups[s].resident ? resident : copied) += 1;
  }
  EXPECT_EQ(resident, 2u);
  EXPECT_EQ(copied, 2u);
  ref.step(grads, hyper(2));
  executor.sync_state(/*written=*/false);
  expect_matches(model, ref);
}

}  // namespace
}  // namespace tide::runtime::testing

#include "kernels/host/grid.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "kernels/host/fiber.h"
// Last: it defines the CUDA keywords as macros.
#include "kernels/host/cuda_emulation.h"

namespace tide::kernels::host {
namespace {

constexpr unsigned kWarpSize = 32;
// A kernel thread needs little stack (its largest item is its copy of the parameters, under
// 2 KiB), but sanitizer builds widen every frame. Pages are only touched as used.
constexpr std::size_t kStackBytes = std::size_t{256} * 1024;

enum class LaneState : unsigned char { kRunnable, kWaiting, kExited };

const char* collective_name(WarpOp op) {
  return op == WarpOp::kMax ? "__reduce_max_sync" : "__reduce_add_sync";
}

// One thread of the warp that is running.
struct Lane {
  LaneState state = LaneState::kExited;
  uint3 thread_idx{};
  // The collective it waits in, and what it gets from it.
  WarpOp op = WarpOp::kAdd;
  unsigned mask = 0;
  unsigned value = 0;
  unsigned result = 0;
  std::string fault;  // why the thread failed, if it did
};

std::string hex(unsigned mask) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", mask);
  return text;
}

std::string triple(uint3 v) {
  return "(" + std::to_string(v.x) + ", " + std::to_string(v.y) + ", " + std::to_string(v.z) + ")";
}

// Runs launches on one OS thread; each thread that runs kernels keeps one, with its fibers.
class WarpRunner {
 public:
  void run(const HostGrid& grid, KernelThread thread, const void* params);
  unsigned reduce(WarpOp op, unsigned mask, unsigned value);

 private:
  static void lane_task(void* arg);
  void run_warp(unsigned first_thread, unsigned count);
  void step(unsigned lane);
  void complete_collectives();
  std::string where(unsigned lane) const;
  [[noreturn]] void fail(const std::string& message);

  std::array<std::unique_ptr<Fiber>, kWarpSize> fibers_;
  std::array<Lane, kWarpSize> lanes_;
  unsigned lanes_in_warp_ = 0;
  unsigned current_ = 0;
  KernelThread thread_ = nullptr;
  const void* params_ = nullptr;
};

// The runner whose launch runs on this OS thread (its kernel threads reach it from their fibers).
thread_local WarpRunner* t_active = nullptr;

void WarpRunner::run(const HostGrid& grid, KernelThread thread, const void* params) {
  thread_ = thread;
  params_ = params;
  builtins.grid_dim = {grid.grid[0], grid.grid[1], grid.grid[2]};
  builtins.block_dim = {grid.block[0], grid.block[1], grid.block[2]};
  const unsigned threads = grid.block[0] * grid.block[1] * grid.block[2];
  for (unsigned z = 0; z < grid.grid[2]; ++z) {
    for (unsigned y = 0; y < grid.grid[1]; ++y) {
      for (unsigned x = 0; x < grid.grid[0]; ++x) {
        builtins.block_idx = {x, y, z};
        for (unsigned first = 0; first < threads; first += kWarpSize) {
          run_warp(first, std::min(kWarpSize, threads - first));
        }
      }
    }
  }
}

void WarpRunner::lane_task(void* arg) {
  Lane& lane = *static_cast<Lane*>(arg);
  const WarpRunner& runner = *t_active;
  try {
    runner.thread_(runner.params_);
  } catch (const std::exception& e) {
    lane.fault = e.what();
  } catch (...) {
    lane.fault = "an exception that is not a std::exception";
  }
  lane.state = LaneState::kExited;
}

void WarpRunner::run_warp(unsigned first_thread, unsigned count) {
  const uint3 block = builtins.block_dim;
  lanes_in_warp_ = count;
  for (unsigned l = 0; l < count; ++l) {
    const unsigned t = first_thread + l;
    Lane& lane = lanes_[l];
    lane.state = LaneState::kRunnable;
    lane.thread_idx = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
    lane.fault.clear();
  }
  bool waiting = true;
  while (waiting) {
    for (unsigned l = 0; l < count; ++l) {
      if (lanes_[l].state == LaneState::kRunnable) step(l);
    }
    waiting = std::any_of(lanes_.begin(), lanes_.begin() + count,
                          [](const Lane& lane) { return lane.state == LaneState::kWaiting; });
    if (waiting) complete_collectives();
  }
}

// Runs lane `l` until it waits in a collective or exits.
void WarpRunner::step(unsigned l) {
  current_ = l;
  builtins.thread_idx = lanes_[l].thread_idx;
  std::unique_ptr<Fiber>& fiber = fibers_[l];
  if (!fiber) fiber = std::make_unique<Fiber>(kStackBytes);
  if (fiber->idle()) {
    fiber->start(&WarpRunner::lane_task, &lanes_[l]);
  } else {
    fiber->resume();
  }
  if (!lanes_[l].fault.empty()) fail(where(l) + ": " + lanes_[l].fault);
}

// Every thread of the warp has exited or waits: the collectives complete, each over the threads
// its mask names, which must all wait in it.
void WarpRunner::complete_collectives() {
  std::array<bool, kWarpSize> done{};
  for (unsigned l = 0; l < lanes_in_warp_; ++l) {
    if (lanes_[l].state != LaneState::kWaiting || done[l]) continue;
    const unsigned mask = lanes_[l].mask;
    const WarpOp op = lanes_[l].op;
    const std::string name = collective_name(op);
    unsigned result = 0;
    for (unsigned j = 0; j < lanes_in_warp_; ++j) {
      if ((mask >> j & 1u) == 0) continue;
      const Lane& other = lanes_[j];
      if (other.state == LaneState::kExited) {
        fail(where(l) + ": " + name + "(" + hex(mask) + ") names thread " +
             triple(other.thread_idx) + ", which exited without reaching it");
      }
      if (done[j] || other.mask != mask || other.op != op) {
        fail(where(l) + ": " + name + "(" + hex(mask) + ") names thread " +
             triple(other.thread_idx) + ", which waits in " + collective_name(other.op) + "(" +
             hex(other.mask) + ")");
      }
      result = op == WarpOp::kMax ? std::max(result, other.value) : result + other.value;
    }
    for (unsigned j = 0; j < lanes_in_warp_; ++j) {
      if ((mask >> j & 1u) == 0) continue;
      lanes_[j].result = result;
      lanes_[j].state = LaneState::kRunnable;
      done[j] = true;
    }
  }
}

// On the calling lane's fiber.
unsigned WarpRunner::reduce(WarpOp op, unsigned mask, unsigned value) {
  // No object that owns memory may live here across the suspension below: a fault elsewhere in the
  // warp drops this fiber without unwinding it.
  if ((mask >> current_ & 1u) == 0) {
    fault((std::string(collective_name(op)) + "(" + hex(mask) + ") from lane " +
           std::to_string(current_) + ", which the mask leaves out")
              .c_str());
  }
  if (lanes_in_warp_ < kWarpSize && (mask >> lanes_in_warp_) != 0) {
    fault((std::string(collective_name(op)) + "(" + hex(mask) + ") in a warp of " +
           std::to_string(lanes_in_warp_) + " threads names lanes it does not have")
              .c_str());
  }
  Lane& lane = lanes_[current_];
  lane.state = LaneState::kWaiting;
  lane.op = op;
  lane.mask = mask;
  lane.value = value;
  const unsigned self = current_;
  fibers_[self]->suspend();
  return lanes_[self].result;
}

std::string WarpRunner::where(unsigned l) const {
  return "block " + triple(builtins.block_idx) + " thread " + triple(lanes_[l].thread_idx);
}

void WarpRunner::fail(const std::string& message) {
  // The warp's other threads stay suspended mid-kernel: their fibers are dropped, not resumed.
  for (std::unique_ptr<Fiber>& fiber : fibers_) {
    if (fiber && !fiber->idle()) fiber.reset();
  }
  throw KernelFault(message);
}

}  // namespace

void fault(const char* what) { throw KernelFault(what); }

unsigned warp_reduce(WarpOp op, unsigned mask, unsigned value) {
  if (t_active == nullptr) {
    fault((std::string(collective_name(op)) + " outside a kernel launch").c_str());
  }
  return t_active->reduce(op, mask, value);
}

void run_grid(const HostGrid& grid, KernelThread thread, const void* params) {
  if (t_active != nullptr) throw KernelFault("a kernel thread launched a kernel");
  thread_local std::unique_ptr<WarpRunner> runner;
  if (!runner) runner = std::make_unique<WarpRunner>();
  t_active = runner.get();
  try {
    runner->run(grid, thread, params);
  } catch (...) {
    t_active = nullptr;
    throw;
  }
  t_active = nullptr;
}

}  // namespace tide::kernels::host

#include "interpose/counters.h"

namespace tide::interpose {
namespace {

std::atomic<ThreadCounters*> g_blocks{nullptr};
constinit thread_local ThreadCounters* g_mine __attribute__((tls_model("initial-exec"))) = nullptr;

}  // namespace

Counters& Counters::operator+=(const Counters& other) {
  for (std::size_t k = 0; k < kKindCount; ++k) {
    kinds[k].calls += other.kinds[k].calls;
    kinds[k].failures += other.kinds[k].failures;
    kinds[k].bytes += other.kinds[k].bytes;
    kinds[k].allocations += other.kinds[k].allocations;
    kinds[k].allocated_bytes += other.kinds[k].allocated_bytes;
  }
  allocations += other.allocations;
  frees += other.frees;
  limit_rejections += other.limit_rejections;
  limit_rejected_bytes += other.limit_rejected_bytes;
  runtime_fallbacks += other.runtime_fallbacks;
  return *this;
}

ThreadCounters& ThreadCounters::mine() {
  if (g_mine == nullptr) {
    auto* block = new ThreadCounters();  // NOLINT: lives as long as the process
    ThreadCounters* head = g_blocks.load(std::memory_order_relaxed);
    do {
      block->next = head;
    } while (!g_blocks.compare_exchange_weak(head, block, std::memory_order_release,
                                             std::memory_order_relaxed));
    g_mine = block;
  }
  return *g_mine;
}

Counters ThreadCounters::total() {
  Counters sum;
  for (const ThreadCounters* b = g_blocks.load(std::memory_order_acquire); b != nullptr;
       b = b->next) {
    Counters one;
    for (std::size_t k = 0; k < kKindCount; ++k) {
      one.kinds[k].calls = b->kinds[k].calls.load(std::memory_order_relaxed);
      one.kinds[k].failures = b->kinds[k].failures.load(std::memory_order_relaxed);
      one.kinds[k].bytes = b->kinds[k].bytes.load(std::memory_order_relaxed);
      one.kinds[k].allocations = b->kinds[k].allocations.load(std::memory_order_relaxed);
      one.kinds[k].allocated_bytes = b->kinds[k].allocated_bytes.load(std::memory_order_relaxed);
    }
    one.allocations = b->allocations.load(std::memory_order_relaxed);
    one.frees = b->frees.load(std::memory_order_relaxed);
    one.limit_rejections = b->limit_rejections.load(std::memory_order_relaxed);
    one.limit_rejected_bytes = b->limit_rejected_bytes.load(std::memory_order_relaxed);
    one.runtime_fallbacks = b->runtime_fallbacks.load(std::memory_order_relaxed);
    sum += one;
  }
  return sum;
}

void ThreadCounters::reset() {
  for (PerKind& k : kinds) {
    k.calls.store(0, std::memory_order_relaxed);
    k.failures.store(0, std::memory_order_relaxed);
    k.bytes.store(0, std::memory_order_relaxed);
    k.allocations.store(0, std::memory_order_relaxed);
    k.allocated_bytes.store(0, std::memory_order_relaxed);
  }
  allocations.store(0, std::memory_order_relaxed);
  frees.store(0, std::memory_order_relaxed);
  limit_rejections.store(0, std::memory_order_relaxed);
  limit_rejected_bytes.store(0, std::memory_order_relaxed);
  runtime_fallbacks.store(0, std::memory_order_relaxed);
}

void ThreadCounters::reset_all() {
  for (ThreadCounters* b = g_blocks.load(std::memory_order_acquire); b != nullptr; b = b->next) {
    b->reset();
  }
}

}  // namespace tide::interpose

#include "planner/host_memory.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>

#include "kernels/thread_pool.h"

namespace tide::planner {
namespace {

// Elements a thread takes at a time: 1 MiB of each buffer.
constexpr std::size_t kChunk = std::size_t{1} << 18;

}  // namespace

HostMemoryPass::HostMemoryPass(std::uint64_t bytes_per_buffer, unsigned threads)
    : elements_(bytes_per_buffer / sizeof(float)) {
  if (bytes_per_buffer < (std::uint64_t{1} << 20)) {
    throw std::invalid_argument("tide: host memory bandwidth: buffers of at least 1 MiB");
  }
  kernels::ThreadPool& pool = kernels::cpu_pool();
  threads_ = threads == 0 ? pool.size() : std::min(threads, pool.size());
  for (float*& buffer : buffers_) buffer = new float[elements_];
  // Each thread first-touches the chunks it will most likely take (NUMA-local pages).
  pool.run(threads_, [&](unsigned id) {
    for (std::size_t k = id; k * kChunk < elements_; k += threads_) {
      const std::size_t end = std::min(elements_, (k + 1) * kChunk);
      for (std::size_t i = k * kChunk; i < end; ++i) {
        buffers_[0][i] = 1.0f;
        buffers_[1][i] = 2.0f;
        buffers_[2][i] = 0.5f;
        buffers_[3][i] = 0.25f;
      }
    }
  });
}

HostMemoryPass::~HostMemoryPass() {
  for (float* buffer : buffers_) delete[] buffer;
}

double HostMemoryPass::run() {
  std::atomic<std::size_t> next{0};
  const std::size_t chunks = (elements_ + kChunk - 1) / kChunk;
  const auto start = std::chrono::steady_clock::now();
  kernels::cpu_pool().run(threads_, [&](unsigned) {
    for (std::size_t k = next.fetch_add(1); k < chunks; k = next.fetch_add(1)) {
      const std::size_t begin = k * kChunk;
      host_memory_pass(buffers_[0] + begin, buffers_[1] + begin, buffers_[2] + begin,
                       buffers_[3] + begin, 0.999f, std::min(kChunk, elements_ - begin));
    }
  });
  return std::max(1e-9,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

double measure_host_memory(std::uint64_t bytes_per_buffer, int repeats, unsigned threads) {
  if (repeats < 1) throw std::invalid_argument("tide: host memory bandwidth: one repeat at least");
  HostMemoryPass pass(bytes_per_buffer, threads);
  pass.run();  // warm: the pool, the TLB
  double best = 1e300;
  for (int i = 0; i < repeats; ++i) best = std::min(best, pass.run());
  return pass.bytes() / best;
}

}  // namespace tide::planner

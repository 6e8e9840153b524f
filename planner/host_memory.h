// Host memory bandwidth as the CPU update sees it: what `tide calibrate` measures for the rates'
// host_memory (planner/rates.h) and what the memory-bandwidth benchmark (bench/membw.cpp) runs
// as its "adam" kernel.
//
// The pass has the CPU Adam step's access pattern without its arithmetic: three buffers updated
// in place and one read, 28 bytes per element through DRAM (no write-allocate traffic: the line
// written was just read), over buffers far larger than the last-level cache.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tide::planner {

// a[i] = a[i]·s + d[i], and likewise b and c: one element's 28 bytes, in blocks of 128
// elements of each buffer in turn (bursts of 8 cache lines per buffer, as the CPU Adam kernel
// reads them: element by element across the four buffers, the hardware prefetchers keep up with
// far fewer streams on some CPUs, and the pass would measure them, not the memory).
inline void host_memory_pass(float* __restrict a, float* __restrict b, float* __restrict c,
                             const float* __restrict d, float s, std::size_t n) {
  constexpr std::size_t kBlock = 128;
  for (std::size_t i = 0; i < n; i += kBlock) {
    const std::size_t end = n - i < kBlock ? n : i + kBlock;
    for (std::size_t j = i; j < end; ++j) a[j] = a[j] * s + d[j];
    for (std::size_t j = i; j < end; ++j) b[j] = b[j] * s + d[j];
    for (std::size_t j = i; j < end; ++j) c[j] = c[j] * s + d[j];
  }
}
inline constexpr double kHostMemoryPassBytes = 28;  // per element

// Four buffers of `bytes_per_buffer` and the passes over them on the CPU update's thread pool
// (kernels::cpu_pool(), or `threads` of it), the threads taking chunks from a shared counter as
// the CPU Adam kernel's do. Throws std::invalid_argument for buffers under 1 MiB.
class HostMemoryPass {
 public:
  explicit HostMemoryPass(std::uint64_t bytes_per_buffer, unsigned threads = 0);
  ~HostMemoryPass();
  HostMemoryPass(const HostMemoryPass&) = delete;
  HostMemoryPass& operator=(const HostMemoryPass&) = delete;

  // One pass over the buffers: its seconds (wall clock) and bytes through host memory.
  double run();
  double bytes() const { return kHostMemoryPassBytes * static_cast<double>(elements_); }

 private:
  std::size_t elements_;
  unsigned threads_;
  float* buffers_[4] = {};
};

// bytes/s: the best of `repeats` passes after a warm-up one.
double measure_host_memory(std::uint64_t bytes_per_buffer, int repeats, unsigned threads = 0);

}  // namespace tide::planner

// tide_membw: the host's memory bandwidth, measured the way the CPU Adam benchmark needs it.
//
// STREAM-style kernels over arrays far larger than the caches, on N threads. Bandwidth counts
// the bytes the kernel reads plus the bytes it writes, nothing else:
//   copy    b[i] = a[i]                8 bytes per element
//   triad   a[i] = b[i] + s·c[i]       12 bytes per element
//   update  a[i] = a[i]·s + b[i]       12 bytes per element, in place (no write-allocate
//                                      traffic: the line written was just read, as in Adam)
//   adam    a[i] = a[i]·s + d[i],      28 bytes per element: the access pattern of an Adam step
//           b[i] = b[i]·s + d[i],      (one buffer read, three updated in place)
//           c[i] = c[i]·s + d[i]       without its arithmetic
//   adam_burst  the same, 128 elements of a, then of b, then of c: bursts of 8 lines per buffer,
//           as the CPU Adam kernel reads them
// Each kernel runs `reps` times; its best time counts. The JSON line's "gbps" is the best of
// them: the ceiling an update pass over in-place buffers can reach on this machine.
//
// usage: tide_membw [--threads N] [--mib MiB-per-array] [--reps R]   (4 arrays)
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "planner/host_memory.h"

namespace {

// Compiled for the widest vector unit this CPU has (the library itself never does this; a
// measuring tool should not be held back by the baseline's 16-byte loads).
#define TIDE_MEMBW_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

TIDE_MEMBW_CLONES void copy_kernel(const float* __restrict a, float* __restrict b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) b[i] = a[i];
}

TIDE_MEMBW_CLONES void triad_kernel(float* __restrict a, const float* __restrict b,
                                    const float* __restrict c, float s, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

TIDE_MEMBW_CLONES void update_kernel(float* __restrict a, const float* __restrict b, float s,
                                     std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) a[i] = a[i] * s + b[i];
}

TIDE_MEMBW_CLONES void adam_kernel(float* __restrict a, float* __restrict b, float* __restrict c,
                                   const float* __restrict d, float s, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = a[i] * s + d[i];
    b[i] = b[i] * s + d[i];
    c[i] = c[i] * s + d[i];
  }
}

// The same in blocks of 128 elements per buffer: bursts of 8 lines of each buffer at a time, as
// the CPU Adam kernel reads them. The pass `tide calibrate` measures host memory with
// (planner/host_memory.h), here compiled for each vector unit.
TIDE_MEMBW_CLONES void adam_burst_kernel(float* __restrict a, float* __restrict b,
                                         float* __restrict c, const float* __restrict d, float s,
                                         std::size_t n) {
  tide::planner::host_memory_pass(a, b, c, d, s, n);
}

struct Args {
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::size_t mib = 256;
  int reps = 8;
};

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const long value = std::strtol(argv[i + 1], nullptr, 10);
    if (value <= 0) {
      std::fprintf(stderr, "tide_membw: %s needs a positive number\n", key.c_str());
      std::exit(2);
    }
    if (key == "--threads") {
      args.threads = static_cast<unsigned>(value);
    } else if (key == "--mib") {
      args.mib = static_cast<std::size_t>(value);
    } else if (key == "--reps") {
      args.reps = static_cast<int>(value);
    } else {
      std::fprintf(stderr, "usage: tide_membw [--threads N] [--mib MiB] [--reps R]\n");
      std::exit(2);
    }
  }
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  const std::size_t n = args.mib * (std::size_t{1} << 20) / sizeof(float);
  // Uninitialised on purpose: each thread first-touches its own slice.
  std::unique_ptr<float[]> a(new float[n]), b(new float[n]), c(new float[n]), d(new float[n]);
  const unsigned t = args.threads;
  constexpr int kKernels = 5;
  const char* names[kKernels] = {"copy", "triad", "update", "adam", "adam_burst"};
  const double bytes_per_element[kKernels] = {8, 12, 12, 28, 28};
  double best[kKernels] = {1e30, 1e30, 1e30, 1e30, 1e30};
  // Every thread runs every repetition of every kernel between barriers; thread 0 times them.
  // Within a repetition the threads take chunks of 256 Ki elements from a shared counter, as the
  // CPU Adam kernel's threads do: a thread slowed down by other work then holds nobody up, and
  // the measurement is of the memory, not of the slowest thread.
  constexpr std::size_t kChunk = std::size_t{1} << 18;
  const std::size_t chunks = (n + kChunk - 1) / kChunk;
  std::atomic<std::size_t> next{0};
  std::barrier sync(static_cast<std::ptrdiff_t>(t));
  auto run = [&](int kernel, std::size_t begin, std::size_t len) {
    switch (kernel) {
      case 0:
        copy_kernel(a.get() + begin, b.get() + begin, len);
        break;
      case 1:
        triad_kernel(a.get() + begin, b.get() + begin, c.get() + begin, 0.999f, len);
        break;
      case 2:
        update_kernel(a.get() + begin, b.get() + begin, 0.999f, len);
        break;
      case 3:
        adam_kernel(a.get() + begin, b.get() + begin, c.get() + begin, d.get() + begin, 0.999f,
                    len);
        break;
      default:
        adam_burst_kernel(a.get() + begin, b.get() + begin, c.get() + begin, d.get() + begin,
                          0.999f, len);
        break;
    }
  };
  auto worker = [&](unsigned id) {
    for (std::size_t i = n * id / t; i < n * (id + 1) / t; ++i) {
      a[i] = 1.0f;
      b[i] = 2.0f;
      c[i] = 0.5f;
      d[i] = 0.25f;
    }
    for (int kernel = 0; kernel < kKernels; ++kernel) {
      for (int rep = 0; rep < args.reps; ++rep) {
        if (id == 0) next = 0;
        sync.arrive_and_wait();
        const auto start = std::chrono::steady_clock::now();
        for (std::size_t k = next.fetch_add(1); k < chunks; k = next.fetch_add(1)) {
          run(kernel, k * kChunk, std::min(kChunk, n - k * kChunk));
        }
        sync.arrive_and_wait();
        if (id == 0) {
          const double s =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          best[kernel] = std::min(best[kernel], s);
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (unsigned id = 1; id < t; ++id) threads.emplace_back(worker, id);
  worker(0);
  for (auto& th : threads) th.join();

  double gbps[kKernels], top = 0;
  for (int k = 0; k < kKernels; ++k) {
    gbps[k] = bytes_per_element[k] * static_cast<double>(n) / best[k] / 1e9;
    top = std::max(top, gbps[k]);
  }
  std::printf(
      "{\"bench\":\"membw\",\"threads\":%u,\"array_mib\":%zu,\"reps\":%d,\"%s_gbps\":%.2f,"
      "\"%s_gbps\":%.2f,\"%s_gbps\":%.2f,\"%s_gbps\":%.2f,\"%s_gbps\":%.2f,\"gbps\":%.2f}\n",
      t, args.mib, args.reps, names[0], gbps[0], names[1], gbps[1], names[2], gbps[2], names[3],
      gbps[3], names[4], gbps[4], top);
  // Keeps the stores observable.
  return a[n / 2] == 12345.0f ? 3 : 0;
}

// bench_allocator: the device caching allocator's benchmark (`make bench BENCH=allocator`).
//
// Prints JSON lines:
//  - {"bench":"machine", ...}: where it ran.
//  - {"bench":"alloc_pair","impl":"tide"|"glibc","threads":N,"ns_per_pair":X, ...}: a cached
//    allocate+free pair (the same cycle of 16 sizes from 512 B to 1 MiB, log-uniform, for both),
//    measured in the same run, interleaved, best of several rounds (the machine may be shared).
//    "tide_no_thread_cache" is tide's locked core alone (TIDE_ALLOC_THREAD_CACHE=0), and
//    "alloc_pair_large" the same for 16 sizes from 1 MiB to 64 MiB (tide's core; glibc mmaps).
//    Each line gives the cycle's working set, the per-thread cache's capacity and the fraction of
//    small allocations the caches served: the sizes add up to 4.2 MiB, over the default 4 MiB,
//    so one pair in 16 goes through the core's lock.
//    "alloc_pair_in_cache" is the same cycle with each thread's cache holding all of it: the
//    thread-cache path alone, which is what two threads must not slow down.
//  - {"bench":"replay","trace":NAME,"peak_reserved_over_live":X,"driver_allocs_after_iter2":N,
//    ...}: generated transformer training traces (allocator/telemetry/synthetic_trace.h), 20
//    iterations each, replayed through a fresh allocator configured by the TIDE_ALLOC_* variables.
//    Driver allocation calls are counted by the allocator and, on the stand-in driver, by the
//    stand-in's own statistics (tide_standin_get_stats: cuMemAlloc + cuMemCreate).
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "allocator/device/caching_allocator.h"
#include "allocator/device/trace_replay.h"
#include "allocator/telemetry/synthetic_trace.h"
#include "driver/context.h"
#include "driver/cuda_api.h"
#include "standin/standin.h"

namespace {

using tide::allocator::device::AllocatorConfig;
using tide::allocator::device::CachingAllocator;

constexpr int kRounds = 7;
constexpr int kPairsPerRound = 400'000;

std::vector<std::size_t> log_uniform_sizes(std::size_t lo, std::size_t hi, int n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(std::log2(static_cast<double>(lo)),
                                           std::log2(static_cast<double>(hi)));
  std::vector<std::size_t> sizes;
  sizes.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) sizes.push_back(static_cast<std::size_t>(std::exp2(d(rng))));
  return sizes;
}

struct PairTime {
  double wall_ns = 1e300;  // per pair, per thread (mean over threads)
  double cpu_ns = 1e300;   // the same in thread CPU time: without time spent descheduled
  void keep_best(const PairTime& t) {
    wall_ns = std::min(wall_ns, t.wall_ns);
    cpu_ns = std::min(cpu_ns, t.cpu_ns);
  }
};

double thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

// `pair(size)` over the cycle of sizes, on `threads` threads at once.
template <typename Pair>
PairTime time_pairs(int threads, const std::vector<std::size_t>& sizes, int pairs, Pair&& pair) {
  std::vector<PairTime> times(static_cast<std::size_t>(threads));
  std::atomic<int> ready{0};
  std::vector<std::thread> workers;
  workers.reserve(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (std::size_t s : sizes) pair(s);  // warm: every size cached
      ready.fetch_add(1);
      while (ready.load() < threads) {
      }
      const auto start = std::chrono::steady_clock::now();
      const double cpu_start = thread_cpu_ns();
      for (int i = 0; i < pairs; ++i) pair(sizes[static_cast<std::size_t>(i) % sizes.size()]);
      const double cpu_end = thread_cpu_ns();
      const auto end = std::chrono::steady_clock::now();
      PairTime& out = times[static_cast<std::size_t>(t)];
      out.wall_ns = std::chrono::duration<double, std::nano>(end - start).count() / pairs;
      out.cpu_ns = (cpu_end - cpu_start) / pairs;
    });
  }
  for (auto& w : workers) w.join();
  PairTime mean{0, 0};
  for (const PairTime& t : times) {
    mean.wall_ns += t.wall_ns / threads;
    mean.cpu_ns += t.cpu_ns / threads;
  }
  return mean;
}

void glibc_pair(std::size_t size) {
  void* p = std::malloc(size);
  asm volatile("" : : "r"(p) : "memory");  // the pair must not be optimised away
  std::free(p);
}

// The bytes the cycle keeps cached: each size rounded as the allocator rounds it (512 bytes).
std::size_t working_set(const std::vector<std::size_t>& sizes) {
  std::size_t total = 0;
  for (std::size_t s : sizes) total += (s + 511) / 512 * 512;
  return total;
}

// `cache_all`: each thread's cache is made large enough for the whole cycle.
void pair_benchmark(const char* bench, const std::vector<std::size_t>& sizes,
                    const char* sizes_text, bool cache_all = false) {
  AllocatorConfig cached = AllocatorConfig::from_environment();
  if (cache_all)
    cached.thread_cache_bytes = std::max(cached.thread_cache_bytes, working_set(sizes));
  AllocatorConfig uncached = cached;
  uncached.thread_cache_bytes = 0;
  CachingAllocator with_cache(0, cached);
  CachingAllocator core_only(0, uncached);
  auto tide_pair = [](CachingAllocator& a) {
    return [&a](std::size_t size) {
      void* p = a.allocate(size, nullptr);
      asm volatile("" : : "r"(p) : "memory");
      a.deallocate(p, size, nullptr);
    };
  };
  for (int threads : {1, 2}) {
    PairTime tide;
    PairTime core;
    PairTime glibc;
    with_cache.reset_accumulated_stats();
    for (int round = 0; round < kRounds; ++round) {  // interleaved: the same machine state
      tide.keep_best(time_pairs(threads, sizes, kPairsPerRound, tide_pair(with_cache)));
      glibc.keep_best(time_pairs(threads, sizes, kPairsPerRound, glibc_pair));
      core.keep_best(time_pairs(threads, sizes, kPairsPerRound / 4, tide_pair(core_only)));
    }
    // Of tide's small allocations (warm-up ones included), those its threads' caches served.
    const auto stats = with_cache.stats();
    const std::uint64_t small = stats.allocation[tide::allocator::device::kSmallPool].allocated;
    const double hit_fraction =
        small == 0 ? 0.0
                   : static_cast<double>(stats.thread_cache_hits) / static_cast<double>(small);
    struct Line {
      const char* impl;
      PairTime t;
      std::size_t thread_cache_bytes;  // per thread (0: none; glibc has its own)
      double hit_fraction;
    };
    for (const Line& l :
         {Line{"glibc", glibc, 0, 0}, Line{"tide", tide, cached.thread_cache_bytes, hit_fraction},
          Line{"tide_no_thread_cache", core, 0, 0}}) {
      std::printf(
          "{\"bench\":\"%s\",\"impl\":\"%s\",\"threads\":%d,\"ns_per_pair\":%.1f,"
          "\"cpu_ns_per_pair\":%.1f,\"sizes\":\"%s\",\"working_set_bytes\":%zu,"
          "\"rounds\":%d,\"statistic\":\"best\"",
          bench, l.impl, threads, l.t.wall_ns, l.t.cpu_ns, sizes_text, working_set(sizes), kRounds);
      if (std::string_view(l.impl) != "glibc") {
        std::printf(
            ",\"thread_cache_bytes\":%zu,\"thread_cache_hit_fraction\":%.4f,"
            "\"over_glibc\":%.2f,\"cpu_over_glibc\":%.2f",
            l.thread_cache_bytes, l.hit_fraction, l.t.wall_ns / glibc.wall_ns,
            l.t.cpu_ns / glibc.cpu_ns);
      }
      std::printf("}\n");
    }
    std::fflush(stdout);
  }
}

// The stand-in driver's allocation counter, when tide runs on the stand-in.
class StandinCounter {
 public:
  StandinCounter() {
    const std::string& library = tide::driver::cuda().library;
    handle_ = dlopen(library.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (handle_ != nullptr) {
      get_ =
          reinterpret_cast<void (*)(tide_standin_stats*)>(dlsym(handle_, "tide_standin_get_stats"));
    }
  }
  bool available() const { return get_ != nullptr; }
  std::uint64_t allocations() const {
    tide_standin_stats s{};
    if (get_ != nullptr) get_(&s);
    return s.device_allocs + s.mem_creates;
  }

 private:
  void* handle_ = nullptr;
  void (*get_)(tide_standin_stats*) = nullptr;
};

void replay_benchmark() {
  const StandinCounter standin;
  for (const auto& shape : tide::allocator::telemetry::standard_shapes()) {
    tide::allocator::telemetry::SyntheticOptions options;
    options.iterations = 20;
    const auto gen = tide::allocator::telemetry::generate_transformer_trace(shape, options);
    const auto& events = gen.trace.events;
    // Split at the second iteration's end mark.
    std::size_t split = events.size();
    int ends = 0;
    for (std::size_t i = 0; i < events.size(); ++i) {
      if (events[i].op == tide::allocator::telemetry::TraceOp::kMark &&
          events[i].mark == tide::allocator::telemetry::Mark::kIterationEnd && ++ends == 2) {
        split = i + 1;
        break;
      }
    }
    CachingAllocator a(0, AllocatorConfig::from_environment());
    tide::allocator::device::Replayer replayer(a);
    const std::uint64_t standin_start = standin.allocations();
    replayer.run({events.data(), split});
    const std::uint64_t standin_iter2 = standin.allocations();
    replayer.run({events.data() + split, events.size() - split});
    const std::uint64_t standin_end = standin.allocations();
    const tide::allocator::device::ReplayResult r = replayer.finish();
    const auto& at_end = r.device_allocs_at_end;
    const std::uint64_t after1 = at_end.empty() ? 0 : r.device_allocs - at_end[0];
    const std::uint64_t after2 = at_end.size() < 2 ? 0 : r.device_allocs - at_end[1];
    const std::uint64_t allocs_after1 =
        r.allocations_at_end.empty() ? 0 : r.allocations - r.allocations_at_end[0];
    const double gib = 1024.0 * 1024.0 * 1024.0;
    std::printf(
        "{\"bench\":\"replay\",\"trace\":\"%s\",\"iterations\":%d,"
        "\"peak_reserved_over_live\":%.4f,\"peak_reserved_over_requested\":%.4f,"
        "\"driver_allocs_after_iter2\":%llu,\"driver_allocs_per_1000_after_iter1\":%.3f,"
        "\"driver_allocs_total\":%llu,\"standin_driver_allocs_after_iter2\":%s,"
        "\"standin_driver_allocs_total\":%s,\"peak_live_gib\":%.3f,\"peak_reserved_gib\":%.3f,"
        "\"allocations\":%llu,\"failed_allocations\":%llu,\"growable\":%s,"
        "\"replay_seconds\":%.3f}\n",
        shape.name.c_str(), options.iterations,
        static_cast<double>(r.peak_reserved) / static_cast<double>(r.peak_live),
        static_cast<double>(r.peak_reserved) / static_cast<double>(r.peak_requested),
        static_cast<unsigned long long>(after2),
        allocs_after1 == 0
            ? 0.0
            : 1000.0 * static_cast<double>(after1) / static_cast<double>(allocs_after1),
        static_cast<unsigned long long>(r.device_allocs),
        standin.available() ? std::to_string(standin_end - standin_iter2).c_str() : "null",
        standin.available() ? std::to_string(standin_end - standin_start).c_str() : "null",
        static_cast<double>(r.peak_live) / gib, static_cast<double>(r.peak_reserved) / gib,
        static_cast<unsigned long long>(r.allocations),
        static_cast<unsigned long long>(r.failed_allocations),
        a.stats().growable != 0 ? "true" : "false", r.seconds);
    std::fflush(stdout);
  }
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

int run() {
  // gpt-1.3b peaks near 7 GiB: give the stand-in room if nobody chose its size (a real driver
  // ignores this variable).
  setenv("TIDE_STANDIN_MEMORY", "16GiB", 0);
  const tide::driver::CurrentContext context(0);
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  tide::driver::cuda().cuMemGetInfo(&free_bytes, &total);
  std::string cpu = cpu_model();
  std::string driver = tide::driver::cuda().library;
  for (std::string* s : {&cpu, &driver}) {
    std::replace(s->begin(), s->end(), '"', '\'');
  }
  std::printf(
      "{\"bench\":\"machine\",\"cpu\":\"%s\",\"cores\":%u,\"driver\":\"%s\",\"device\":\"%s\","
      "\"device_memory_gib\":%.1f}\n",
      cpu.c_str(), std::thread::hardware_concurrency(), driver.c_str(),
      tide::driver::device_name(0).c_str(), static_cast<double>(total) / (1u << 30));
  std::fflush(stdout);
  const std::vector<std::size_t> small = log_uniform_sizes(512, 1u << 20, 16, 1);
  pair_benchmark("alloc_pair", small, "16 sizes, 512B-1MiB");
  pair_benchmark("alloc_pair_in_cache", small, "16 sizes, 512B-1MiB", true);
  pair_benchmark("alloc_pair_large", log_uniform_sizes(1u << 20, 64u << 20, 16, 2),
                 "16 sizes, 1MiB-64MiB");
  replay_benchmark();
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {  // no driver, no device: said, not an abort
    std::fprintf(stderr, "bench_allocator: %s\n", e.what());
    return 1;
  }
}

// Many threads allocating and freeing at once (run under TSan too: label `concurrency`): no
// block is ever handed out twice, frees from other threads and streams work, the thread caches
// are emptied when their threads exit, and at the end every byte goes back to the driver.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "allocator/device/caching_allocator.h"
#include "driver/context.h"
#include "driver/stream.h"
#include "tests/allocator/device_standin.h"

namespace tide::allocator::device {
namespace {

using telemetry::Mark;

constexpr std::size_t kMiB = std::size_t{1} << 20;

// Every range handed out and not yet freed; an overlap is a block handed out twice.
class LiveRanges {
 public:
  void add(void* p, std::size_t size) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    const std::lock_guard lock(mutex_);
    auto next = ranges_.lower_bound(a);
    if (next != ranges_.end() && next->first < a + size) ++overlaps_;
    if (next != ranges_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second > a) ++overlaps_;
    }
    ranges_[a] = size;
  }
  void remove(void* p) {
    const std::lock_guard lock(mutex_);
    ranges_.erase(reinterpret_cast<std::uintptr_t>(p));
  }
  int overlaps() const {
    const std::lock_guard lock(mutex_);
    return overlaps_;
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, std::size_t> ranges_;
  int overlaps_ = 0;
};

struct Held {
  void* ptr;
  std::size_t size;
  CUstream stream;
};

// Blocks handed from one thread to another, to be freed there.
class Mailbox {
 public:
  void put(Held h) {
    const std::lock_guard lock(mutex_);
    items_.push_back(h);
  }
  bool take(Held* h) {
    const std::lock_guard lock(mutex_);
    if (items_.empty()) return false;
    *h = items_.back();
    items_.pop_back();
    return true;
  }

 private:
  std::mutex mutex_;
  std::vector<Held> items_;
};

void run_stress(const AllocatorConfig& config, int threads, int ops) {
  const driver::CurrentContext context(0);
  testing::DeviceStandin standin;
  const std::uint64_t in_use = standin.bytes_in_use();
  {
    CachingAllocator a(0, config);
    LiveRanges ranges;
    Mailbox mailbox;
    std::atomic<int> failures{0};
    std::atomic<bool> done{false};
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        const driver::ContextScope scope(context.context());
        driver::Stream own;
        std::mt19937 rng(static_cast<unsigned>(t) * 7919u + 1);
        std::vector<Held> held;
        for (int i = 0; i < ops; ++i) {
          const int action = static_cast<int>(rng() % 10);
          if (action < 5 || held.empty()) {
            // Mostly small sizes, some large: log-uniform from 256 B to 8 MiB.
            const double e = std::uniform_real_distribution<double>(8, 23)(rng);
            const auto size = static_cast<std::size_t>(std::exp2(e));
            const CUstream s = (rng() % 2 == 0) ? nullptr : own.get();
            void* p = a.allocate(size, s);
            if (p == nullptr) {
              ++failures;
              continue;
            }
            ranges.add(p, size);
            held.push_back({p, size, s});
          } else if (action < 9) {
            const std::size_t k = rng() % held.size();
            ranges.remove(held[k].ptr);
            a.deallocate(held[k].ptr, held[k].size, held[k].stream);
            held[k] = held.back();
            held.pop_back();
          } else {
            // Hand one to another thread; free one handed to us.
            const std::size_t k = rng() % held.size();
            mailbox.put(held[k]);
            held[k] = held.back();
            held.pop_back();
            Held h;
            if (mailbox.take(&h)) {
              ranges.remove(h.ptr);
              a.deallocate(h.ptr, h.size, h.stream);
            }
          }
        }
        for (const Held& h : held) {
          ranges.remove(h.ptr);
          a.deallocate(h.ptr, h.size, h.stream);
        }
        own.synchronize();
      });
    }
    // Meanwhile: statistics, marks and cache releases from another thread.
    std::thread observer([&] {
      const driver::ContextScope scope(context.context());
      while (!done.load()) {
        (void)a.stats();
        a.mark(Mark::kIterationEnd);
        a.empty_cache();
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });
    for (auto& w : workers) w.join();
    done = true;
    observer.join();
    Held h;
    while (mailbox.take(&h)) {
      ranges.remove(h.ptr);
      a.deallocate(h.ptr, h.size, h.stream);
    }
    EXPECT_EQ(ranges.overlaps(), 0) << "a block was handed out twice";
    EXPECT_EQ(failures.load(), 0);
    AllocatorStats s = a.stats();
    EXPECT_EQ(s.allocated_bytes[kAllPools].current, 0u);
    EXPECT_EQ(s.allocation[kAllPools].current, 0u);
    EXPECT_EQ(s.thread_cached_bytes, 0u);  // the workers' caches went back when they exited
    a.empty_cache();
    s = a.stats();
    EXPECT_EQ(s.reserved_bytes[kAllPools].current, 0u)
        << "small " << s.reserved_bytes[kSmallPool].current << " large "
        << s.reserved_bytes[kLargePool].current << " free blocks' largest " << s.largest_free_block
        << " inactive split " << s.inactive_split_bytes[kAllPools];
    EXPECT_EQ(s.segment[kSmallPool].current, 0u);
  }
  EXPECT_EQ(standin.bytes_in_use(), in_use) << "device memory left behind";
}

TEST(AllocatorStressTest, ThreadsWithThreadCaches) {
  AllocatorConfig c;
  c.thread_cache_bytes = 2 * kMiB;
  run_stress(c, 4, 20000);
}

TEST(AllocatorStressTest, ThreadsWithoutThreadCachesOnFixedSegments) {
  AllocatorConfig c;
  c.thread_cache_bytes = 0;
  c.growable = false;
  run_stress(c, 4, 20000);
}

}  // namespace
}  // namespace tide::allocator::device

// Pinned host arenas through the host stand-in driver (TIDE_CUDA_DRIVER is set by the test):
// what is registered, when, and that nothing handed out lies outside a registration.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "allocator/pinned/arena.h"
#include "allocator/pinned/chunk_hooks.h"
#include "allocator/pinned/chunks.h"
#include "allocator/pinned/memory.h"
#include "allocator/pinned/registration.h"
#include "config/env.h"
#include "driver/error.h"
#include "tests/allocator/device_standin.h"

namespace tide::allocator::pinned {
namespace {

using testing::DeviceStandin;

// Small chunks so that a test of a few MiB makes and releases many of them.
PinnedOptions small_options() {
  PinnedOptions o;
  o.chunk_bytes = 8 * kMiB;  // dedicated buffers: from 128 KiB
  o.direct_bytes = 64 * 1024;
  o.retain_bytes = 0;
  o.touch_threads = 2;
  return o;
}

bool mapped(const void* p) {
  unsigned char v = 0;
  return mincore(const_cast<void*>(p), kPage, &v) == 0 || errno != ENOMEM;
}

struct Block {
  void* p;
  std::size_t bytes;
};

// Sizes across every path: jemalloc small and large classes, direct buffers in regular chunks,
// dedicated chunks.
std::size_t random_size(std::mt19937_64& rng) {
  switch (rng() % 4) {
    case 0:
      return 1 + rng() % 4096;
    case 1:
      return 4096 + rng() % (60 * 1024);
    case 2:
      return 64 * 1024 + rng() % (448 * 1024);
    default:
      return 512 * 1024 + rng() % (3 * kMiB);
  }
}

class PinnedArenaTest : public ::testing::Test {
 protected:
  DeviceStandin standin_;
};

TEST_F(PinnedArenaTest, EveryPointerLiesInsideOneRegistration) {
  PinnedOptions o = small_options();
  o.retain_bytes = 16 * kMiB;  // fewer chunks made and unmade: faster, the same check
  PinnedArena arena(o);
  ASSERT_TRUE(arena.pinned());
  std::mt19937_64 rng(42);
  std::vector<Block> live;
  for (int i = 0; i < 2000; ++i) {
    if (!live.empty() && rng() % 5 < 2) {
      const std::size_t k = rng() % live.size();
      arena.deallocate(live[k].p, live[k].bytes);
      live[k] = live.back();
      live.pop_back();
      continue;
    }
    const std::size_t bytes = random_size(rng);
    const std::size_t alignment = std::size_t{1} << (rng() % 13);  // 1 B to 4 KiB
    void* p = arena.allocate(bytes, alignment);
    ASSERT_NE(p, nullptr);
    ASSERT_EQ(reinterpret_cast<std::uintptr_t>(p) % alignment, 0u);
    ASSERT_TRUE(standin_.registered(p, bytes)) << "allocation " << i << " of " << bytes;
    static_cast<char*>(p)[0] = 1;  // mapped and writable, both ends
    static_cast<char*>(p)[bytes - 1] = 1;
    live.push_back({p, bytes});
  }
  for (const Block& b : live) arena.deallocate(b.p, b.bytes);
  EXPECT_EQ(arena.stats().requested_bytes, 0u);
}

TEST_F(PinnedArenaTest, EveryChunkIsRegisteredOnceAndUnregisteredOnce) {
  const tide_standin_stats before = standin_.stats();
  std::uint64_t mapped_chunks = 0;
  {
    PinnedArena arena(small_options());
    std::mt19937_64 rng(7);
    std::vector<Block> live;
    for (int round = 0; round < 4; ++round) {
      for (int i = 0; i < 200; ++i) {
        const std::size_t bytes = random_size(rng);
        live.push_back({arena.allocate(bytes), bytes});
      }
      // Each chunk the arena holds is exactly one registration: same start, same size.
      for (const ChunkInfo& c : arena.chunks()) {
        const auto range = standin_.registered_range(c.base);
        ASSERT_TRUE(range.has_value());
        EXPECT_EQ(range->base, reinterpret_cast<std::uintptr_t>(c.base));
        EXPECT_EQ(range->size, c.bytes);
      }
      // Free most of it: with retain 0, chunks that empty are unregistered at once.
      std::shuffle(live.begin(), live.end(), rng);
      while (live.size() > 20) {
        arena.deallocate(live.back().p, live.back().bytes);
        live.pop_back();
      }
    }
    const PinnedStats s = arena.stats();
    const tide_standin_stats during = standin_.stats();
    EXPECT_GT(s.chunks_released, 0u);
    EXPECT_EQ(during.host_registers - before.host_registers, s.chunks_mapped);
    EXPECT_EQ(during.host_unregisters - before.host_unregisters, s.chunks_released);
    EXPECT_EQ(during.registered_host_bytes - before.registered_host_bytes, s.pinned_bytes);
    EXPECT_EQ(s.unregister_failures, 0u);
    mapped_chunks = s.chunks_mapped;
    for (const Block& b : live) arena.deallocate(b.p, b.bytes);
  }
  const tide_standin_stats after = standin_.stats();
  EXPECT_EQ(after.host_registers - before.host_registers, mapped_chunks);
  EXPECT_EQ(after.host_unregisters - before.host_unregisters, mapped_chunks);
  EXPECT_EQ(after.registered_host_bytes, before.registered_host_bytes);
}

TEST_F(PinnedArenaTest, DestroyReleasesEverythingStillAllocated) {
  const tide_standin_stats before = standin_.stats();
  std::vector<ChunkInfo> chunks;
  {
    PinnedArena arena(small_options());
    std::mt19937_64 rng(3);
    for (int i = 0; i < 300; ++i) arena.allocate(random_size(rng));  // never freed
    chunks = arena.chunks();
    ASSERT_GT(chunks.size(), 2u);
    for (const ChunkInfo& c : chunks) EXPECT_TRUE(mapped(c.base));
  }
  const tide_standin_stats after = standin_.stats();
  EXPECT_EQ(after.registered_host_bytes, before.registered_host_bytes);
  EXPECT_EQ(after.host_unregisters - before.host_unregisters,
            after.host_registers - before.host_registers);
  for (const ChunkInfo& c : chunks) EXPECT_FALSE(mapped(c.base)) << c.base << " still mapped";
}

// The host refuses to pin more (RLIMIT_MEMLOCK, memory pressure) as the arena grows mid-training:
// that allocation is an out-of-memory (a bad_alloc, which the executor answers by updating the
// subgroup on the CPU), nothing of the arena is lost, and it grows again once the host pins.
TEST_F(PinnedArenaTest, AChunkTheHostCannotPinIsAnOutOfMemoryAndTheArenaGoesOn) {
  PinnedArena arena(small_options());
  void* first = arena.allocate(6 * kMiB);  // most of the first chunk
  std::memset(first, 1, 6 * kMiB);
  const std::size_t chunks = arena.chunks().size();
  const tide_standin_stats before = standin_.stats();
  standin_.fail_pin(1);
  try {
    arena.allocate(6 * kMiB);  // needs a new chunk
    ADD_FAILURE() << "allocated without pinning";
  } catch (const std::bad_alloc& e) {
    EXPECT_NE(std::string(e.what()).find("the host could not pin 6.00 MiB more (cuMemHostRegister "
                                         "failed: CUDA_ERROR_OUT_OF_MEMORY"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(arena.chunks().size(), chunks);
  EXPECT_EQ(standin_.stats().registered_host_bytes, before.registered_host_bytes);
  EXPECT_EQ(static_cast<unsigned char*>(first)[6 * kMiB - 1], 1);
  void* second = arena.allocate(6 * kMiB);  // the host pins again
  EXPECT_GT(arena.chunks().size(), chunks);
  EXPECT_TRUE(standin_.registered(second, 6 * kMiB));
  arena.deallocate(second, 6 * kMiB);
  arena.deallocate(first, 6 * kMiB);
}

TEST_F(PinnedArenaTest, MergeHookRefusesExtentsOfDifferentChunks) {
  PinnedOptions o = small_options();
  Registrar registrar(o.device);
  ChunkPool pool(o, registrar);
  PinnedExtentHooks hooks(pool);
  // Two regular chunks: the first holds 4 MiB, the second request does not fit there.
  void* a = pool.allocate_extent(3 * kMiB, kPage);
  void* b = pool.allocate_extent(3 * kMiB, kPage);
  ASSERT_EQ(pool.chunks().size(), 2u);
  extent_hooks_t* h = &hooks.hooks;
  void* a_next = static_cast<char*>(a) + kMiB;
  EXPECT_FALSE(h->merge(h, a, kMiB, a_next, kMiB, true, 0)) << "same chunk: may merge";
  EXPECT_TRUE(h->merge(h, a, 3 * kMiB, b, 3 * kMiB, true, 0)) << "two chunks: must not merge";
  EXPECT_FALSE(h->split(h, a, 3 * kMiB, kMiB, 2 * kMiB, true, 0));
  // No purging or decommitting registered pages: those hooks opt out.
  EXPECT_EQ(h->purge_lazy, nullptr);
  EXPECT_EQ(h->purge_forced, nullptr);
  EXPECT_EQ(h->decommit, nullptr);
  pool.deallocate_extent(a, 3 * kMiB);
  pool.deallocate_extent(b, 3 * kMiB);
}

TEST_F(PinnedArenaTest, OnlyHandedOutExtentMemoryPassesForAJemallocPointer) {
  PinnedOptions o = small_options();
  Registrar registrar(o.device);
  ChunkPool pool(o, registrar);
  auto* extent = static_cast<char*>(pool.allocate_extent(kMiB, kPage));
  auto* buffer = static_cast<char*>(pool.allocate_buffer(100'000, 64));
  EXPECT_TRUE(pool.holds_extent_pointer(extent));
  EXPECT_TRUE(pool.holds_extent_pointer(extent + kMiB - 1));
  EXPECT_FALSE(pool.holds_extent_pointer(buffer));         // a direct buffer
  EXPECT_FALSE(pool.holds_extent_pointer(buffer + 4096));  // inside one
  const ChunkInfo chunk = pool.chunks().front();
  EXPECT_FALSE(pool.holds_extent_pointer(static_cast<char*>(chunk.base) + chunk.bytes - 1));
  int on_stack = 0;
  EXPECT_FALSE(pool.holds_extent_pointer(&on_stack));
  pool.deallocate_extent(extent, kMiB);
  EXPECT_FALSE(pool.holds_extent_pointer(extent));  // free again
  pool.deallocate_buffer(buffer, 100'000);
}

TEST_F(PinnedArenaTest, LargeBuffersAreRoundedToPagesNotSizeClasses) {
  PinnedOptions o;  // defaults: 256 MiB chunks, direct from 1 MiB, dedicated from 4 MiB
  o.retain_bytes = 0;
  PinnedArena arena(o);
  const std::size_t subgroup = 10'000'000 * 4 + 12;  // 1e7 fp32 parameters, plus a little
  std::vector<void*> buffers;
  for (int i = 0; i < 3; ++i) buffers.push_back(arena.allocate(subgroup));
  const PinnedStats s = arena.stats();
  EXPECT_EQ(s.requested_bytes, 3 * subgroup);
  EXPECT_EQ(s.direct_bytes, 3 * round_up(subgroup, kPage));
  // Three dedicated chunks of the buffers' own size, and jemalloc's first metadata chunk.
  EXPECT_EQ(s.chunks, 4u);
  EXPECT_LE(s.pinned_bytes, s.requested_bytes + 3 * kPage + 4 * kMiB);
  for (void* p : buffers) EXPECT_TRUE(standin_.registered(p, subgroup));
  for (void* p : buffers) arena.deallocate(p, subgroup);
  EXPECT_EQ(arena.stats().chunks, 1u);  // retain 0: the dedicated chunks went at once
}

TEST_F(PinnedArenaTest, RetainedChunksAreReusedWithoutRegisteringAgain) {
  PinnedOptions o = small_options();
  o.retain_bytes = 64 * kMiB;
  PinnedArena arena(o);
  const std::size_t bytes = 6 * kMiB;  // dedicated
  arena.deallocate(arena.allocate(bytes), bytes);
  const tide_standin_stats before = standin_.stats();
  for (int i = 0; i < 10; ++i) arena.deallocate(arena.allocate(bytes), bytes);
  EXPECT_EQ(standin_.stats().host_registers, before.host_registers);
  EXPECT_EQ(arena.stats().free_chunk_bytes, bytes);
  arena.trim();
  EXPECT_EQ(arena.stats().free_chunk_bytes, 0u);
  EXPECT_EQ(standin_.stats().host_unregisters, before.host_unregisters + 1);
}

TEST_F(PinnedArenaTest, StatisticsAddUp) {
  PinnedArena arena(small_options());
  std::vector<Block> live;
  for (std::size_t bytes : {100ul, 3000ul, 40'000ul, 300'000ul, 2'000'000ul}) {
    live.push_back({arena.allocate(bytes), bytes});
  }
  const PinnedStats s = arena.stats();
  EXPECT_EQ(s.requested_bytes, 100u + 3000 + 40'000 + 300'000 + 2'000'000);
  EXPECT_EQ(s.peak_requested_bytes, s.requested_bytes);
  EXPECT_GE(s.allocated_bytes, s.requested_bytes);
  EXPECT_EQ(s.allocated_bytes, s.jemalloc_allocated_bytes + s.direct_bytes);
  EXPECT_GE(s.jemalloc_extent_bytes, s.jemalloc_allocated_bytes);
  EXPECT_GE(s.pinned_bytes, s.jemalloc_extent_bytes + s.direct_bytes);
  EXPECT_EQ(s.pinned_bytes, s.peak_pinned_bytes);
  EXPECT_EQ(s.allocations, 5u);
  EXPECT_GT(s.register_ns, 0u);
  EXPECT_GT(s.touch_ns, 0u);
  EXPECT_EQ(s.pinned, 1u);
  for (const Block& b : live) arena.deallocate(b.p, b.bytes);
  const PinnedStats t = arena.stats();
  EXPECT_EQ(t.requested_bytes, 0u);
  EXPECT_EQ(t.jemalloc_allocated_bytes, 0u);
  EXPECT_EQ(t.direct_bytes, 0u);
  EXPECT_EQ(t.peak_requested_bytes, s.requested_bytes);
  EXPECT_EQ(t.frees, 5u);
}

TEST_F(PinnedArenaTest, BadFreesAreRejectedNotObeyed) {
  PinnedArena arena(small_options());
  PinnedArena other(small_options());
  void* big = arena.allocate(100'000);
  void* small = arena.allocate(100);
  EXPECT_THROW(arena.deallocate(big, 100'001), std::invalid_argument);  // wrong size
  EXPECT_THROW(arena.deallocate(big, 100), std::invalid_argument);      // not a jemalloc size
  EXPECT_THROW(other.deallocate(small, 100), std::invalid_argument);    // another arena's
  int on_stack = 0;
  EXPECT_THROW(arena.deallocate(&on_stack, sizeof on_stack), std::invalid_argument);
  // Inside a direct buffer: not jemalloc's to free.
  EXPECT_THROW(arena.deallocate(static_cast<char*>(big) + 4096, 100), std::invalid_argument);
  EXPECT_THROW(arena.allocate(64, 3), std::invalid_argument);
  EXPECT_THROW(arena.allocate(64, 4 * kMiB), std::invalid_argument);
  EXPECT_EQ(arena.allocate(0), nullptr);
  arena.deallocate(nullptr, 0);
  arena.deallocate(big, 100'000);
  arena.deallocate(small, 100);
  EXPECT_EQ(arena.stats().requested_bytes, 0u);
}

TEST_F(PinnedArenaTest, BadOptionsAreRejected) {
  PinnedOptions o;
  o.chunk_bytes = kMiB;
  EXPECT_THROW(PinnedArena{o}, std::invalid_argument);
  o = PinnedOptions{};
  o.numa_node = 1023;  // no such node here
  EXPECT_THROW(PinnedArena{o}, std::invalid_argument);
  o = PinnedOptions{};
  o.device = 64;
  EXPECT_THROW(PinnedArena{o}, std::invalid_argument);
}

TEST(PinnedOptionsTest, ComeFromTheEnvironmentStrictly) {
  setenv("TIDE_PINNED_CHUNK", "64MiB", 1);
  setenv("TIDE_PINNED_DIRECT", "256KiB", 1);
  setenv("TIDE_PINNED_RETAIN", "0", 1);
  setenv("TIDE_PINNED_NUMA_NODE", "0", 1);
  setenv("TIDE_PINNED_HUGEPAGES", "off", 1);
  setenv("TIDE_PINNED_TOUCH_THREADS", "3", 1);
  const PinnedOptions o = PinnedOptions::from_environment();
  EXPECT_EQ(o.chunk_bytes, 64 * kMiB);
  EXPECT_EQ(o.direct_bytes, 256u * 1024);
  EXPECT_EQ(o.retain_bytes, 0u);
  EXPECT_EQ(o.numa_node, 0);
  EXPECT_FALSE(o.huge_pages);
  EXPECT_EQ(o.touch_threads, 3);
  setenv("TIDE_PINNED_CHUNK", "lots", 1);
  EXPECT_THROW(PinnedOptions::from_environment(), config::EnvError);
  setenv("TIDE_PINNED_CHUNK", "1MiB", 1);  // a valid size, but too small for a chunk
  EXPECT_THROW(PinnedOptions::from_environment(), std::invalid_argument);
  for (const char* name :
       {"TIDE_PINNED_CHUNK", "TIDE_PINNED_DIRECT", "TIDE_PINNED_RETAIN", "TIDE_PINNED_NUMA_NODE",
        "TIDE_PINNED_HUGEPAGES", "TIDE_PINNED_TOUCH_THREADS"}) {
    unsetenv(name);
  }
}

TEST_F(PinnedArenaTest, ChunksAreBoundToTheNumaNode) {
  PinnedOptions o = small_options();
  o.numa_node = 0;
  PinnedArena arena(o);
  void* p = arena.allocate(kMiB);
  EXPECT_TRUE(standin_.registered(p, kMiB));
  const int node = numa_node_of(p);
  if (node < 0) GTEST_SKIP() << "the kernel does not report page placement";
  EXPECT_EQ(node, 0);
  arena.deallocate(p, kMiB);
}

TEST_F(PinnedArenaTest, FailedRegistrationIsACudaErrorAndLeavesNothingBehind) {
  PinnedArena arena(small_options());
  const tide_standin_stats before = standin_.stats();
  standin_.device_lost(1);
  // A direct buffer that needs a new chunk, and jemalloc allocations that need new extents.
  EXPECT_THROW(arena.allocate(6 * kMiB), driver::CudaError);
  bool failed = false;
  for (int i = 0; i < 64 && !failed; ++i) {
    try {
      arena.allocate(60 * 1024);
    } catch (const driver::CudaError&) {
      failed = true;
    }
  }
  standin_.device_lost(0);
  EXPECT_TRUE(failed) << "jemalloc's path did not report the failed registration";
  EXPECT_EQ(standin_.stats().registered_host_bytes, before.registered_host_bytes);
  void* p = arena.allocate(6 * kMiB);  // the device is back
  EXPECT_TRUE(standin_.registered(p, 6 * kMiB));
  arena.deallocate(p, 6 * kMiB);
}

}  // namespace
}  // namespace tide::allocator::pinned

// The device caching allocator of one device, with its memory telemetry.
//
// Memory comes from the driver in segments and is handed out in blocks: best fit among the free
// blocks of the request's pool (small: up to 1 MiB, in 2 MiB segments; large: the rest), split
// to size, merged with free neighbours when freed. The large pool grows one reserved address
// range in steps where the driver has the virtual-memory calls (growable segments), else it
// takes fixed segments from cuMemAlloc. Freed blocks stay cached: allocate and free of cached
// memory make no driver call.
//
// Stream order: a block freed on stream S is reused at once on S; on another stream only after
// an event on S shows the work submitted before the free to be done (stream_events.h);
// record_stream() adds streams whose work must also finish first.
//
// Out of memory (the driver's, or the configured limit): the allocator waits for pending frees,
// gives cached memory back to the driver and retries; if that fails too it returns null and
// records an OomRecord (allocator/telemetry/oom_record.h) with the state at that moment.
//
// Thread-safe: one mutex guards the core; small blocks also go through per-thread caches
// (thread_cache.h) that take no shared lock.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "allocator/device/block.h"
#include "allocator/device/block_pool.h"
#include "allocator/device/config.h"
#include "allocator/device/ptr_map.h"
#include "allocator/device/segment.h"
#include "allocator/device/stats.h"
#include "allocator/device/stream_events.h"
#include "allocator/device/thread_cache.h"
#include "allocator/memory_resource.h"
#include "allocator/telemetry/headroom.h"
#include "allocator/telemetry/oom_record.h"
#include "allocator/telemetry/telemetry.h"
#include "allocator/telemetry/trace.h"
#include "driver/context.h"

namespace tide::allocator::device {

class CachingAllocator final : public DeviceMemoryResource {
 public:
  explicit CachingAllocator(int device,
                            AllocatorConfig config = AllocatorConfig::from_environment());
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(std::size_t bytes, CUstream stream) override;
  void deallocate(void* ptr, std::size_t bytes, CUstream stream) override;
  // Memory the update phase's plan takes out of the headroom (the optimizer's GPU buffers): a
  // block like any other, from the cache first, but the telemetry's peaks leave it out, because
  // the headroom is forecast from those peaks and would otherwise shrink by each plan's own
  // buffers. Never goes through a thread's cache; give it back with deallocate_from_headroom().
  void* allocate_from_headroom(std::size_t bytes, CUstream stream);
  void deallocate_from_headroom(void* ptr, std::size_t bytes, CUstream stream);
  // Who can give device memory back when an allocation would fail: tide's executor, for its
  // kept gradients and resident optimizer state. Before allocate() reports out of memory, each
  // reclaimer is called, without the allocator's lock, with the bytes wanted, and returns the
  // bytes it freed; if any did, the allocation is tried again, and the reclaimers are asked
  // again while it fails and they free something (at most kMaxReclaimRounds times), so that a
  // reclaimer may give back one kind at a time, the cheapest first. A reclaimer must not
  // allocate from this allocator. Returns an id for remove_reclaimer, which waits for a call in
  // progress to return.
  using Reclaimer = std::function<std::uint64_t(std::uint64_t)>;
  static constexpr int kMaxReclaimRounds = 16;
  std::uint64_t add_reclaimer(Reclaimer reclaimer);
  void remove_reclaimer(std::uint64_t id);
  // The block at `ptr` (allocated) is used on `stream` too: not reused before that stream's work
  // submitted until its free completes.
  void record_stream(void* ptr, CUstream stream);
  // Stream order without an event, for a holder that waits for its own streams (tide's executor
  // after its phase). Blocks freed on a stream serve other streams only once an event shows
  // their uses done, and the allocator records one only when short of memory: meanwhile a
  // request on another stream grows the cache instead. frees_so_far(), read after the holder's
  // frees, then streams_waited() once it has waited for every use of those blocks: they serve
  // any stream at once.
  std::uint64_t frees_so_far() const;
  void streams_waited(CUstream stream, std::uint64_t frees);
  // Whether `ptr` is a block this allocator handed out (and not yet freed).
  bool owns(void* ptr) const;
  // Gives every cached free block back to the driver (after waiting for pending frees).
  void empty_cache();
  // Caps reserved bytes at `fraction` of the device's memory (PyTorch's
  // set_per_process_memory_fraction); TIDE_ALLOC_MAX_BYTES still applies.
  void set_memory_fraction(double fraction);

  AllocatorStats stats() const;
  // Live and reserved bytes now (cheaper than stats()).
  struct Usage {
    std::uint64_t live = 0;
    std::uint64_t reserved = 0;
    // Allocations served only by giving the cache back to the driver first (a synchronize, an
    // unmap and a map again) since the allocator was made; unlike stats()' num_alloc_retries,
    // never reset, so that a holder of memory can tell whether it squeezes the rest.
    std::uint64_t cache_releases = 0;
  };
  Usage usage() const;
  void reset_peak_stats();
  void reset_accumulated_stats();
  std::vector<telemetry::OomRecord> ooms() const;
  // The rounded block size a request of `bytes` gets.
  std::size_t round_size(std::size_t bytes) const;

  // Telemetry (caching_allocator_telemetry.cpp).
  void mark(telemetry::Mark mark);
  std::vector<telemetry::Sample> timeline() const;
  std::vector<telemetry::MarkEvent> marks() const;
  // Recent iterations: from marks when the program gives them (phases not marked are detected
  // within each marked iteration), else detected from the curve.
  std::vector<telemetry::IterationStats> iterations() const;
  telemetry::HeadroomForecast headroom() const;
  // The timeline, iterations, marks, out-of-memory records and headroom forecast as a Chrome
  // trace file (allocator/telemetry/chrome_trace.h) at `path`.
  void export_chrome_trace(const std::string& path) const;
  // The clock of the telemetry and traces (nanoseconds); null: steady_clock. A replayer sets it
  // to the trace's time.
  void set_clock(std::function<std::uint64_t()> clock);
  std::uint64_t telemetry_resolution() const;

  // Allocation-event trace: blocks live now appear as allocations at time 0.
  void start_trace(std::size_t max_events);
  bool tracing() const { return tracing_.load(std::memory_order_relaxed); }
  telemetry::Trace stop_trace();

  int device() const { return context_.device(); }
  std::uint64_t limit() const;
  std::uint64_t total_memory() const { return total_memory_; }
  const AllocatorConfig& config() const { return config_; }

 private:
  struct Corrections;  // what the thread caches hold, subtracted from the core's counts

  // The front door and blocks (caching_allocator.cpp).
  // `last_try`: out of memory is recorded (else the caller reclaims and tries again).
  void* allocate_core(std::size_t bytes, std::size_t rounded, CUstream stream,
                      bool from_headroom = false, bool last_try = true);
  // Asks the reclaimers for `bytes` (caching_allocator_reclaim.cpp); true if any freed some.
  bool reclaim(std::size_t bytes);
  // What reclaimers are asked for when a block of `rounded` bytes could not be had (the cache
  // already given back): what the limit leaves no room for, in whole pages; all of it when the
  // limit left room (the device refused, not the limit).
  std::size_t shortfall(std::size_t rounded);
  void deallocate_core(CUdeviceptr ptr, std::size_t bytes, bool from_cache);
  void deallocate_locked(CUdeviceptr ptr, std::size_t bytes, bool from_cache);
  Block* split_off_locked(Block* block, std::size_t offset);
  void unlink_locked(Block* block);
  Block* take_locked(Block* block, std::size_t rounded, std::size_t requested, CUstream stream);
  // The block's last use is over: it stops counting as active and joins the free blocks.
  void deactivate_locked(Block* block);
  void free_block_locked(Block* block);
  Block* insert_free_locked(Block* block, CUstream absorb);

  // Thread caches (caching_allocator_thread_caches.cpp).
  ThreadCache* thread_cache();
  void retire_thread_cache(ThreadCache* cache);  // its thread exits
  void report(ThreadCache* cache);               // the telemetry hears of the cache's changes
  void drain_thread_caches_locked();
  Corrections corrections_locked() const;

  // Stream order (caching_allocator_streams.cpp).
  void process_events_locked(CUstream wanted_by);
  void synchronize_all_locked();
  // Records an event on `stream` covering its frees so far; false if the stream is gone, when
  // everything is waited for instead and its blocks are free on any stream.
  bool fence_locked(CUstream stream);
  void promote_locked(CUstream stream, std::uint64_t covers);

  // Memory from the driver, and back (caching_allocator_growth.cpp).
  Block* grow_locked(std::size_t rounded, PoolKind pool, CUstream stream, bool* limit_hit);
  Block* grow_growable_locked(std::size_t rounded, CUstream stream, bool* limit_hit, bool* no_room);
  Block* new_fixed_segment_locked(std::size_t rounded, PoolKind pool, bool* limit_hit);
  void ensure_growable_locked();
  void release_cached_locked();

  // The slow path and out of memory (caching_allocator_oom.cpp).
  // Requests larger than any device: records the out-of-memory and returns true.
  bool refuse_oversized(std::size_t bytes, CUstream stream);
  Block* allocate_slow_locked(std::size_t bytes, std::size_t rounded, PoolKind pool,
                              CUstream stream, bool last_try = true);
  void record_oom_locked(std::size_t bytes, std::size_t rounded, CUstream stream, bool limit_hit);

  // Statistics (caching_allocator_stats.cpp).
  void account_alloc_locked(const Block* block, std::size_t requested);
  void account_free_locked(const Block* block, std::size_t requested, bool from_cache);
  void on_change_locked();
  std::uint64_t live_locked() const;
  std::uint64_t now_locked() const;
  std::uint64_t reserved_locked() const { return reserved_bytes_[kAllPools].current; }

  const std::uint64_t id_;
  const AllocatorConfig config_;
  driver::PrimaryContext context_;
  std::uint64_t total_memory_ = 0;
  std::atomic<bool> tracing_{false};
  // Blocks with record_stream uses outstanding: frees of small blocks skip the thread cache then.
  std::atomic<std::uint64_t> blocks_with_uses_{0};
  const bool thread_cache_enabled_;
  // A thread's net change through its cache that the telemetry hears of at once: the timeline's
  // resolution, at least 1 MiB (exceeded: so that allocate/free pairs of small blocks, at most
  // 1 MiB each, never report).
  std::int64_t report_bytes_ = 0;

  // Everything below; on a cache line of its own, apart from what the thread caches' lock-free
  // path reads (tracing_, blocks_with_uses_, the settings above), so that threads taking the lock
  // do not slow the others' small-block pairs.
  // The reclaimers, apart from the rest: called without mutex_, under this one.
  std::mutex reclaim_mutex_;
  std::vector<std::pair<std::uint64_t, Reclaimer>> reclaimers_;
  std::uint64_t next_reclaimer_ = 1;
  std::atomic<bool> has_reclaimers_{false};

  alignas(64) mutable std::mutex mutex_;
  double memory_fraction_ = 1.0;
  std::uint64_t limit_ = 0;
  BlockPool pools_[2];
  BlockArena arena_;
  PtrMap allocated_;
  std::vector<std::unique_ptr<Segment>> segments_;
  Segment* growable_ = nullptr;
  bool growable_failed_ = false;
  EventPool events_;
  StreamFences fences_{events_};
  PendingFrees pending_{events_};
  std::uint64_t free_seq_ = 0;
  std::uint64_t from_headroom_bytes_ = 0;  // live in blocks from allocate_from_headroom
  std::vector<std::unique_ptr<ThreadCache>> caches_;
  std::vector<ThreadCache*> idle_caches_;  // of threads that exited, for new threads

  // Core counts (thread-cached blocks count as allocated here; stats() corrects).
  StatArray allocated_bytes_;
  StatArray requested_bytes_;
  StatArray reserved_bytes_;
  StatArray active_bytes_;
  StatArray allocation_;
  StatArray active_;
  StatArray segment_;
  // Peaks of the corrected counts.
  std::uint64_t peak_allocated_bytes_[3] = {};
  std::uint64_t peak_requested_bytes_[3] = {};
  std::uint64_t peak_active_bytes_[3] = {};
  std::uint64_t peak_allocation_[3] = {};
  std::uint64_t peak_active_[3] = {};
  std::uint64_t num_alloc_retries_ = 0;
  std::uint64_t cache_releases_ = 0;  // as num_alloc_retries_, never reset (Usage)
  std::uint64_t num_ooms_ = 0;
  std::uint64_t num_sync_all_streams_ = 0;
  std::uint64_t num_device_alloc_ = 0;
  std::uint64_t num_device_free_ = 0;
  std::uint64_t requested_hits_base_[2] = {};  // thread caches' requested totals at the last reset

  telemetry::Telemetry telemetry_;
  std::function<std::uint64_t()> clock_;
  telemetry::TraceRecorder recorder_;
  telemetry::Ring<telemetry::OomRecord> ooms_{32};

  friend class ThreadCacheSlots;
};

}  // namespace tide::allocator::device

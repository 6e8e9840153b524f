// Primary contexts: reference counts, the current context of each thread, and the implicit
// synchronisation of the legacy default stream.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "standin/streams.h"
#include "standin/timeline.h"

namespace tide::standin {

class Context {
 public:
  explicit Context(int device) : device_(device) {}
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int device() const { return device_; }
  CUcontext handle() { return reinterpret_cast<CUcontext>(this); }

  // The first retain creates the context (its legacy stream); the last release destroys it, as
  // in CUDA: it waits for the context's work, then destroys its streams, events and modules,
  // frees its cuMemAlloc'd memory and drops its host registrations. Releasing an inactive
  // context: CUDA_ERROR_INVALID_CONTEXT.
  void retain();
  CUresult release();
  bool active() const { return refs_.load(std::memory_order_acquire) > 0; }
  int references() const { return refs_.load(std::memory_order_acquire); }

  // Null when the context is not active.
  std::shared_ptr<Stream> legacy_stream();
  std::shared_ptr<Stream> per_thread_stream();  // the calling thread's, created on first use
  std::shared_ptr<Stream> create_stream(Stream::Kind kind);

  // Submits work to `stream` (of this context). Legacy default-stream semantics: work on the
  // legacy stream waits for all work submitted before it on the blocking streams (including the
  // per-thread ones), and work on a blocking stream waits for all work submitted before it on the
  // legacy stream. Non-blocking streams wait for nothing implicitly.
  Position submit(Stream& stream, std::function<void()> work, std::vector<Position> deps);

  // Waits for all work submitted to this context's streams so far.
  void synchronize();

 private:
  std::vector<Position> tails_locked();

  const int device_;
  std::mutex lifecycle_;  // serialises retain and release, held while a release tears down
  std::atomic<int> refs_{0};
  std::mutex mutex_;  // what follows
  std::shared_ptr<Stream> legacy_;
  std::map<std::thread::id, std::shared_ptr<Stream>> per_thread_;
  // Every stream's timeline but the legacy one, kept after the stream is destroyed until its
  // work is done: the legacy stream still synchronises with that work.
  std::vector<std::shared_ptr<Timeline>> timelines_;
};

// The calling thread's current context (the top of its context stack):
// CUDA_ERROR_INVALID_CONTEXT when there is none, CUDA_ERROR_CONTEXT_IS_DESTROYED when it has
// been released.
CUresult current_context(Context** out);
// What an entry point that needs a current context checks first, as CUDA does: the result of
// current_context(); a failure is counted (tide_standin_stats.calls_without_context).
CUresult require_current_context();

// Retains and releases are counted (tide_standin_stats.primary_ctx_*): a release of a context
// with no reference left is CUDA_ERROR_INVALID_CONTEXT and counted as unretained_releases.
CUresult primary_ctx_retain(CUcontext* out, CUdevice device);
CUresult primary_ctx_release(CUdevice device);
// All devices' primary contexts' references now (a gauge).
std::uint64_t primary_ctx_references();
// The thread's context stack, as in CUDA: set replaces its top (null pops it), push and pop.
CUresult ctx_set_current(CUcontext context);
CUresult ctx_get_current(CUcontext* out);
CUresult ctx_push_current(CUcontext context);
CUresult ctx_pop_current(CUcontext* out);
// `context` null: the current one.
CUresult ctx_synchronize(CUcontext context);

}  // namespace tide::standin

// Streams: their handles, the default streams, and the cuStream* calls.
//
// Every stream has a worker thread (its Timeline). A null CUstream means the legacy default
// stream for the ordinary entry points, and the calling thread's per-thread default stream for
// the _ptds/_ptsz ones (cuGetProcAddress with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
// CU_STREAM_LEGACY and CU_STREAM_PER_THREAD name them explicitly.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "standin/timeline.h"

namespace tide::standin {

class Context;

enum class DefaultStream { kLegacy, kPerThread };

class Stream {
 public:
  // kLegacy and kPerThread are the default streams; kBlocking streams (flags 0) synchronise with
  // the legacy stream, kNonBlocking ones (CU_STREAM_NON_BLOCKING) do not.
  enum class Kind { kLegacy, kPerThread, kBlocking, kNonBlocking };

  Stream(Context& context, Kind kind);
  ~Stream();  // closes the timeline: work already submitted still runs
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  Context& context() const { return context_; }
  Kind kind() const { return kind_; }
  const std::shared_ptr<Timeline>& timeline() const { return timeline_; }

  // Submits work through the context, which adds the implicit default-stream dependencies.
  Position submit(std::function<void()> work, std::vector<Position> deps = {});

  // What the recording names the stream by: the handle cuStreamCreate returned, or for a default
  // stream an id of its own.
  std::uint64_t id() const {
    return handle_ != nullptr ? reinterpret_cast<std::uintptr_t>(handle_)
                              : reinterpret_cast<std::uintptr_t>(this);
  }
  void set_handle(CUstream handle) { handle_ = handle; }

 private:
  Context& context_;
  const Kind kind_;
  std::shared_ptr<Timeline> timeline_;
  CUstream handle_ = nullptr;  // created streams'
};

// The stream a CUstream argument names (a null handle: `fallback`). Errors: no current context
// for a default stream, CUDA_ERROR_INVALID_HANDLE for an unknown or destroyed stream.
CUresult resolve_stream(CUstream handle, DefaultStream fallback, std::shared_ptr<Stream>* out);

CUresult stream_create(CUstream* out, unsigned flags);
CUresult stream_destroy(CUstream handle);
CUresult stream_synchronize(CUstream handle, DefaultStream fallback);
CUresult stream_query(CUstream handle, DefaultStream fallback);
CUresult stream_wait_event(CUstream handle, CUevent event, unsigned flags, DefaultStream fallback);
CUresult launch_host_func(CUstream handle, CUhostFn fn, void* data, DefaultStream fallback);

// Destroys the streams created in `context`, when it is destroyed: their handles become invalid.
void destroy_streams_of(const Context& context);

// Whether the calling thread runs a host function: the driver calls it makes fail with
// CUDA_ERROR_NOT_PERMITTED (CUDA: "must not make any CUDA API calls").
bool in_host_function();

}  // namespace tide::standin

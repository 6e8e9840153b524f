#include "standin/contexts.h"

#include <algorithm>
#include <utility>

#include "standin/device_memory.h"
#include "standin/devices.h"
#include "standin/events.h"
#include "standin/host_memory.h"
#include "standin/modules.h"
#include "standin/stats.h"

namespace tide::standin {
namespace {

// The calling thread's context stack; its top is the current context.
thread_local std::vector<Context*> t_stack;

Context* top() { return t_stack.empty() ? nullptr : t_stack.back(); }

// The active primary context `handle` is, or null.
Context* active_context(CUcontext handle) {
  Device* d = find_context(handle);
  return d != nullptr && d->context.active() ? &d->context : nullptr;
}

}  // namespace

void Context::retain() {
  const std::lock_guard life(lifecycle_);
  const std::lock_guard lock(mutex_);
  if (refs_.load(std::memory_order_relaxed) == 0) {
    legacy_ = std::make_shared<Stream>(*this, Stream::Kind::kLegacy);
  }
  refs_.fetch_add(1, std::memory_order_release);
}

CUresult Context::release() {
  const std::lock_guard life(lifecycle_);
  {
    const std::lock_guard lock(mutex_);
    const int refs = refs_.load(std::memory_order_relaxed);
    if (refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
    refs_.store(refs - 1, std::memory_order_release);
    if (refs > 1) return CUDA_SUCCESS;
  }
  // The last reference: the context is destroyed, after its work is done.
  synchronize();
  destroy_streams_of(*this);
  destroy_events_of(*this);
  unload_modules_of(*this);
  free_allocations_of(device_);
  unregister_host_memory_of(device_);
  const std::lock_guard lock(mutex_);
  legacy_.reset();
  per_thread_.clear();
  timelines_.clear();
  return CUDA_SUCCESS;
}

std::shared_ptr<Stream> Context::legacy_stream() {
  const std::lock_guard lock(mutex_);
  return legacy_;
}

std::shared_ptr<Stream> Context::per_thread_stream() {
  const std::lock_guard lock(mutex_);
  if (!legacy_) return nullptr;  // not active
  std::shared_ptr<Stream>& stream = per_thread_[std::this_thread::get_id()];
  if (!stream) {
    stream = std::make_shared<Stream>(*this, Stream::Kind::kPerThread);
    timelines_.push_back(stream->timeline());
  }
  return stream;
}

std::shared_ptr<Stream> Context::create_stream(Stream::Kind kind) {
  auto stream = std::make_shared<Stream>(*this, kind);
  const std::lock_guard lock(mutex_);
  // Forget the timelines of destroyed streams whose work is done.
  std::erase_if(timelines_, [](const auto& t) { return t->closed_and_idle(); });
  timelines_.push_back(stream->timeline());
  return stream;
}

Position Context::submit(Stream& stream, std::function<void()> work, std::vector<Position> deps) {
  // Under the lock, so that the implicit dependencies and the work's place in its stream are
  // one step: no other submission can slip in between.
  const std::lock_guard lock(mutex_);
  switch (stream.kind()) {
    case Stream::Kind::kLegacy:
      for (const auto& timeline : timelines_) {
        if (timeline->blocking()) deps.push_back(timeline->tail());
      }
      break;
    case Stream::Kind::kPerThread:
    case Stream::Kind::kBlocking:
      if (legacy_) deps.push_back(legacy_->timeline()->tail());
      break;
    case Stream::Kind::kNonBlocking:
      break;
  }
  std::erase_if(deps, [](const Position& p) { return p.seq == 0; });
  return stream.timeline()->enqueue(std::move(deps), std::move(work));
}

std::vector<Position> Context::tails_locked() {
  std::vector<Position> tails;
  if (legacy_) tails.push_back(legacy_->timeline()->tail());
  for (const auto& timeline : timelines_) tails.push_back(timeline->tail());
  return tails;
}

void Context::synchronize() {
  std::vector<Position> tails;
  {
    const std::lock_guard lock(mutex_);
    tails = tails_locked();
  }
  for (const Position& p : tails) p.timeline->wait(p.seq);
}

CUresult current_context(Context** out) {
  Context* current = top();
  if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (!current->active()) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *out = current;
  return CUDA_SUCCESS;
}

CUresult require_current_context() {
  Context* context = nullptr;
  const CUresult r = current_context(&context);
  if (r != CUDA_SUCCESS) count(Counter::kCallsWithoutContext);
  return r;
}

CUresult primary_ctx_retain(CUcontext* out, CUdevice device) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Device* d = find_device(device);
  if (d == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  d->context.retain();
  count(Counter::kPrimaryCtxRetains);
  *out = d->context.handle();
  return CUDA_SUCCESS;
}

CUresult primary_ctx_release(CUdevice device) {
  Device* d = find_device(device);
  if (d == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  const CUresult r = d->context.release();
  count(r == CUDA_SUCCESS ? Counter::kPrimaryCtxReleases : Counter::kUnretainedReleases);
  return r;
}

std::uint64_t primary_ctx_references() {
  std::uint64_t references = 0;
  for (int i = 0; i < device_count(); ++i) {
    references += static_cast<std::uint64_t>(find_device(i)->context.references());
  }
  return references;
}

CUresult ctx_set_current(CUcontext context) {
  if (context == nullptr) {
    if (!t_stack.empty()) t_stack.pop_back();
    return CUDA_SUCCESS;
  }
  Context* c = active_context(context);
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (t_stack.empty()) {
    t_stack.push_back(c);
  } else {
    t_stack.back() = c;
  }
  return CUDA_SUCCESS;
}

CUresult ctx_get_current(CUcontext* out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *out = top() != nullptr ? top()->handle() : nullptr;
  return CUDA_SUCCESS;
}

CUresult ctx_push_current(CUcontext context) {
  if (context == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* c = active_context(context);
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  t_stack.push_back(c);
  return CUDA_SUCCESS;
}

CUresult ctx_pop_current(CUcontext* out) {
  if (t_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  Context* popped = t_stack.back();
  t_stack.pop_back();
  if (out != nullptr) *out = popped->handle();
  return CUDA_SUCCESS;
}

CUresult ctx_synchronize(CUcontext context) {
  Context* c = nullptr;
  if (context == nullptr) {
    if (CUresult r = current_context(&c); r != CUDA_SUCCESS) return r;
  } else {
    Device* d = find_context(context);
    if (d == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    if (!d->context.active()) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    c = &d->context;
  }
  c->synchronize();
  return CUDA_SUCCESS;
}

}  // namespace tide::standin

// Devices and their primary contexts: tide is a guest in the process.
//
// The process's CUDA runtime (PyTorch's) owns the primary contexts and every thread's current
// context; tide borrows them under one rule:
// - tide retains a device's primary context once, while any of its objects needs that device
//   (PrimaryContext: shares of that one reference), and releases it exactly once, when the last
//   share goes; a release's result is checked. So tide never releases what it did not retain,
//   and never ends a context the runtime still holds.
// - On a thread of the caller, tide makes its context current only for the call and puts the
//   caller's back before returning (ContextScope: cuCtxPushCurrent/cuCtxPopCurrent, nothing at
//   all when it is current already). After any tide call the caller's current context is what it
//   was.
// - On a thread of its own, tide makes its context current once, when the thread starts
//   (bind_this_thread).
// - Every driver call that needs a current context runs under one of the two.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

namespace tide::driver {

int device_count();
std::string device_name(int device);

struct MemoryInfo {
  std::size_t free_bytes;
  std::size_t total_bytes;
};
// Of the device whose context is current.
MemoryInfo memory_info();

// A share of tide's one reference to a device's primary context. The first share of a device
// retains the context (cuDevicePrimaryCtxRetain), the last one releases it; shares are cheap to
// copy. Making the context current is ContextScope's or bind_this_thread's job, never this
// class's.
class PrimaryContext {
 public:
  // Throws CudaError (e.g. no such device, or the driver failed).
  explicit PrimaryContext(int device = 0);

  int device() const;
  CUcontext get() const;

 private:
  struct Reference;
  std::shared_ptr<const Reference> reference_;
};

// Makes `context` current on the calling thread for the scope: pushed on the thread's context
// stack when another context (or none) is current, and popped when the scope ends; nothing when
// it is current already. Scopes nest, and end on the thread and in the reverse order they began.
class ContextScope {
 public:
  explicit ContextScope(const PrimaryContext& context) : ContextScope(context.get()) {}
  // A context someone else keeps alive (e.g. the one a stream was made in).
  explicit ContextScope(CUcontext context);
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  CUcontext pushed_ = nullptr;  // null: nothing was pushed
};

// What a program (a test, a tool, a benchmark: the caller's side, as the CUDA runtime would)
// holds to use a device on its thread: a share of the primary context, current for the object's
// life.
class CurrentContext {
 public:
  explicit CurrentContext(int device = 0) : context_(device), scope_(context_) {}

  const PrimaryContext& context() const { return context_; }
  int device() const { return context_.device(); }
  CUcontext get() const { return context_.get(); }

 private:
  PrimaryContext context_;
  ContextScope scope_;
};

// The calling thread's current context (null: none). Throws CudaError.
CUcontext current_context();

// For the destructors of driver objects, which run on whatever thread lets them go: calls
// `destroy` with `context` (the one the object was made in) current, as ContextScope does, or
// as things are if it cannot be made current (a lost device). Never throws.
template <typename Destroy>
void destroy_in(CUcontext context, Destroy&& destroy) noexcept {
  std::optional<ContextScope> scope;
  try {
    scope.emplace(context);
  } catch (...) {
    // Destroyed anyway: the call reports what the driver makes of it.
  }
  destroy();
}

// For a thread tide starts: makes `context` its current context, for good (the thread holds no
// other), e.g. the context current where the thread was started. Throws CudaError.
void bind_this_thread(CUcontext context);

}  // namespace tide::driver

// A fiber: a stack of its own on which one OS thread runs a task, which may suspend itself and be
// resumed later. The host runner of tide's CUDA kernels (kernels/host/grid.h) runs each thread of
// a warp as a task on a fiber, so that a warp collective can hold every thread of the warp until
// all of them have arrived, as the hardware does.
//
// The switch is a few instructions on x86-64 (fiber_x86_64.S; ucontext's swapcontext makes a
// system call per switch, which would dominate a kernel run: one launch has up to a million
// threads); other architectures, and builds with TIDE_FIBER_UCONTEXT defined, use ucontext.
// Both tell ASan and TSan about every switch.
#pragma once

#include <cstddef>

#if !defined(__x86_64__) && !defined(TIDE_FIBER_UCONTEXT)
#define TIDE_FIBER_UCONTEXT 1
#endif
#if defined(TIDE_FIBER_UCONTEXT)
#include <ucontext.h>
#endif

namespace tide::kernels::host {

class Fiber {
 public:
  using Task = void (*)(void* arg);

  // A fiber with a stack of `stack_bytes` (rounded up to pages), and an inaccessible page under
  // it so that an overflow faults instead of overwriting memory.
  explicit Fiber(std::size_t stack_bytes);
  // The stack is unmapped; a task suspended on it is abandoned (nothing of it runs again).
  ~Fiber();
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  // From the thread's own stack, with the fiber idle: runs task(arg) on the fiber until it
  // returns (true) or suspends itself (false). The task must not throw.
  bool start(Task task, void* arg);
  // From the thread's own stack, with the task suspended: runs it on until it returns (true) or
  // suspends again (false).
  bool resume();
  // From the task, on the fiber: back to the thread, which returns from start() or resume().
  void suspend();

  // No task, or its task has returned: start() may run another.
  bool idle() const { return state_ == State::kIdle; }

 private:
  enum class State { kIdle, kRunning, kSuspended };

  [[noreturn]] static void main(Fiber* self);
#if defined(TIDE_FIBER_UCONTEXT)
  static void ucontext_main();
#endif
  bool enter();  // thread → fiber
  void leave();  // fiber → thread

  State state_ = State::kIdle;
  Task task_ = nullptr;
  void* arg_ = nullptr;
  void* stack_ = nullptr;  // the whole mapping, guard page first
  std::size_t mapped_ = 0;
  void* stack_bottom_ = nullptr;  // the usable stack: lowest address and size
  std::size_t stack_size_ = 0;
#if defined(TIDE_FIBER_UCONTEXT)
  ucontext_t fiber_context_{};
  ucontext_t thread_context_{};
#else
  void* fiber_sp_ = nullptr;   // saved while the fiber is not running
  void* thread_sp_ = nullptr;  // saved while it runs
#endif
  // Sanitizer state (unused otherwise): ASan's fake stacks and the bounds of the thread's stack,
  // TSan's fiber handles.
  void* fake_stack_fiber_ = nullptr;
  void* fake_stack_thread_ = nullptr;
  const void* thread_stack_bottom_ = nullptr;
  std::size_t thread_stack_size_ = 0;
  void* tsan_fiber_ = nullptr;
  void* tsan_thread_ = nullptr;
};

}  // namespace tide::kernels::host

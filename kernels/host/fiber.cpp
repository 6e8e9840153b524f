#include "kernels/host/fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define TIDE_FIBER_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define TIDE_FIBER_TSAN 1
#endif

#if !defined(TIDE_FIBER_UCONTEXT)
// fiber_x86_64.S. The switch saves the callee-saved registers and the SSE/x87 control words on
// the running stack, stores its stack pointer to *save_sp, and continues on load_sp's stack.
extern "C" void tide_fiber_switch(void** save_sp, void* load_sp);
// A new fiber's first return address: calls r12(r13).
extern "C" void tide_fiber_trampoline();
#endif

namespace tide::kernels::host {
namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "tide: fiber: %s\n", what);
  std::abort();
}

std::size_t page_size() { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }

#if defined(TIDE_FIBER_UCONTEXT)
// makecontext passes only ints: the fiber being entered for the first time travels here.
thread_local Fiber* t_starting = nullptr;
#endif

}  // namespace

Fiber::Fiber(std::size_t stack_bytes) {
  const std::size_t page = page_size();
  stack_size_ = (stack_bytes + page - 1) / page * page;
  mapped_ = stack_size_ + page;
  stack_ = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK,
                -1, 0);
  if (stack_ == MAP_FAILED) throw std::bad_alloc();
  if (mprotect(stack_, page, PROT_NONE) != 0) {
    munmap(stack_, mapped_);
    throw std::bad_alloc();
  }
  stack_bottom_ = static_cast<char*>(stack_) + page;
#if defined(TIDE_FIBER_TSAN)
  tsan_fiber_ = __tsan_create_fiber(0);
#endif
#if defined(TIDE_FIBER_UCONTEXT)
  if (getcontext(&fiber_context_) != 0) die("getcontext failed");
  fiber_context_.uc_stack.ss_sp = stack_bottom_;
  fiber_context_.uc_stack.ss_size = stack_size_;
  fiber_context_.uc_link = nullptr;
  makecontext(&fiber_context_, &Fiber::ucontext_main, 0);
#else
  // The frame tide_fiber_switch pops (from the lowest address): the MXCSR and x87 control words
  // (their defaults: round to nearest, exceptions masked, as on the device), r15, r14, r13 (the
  // argument), r12 (the function), rbx, rbp (0: the end of the frame-pointer chain), and the
  // return address. The stack pointer is 16-byte aligned after that return, as the trampoline's
  // call needs.
  auto* top = static_cast<std::uint64_t*>(
      static_cast<void*>(static_cast<char*>(stack_bottom_) + stack_size_));
  std::uint64_t* frame = top - 8;
  frame[0] = 0x1f80u | (std::uint64_t{0x037fu} << 32);
  frame[1] = 0;                                              // r15
  frame[2] = 0;                                              // r14
  frame[3] = reinterpret_cast<std::uint64_t>(this);          // r13
  frame[4] = reinterpret_cast<std::uint64_t>(&Fiber::main);  // r12
  frame[5] = 0;                                              // rbx
  frame[6] = 0;                                              // rbp
  frame[7] = reinterpret_cast<std::uint64_t>(&tide_fiber_trampoline);
  fiber_sp_ = frame;
#endif
}

Fiber::~Fiber() {
#if defined(TIDE_FIBER_TSAN)
  __tsan_destroy_fiber(tsan_fiber_);
#endif
#if defined(TIDE_FIBER_ASAN)
  // Frames that never returned (the fiber's loop, a suspended task) leave their redzones
  // poisoned; memory mapped here later must not inherit that.
  ASAN_UNPOISON_MEMORY_REGION(stack_bottom_, stack_size_);
#endif
  munmap(stack_, mapped_);
}

bool Fiber::start(Task task, void* arg) {
  if (state_ != State::kIdle) die("start() of a fiber that is not idle");
  task_ = task;
  arg_ = arg;
  return enter();
}

bool Fiber::resume() {
  if (state_ != State::kSuspended) die("resume() of a fiber that is not suspended");
  return enter();
}

void Fiber::suspend() {
  if (state_ != State::kRunning) die("suspend() outside the fiber's task");
  state_ = State::kSuspended;
  leave();
  state_ = State::kRunning;
}

bool Fiber::enter() {
  state_ = State::kRunning;
#if defined(TIDE_FIBER_TSAN)
  tsan_thread_ = __tsan_get_current_fiber();
  __tsan_switch_to_fiber(tsan_fiber_, 0);
#endif
#if defined(TIDE_FIBER_ASAN)
  __sanitizer_start_switch_fiber(&fake_stack_thread_, stack_bottom_, stack_size_);
#endif
#if defined(TIDE_FIBER_UCONTEXT)
  t_starting = this;
  if (swapcontext(&thread_context_, &fiber_context_) != 0) die("swapcontext failed");
#else
  tide_fiber_switch(&thread_sp_, fiber_sp_);
#endif
#if defined(TIDE_FIBER_ASAN)
  __sanitizer_finish_switch_fiber(fake_stack_thread_, nullptr, nullptr);
#endif
  return state_ == State::kIdle;
}

void Fiber::leave() {
#if defined(TIDE_FIBER_TSAN)
  __tsan_switch_to_fiber(tsan_thread_, 0);
#endif
#if defined(TIDE_FIBER_ASAN)
  __sanitizer_start_switch_fiber(&fake_stack_fiber_, thread_stack_bottom_, thread_stack_size_);
#endif
#if defined(TIDE_FIBER_UCONTEXT)
  if (swapcontext(&fiber_context_, &thread_context_) != 0) die("swapcontext failed");
#else
  tide_fiber_switch(&fiber_sp_, thread_sp_);
#endif
#if defined(TIDE_FIBER_ASAN)
  __sanitizer_finish_switch_fiber(fake_stack_fiber_, &thread_stack_bottom_, &thread_stack_size_);
#endif
}

// The fiber's whole life: one task after another, never returning, so that its frames stay
// balanced (the sanitizers' view of the stack included).
void Fiber::main(Fiber* self) {
#if defined(TIDE_FIBER_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &self->thread_stack_bottom_, &self->thread_stack_size_);
#endif
  for (;;) {
    self->task_(self->arg_);
    self->state_ = State::kIdle;
    self->leave();
  }
}

#if defined(TIDE_FIBER_UCONTEXT)
void Fiber::ucontext_main() { main(t_starting); }
#endif

}  // namespace tide::kernels::host

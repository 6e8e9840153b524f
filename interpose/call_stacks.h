// Allocation call stacks: captured with libunwind (sampled: one allocation in N), interned into
// sites, and symbolised only when the report is written.
//
// libunwind is dlopen()ed RTLD_LOCAL, and only when stacks are asked for: libunwind.so.8 also
// exports _Unwind_RaiseException & co. and a weak backtrace(), so linking it into an LD_PRELOAD
// library would put its unwinder ahead of libgcc_s's (C++ exceptions) and glibc's backtrace() in
// every process the preload enters.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace tide::interpose {

class CallStacks {
 public:
  static constexpr int kMaxFrames = 32;

  CallStacks(bool enabled, std::uint32_t sample_every);

  bool enabled() const { return backtrace_ != nullptr; }
  std::uint32_t sample_every() const { return sample_every_; }
  // Why stacks were asked for but are off (libunwind missing), else empty.
  const std::string& load_error() const { return load_error_; }

  // The interned site of the calling allocation, or 0 when it is not sampled.
  std::uint32_t capture();
  void on_alloc(std::uint32_t site, std::uint64_t bytes);
  void on_free(std::uint32_t site, std::uint64_t bytes);

  // The report's "stacks" object (JSON): the `top` sites by bytes allocated, each frame
  // symbolised (dladdr; C++ names demangled).
  std::string report_json(std::size_t top) const;

  void prepare_fork();
  void parent_after_fork();
  void child_after_fork();

 private:
  using Backtrace = int (*)(void**, int);
  struct Site {
    std::vector<void*> frames;
    std::uint64_t allocations = 0;
    std::uint64_t bytes = 0;
    std::uint64_t live_bytes = 0;
    std::uint64_t peak_live_bytes = 0;
  };

  std::uint32_t intern(void* const* frames, int count);

  Backtrace backtrace_ = nullptr;
  std::uint32_t sample_every_ = 1;
  std::string load_error_;
  std::atomic<std::uint64_t> calls_{0};
  std::atomic<std::uint64_t> sampled_{0};

  mutable std::mutex mutex_;
  std::unordered_map<std::uint64_t, std::uint32_t> by_hash_;
  std::vector<Site> sites_;  // site id = index + 1
  std::uint64_t sites_dropped_ = 0;
};

}  // namespace tide::interpose

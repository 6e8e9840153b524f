// Memory that submitted work will use, from its submission until it completes: copies, memsets
// and kernel launches register their ranges here. Unmapping device memory (cuMemUnmap) or
// unpinning host memory (cuMemHostUnregister) under such work is a device fault: CUDA does not
// wait for the work (cuMemFree does, and so does the stand-in's), which would then reach an
// unmapped address or unpinned pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace tide::standin {

struct UsedRange {
  std::uintptr_t base;
  std::size_t bytes;
};

// Registers its ranges while it lives: held by the submitted work until the work is done.
// Register before checking that the memory is usable, so that a removal either sees the
// registration or makes the check fail.
class PendingUse {
 public:
  PendingUse(std::vector<UsedRange> ranges, std::string what);
  ~PendingUse();
  PendingUse(const PendingUse&) = delete;
  PendingUse& operator=(const PendingUse&) = delete;

 private:
  friend class PendingUseGuard;
  std::vector<UsedRange> ranges_;
  std::string what_;
};

// Holds registrations off while the caller checks and removes memory.
class PendingUseGuard {
 public:
  PendingUseGuard();
  // Whether pending work uses part of [base, base + bytes); if so, `what` names it.
  bool overlaps(std::uintptr_t base, std::size_t bytes, std::string* what) const;

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace tide::standin

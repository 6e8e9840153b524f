#include "standin/holds.h"

#include <cuda.h>

#include <array>
#include <atomic>
#include <bit>
#include <condition_variable>
#include <mutex>

#include "standin/standin.h"

namespace tide::standin {
namespace {

constexpr unsigned kAllKinds =
    TIDE_STANDIN_OP_H2D | TIDE_STANDIN_OP_D2H | TIDE_STANDIN_OP_D2D | TIDE_STANDIN_OP_KERNEL;
constexpr int kKinds = std::bit_width(kAllKinds);

struct Hold {
  bool held = false;
  std::uint64_t permits = 0;  // held operations that may still start
};

struct Holds {
  std::mutex mutex;
  std::condition_variable changed;
  std::atomic<unsigned> held{0};  // read without the lock before every operation
  std::array<Hold, kKinds> kinds;
};

Holds& holds() {
  static auto* h = new Holds;
  return *h;
}

bool valid(unsigned kinds) { return kinds != 0 && (kinds & ~kAllKinds) == 0; }

}  // namespace

int hold(unsigned kinds) {
  if (!valid(kinds)) return CUDA_ERROR_INVALID_VALUE;
  Holds& h = holds();
  const std::lock_guard lock(h.mutex);
  for (int k = 0; k < kKinds; ++k) {
    if ((kinds >> k) & 1U) h.kinds[k].held = true;
  }
  h.held.fetch_or(kinds);
  return CUDA_SUCCESS;
}

int release(unsigned kinds, std::uint64_t count) {
  if (!valid(kinds)) return CUDA_ERROR_INVALID_VALUE;
  Holds& h = holds();
  {
    const std::lock_guard lock(h.mutex);
    for (int k = 0; k < kKinds; ++k) {
      if (((kinds >> k) & 1U) == 0) continue;
      Hold& hold = h.kinds[k];
      if (count == TIDE_STANDIN_RELEASE_ALL) {
        hold = Hold{};
        h.held.fetch_and(~(1U << k));
      } else if (hold.held) {
        hold.permits = count > UINT64_MAX - hold.permits ? UINT64_MAX : hold.permits + count;
      }
    }
  }
  h.changed.notify_all();
  return CUDA_SUCCESS;
}

void pass_hold(unsigned kind) {
  Holds& h = holds();
  if ((h.held.load() & kind) == 0) return;
  std::unique_lock lock(h.mutex);
  Hold& hold = h.kinds[std::countr_zero(kind)];
  h.changed.wait(lock, [&] { return !hold.held || hold.permits > 0; });
  if (hold.held) --hold.permits;
}

}  // namespace tide::standin

#include "standin/pending_uses.h"

#include <unordered_set>
#include <utility>

namespace tide::standin {
namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_set<const PendingUse*> uses;
};

Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

}  // namespace

PendingUse::PendingUse(std::vector<UsedRange> ranges, std::string what)
    : ranges_(std::move(ranges)), what_(std::move(what)) {
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  r.uses.insert(this);
}

PendingUse::~PendingUse() {
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  r.uses.erase(this);
}

PendingUseGuard::PendingUseGuard() : lock_(registry().mutex) {}

bool PendingUseGuard::overlaps(std::uintptr_t base, std::size_t bytes, std::string* what) const {
  for (const PendingUse* use : registry().uses) {
    for (const UsedRange& range : use->ranges_) {
      if (range.bytes != 0 && range.base < base + bytes && base < range.base + range.bytes) {
        *what = use->what_;
        return true;
      }
    }
  }
  return false;
}

}  // namespace tide::standin

#include "standin/host_access.h"

#include <atomic>

namespace tide::standin {
namespace {
std::atomic<bool> g_host_addressable{false};
}  // namespace

void set_host_addressable(bool on) { g_host_addressable.store(on, std::memory_order_relaxed); }
bool host_addressable() { return g_host_addressable.load(std::memory_order_relaxed); }

}  // namespace tide::standin

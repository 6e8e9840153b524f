#include "interpose/call_stacks.h"

#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>

#include "interpose/real_dlsym.h"
#include "io/json_writer.h"

namespace tide::interpose {
namespace {

// The nongnu libunwind's soname (libunwind-dev's libunwind.so points at it).
constexpr const char* kLibunwind = "libunwind.so.8";
constexpr std::size_t kMaxSites = 1 << 16;

std::uint64_t hash_frames(void* const* frames, int count) {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a over the addresses
  for (int i = 0; i < count; ++i) {
    h ^= reinterpret_cast<std::uintptr_t>(frames[i]);
    h *= 1099511628211ULL;
  }
  return h;
}

std::string hex(std::uintptr_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(value));
  return text;
}

io::json::Object frame_json(void* ip) {
  io::json::Object out;
  out.add_string("ip", hex(reinterpret_cast<std::uintptr_t>(ip)));
  Dl_info info{};
  // ip - 1: a return address may already belong to the next function.
  if (dladdr(static_cast<char*>(ip) - 1, &info) != 0) {
    if (info.dli_fname != nullptr) {
      out.add_string("object", info.dli_fname);
      out.add_string("offset", hex(reinterpret_cast<std::uintptr_t>(ip) -
                                   reinterpret_cast<std::uintptr_t>(info.dli_fbase)));
    }
    if (info.dli_sname != nullptr) {
      int status = -1;
      char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
      std::string function = status == 0 && demangled != nullptr ? demangled : info.dli_sname;
      std::free(demangled);  // NOLINT(cppcoreguidelines-no-malloc): __cxa_demangle's buffer
      function += "+" + hex(reinterpret_cast<std::uintptr_t>(ip) -
                            reinterpret_cast<std::uintptr_t>(info.dli_saddr));
      out.add_string("function", function);
    }
  }
  return out;
}

}  // namespace

CallStacks::CallStacks(bool enabled, std::uint32_t sample_every)
    : sample_every_(std::max<std::uint32_t>(sample_every, 1)) {
  if (!enabled) return;
  void* library = dlopen(kLibunwind, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    load_error_ = std::string("could not load ") + kLibunwind + " (" +
                  (why != nullptr ? why : "unknown error") +
                  "): install libunwind (Debian: libunwind8) for TIDE_STACKS";
    return;
  }
  backtrace_ = reinterpret_cast<Backtrace>(real_dlsym()(library, "unw_backtrace"));
  if (backtrace_ == nullptr) load_error_ = std::string(kLibunwind) + " has no unw_backtrace";
}

std::uint32_t CallStacks::capture() {
  if (backtrace_ == nullptr) return 0;
  if (calls_.fetch_add(1, std::memory_order_relaxed) % sample_every_ != 0) return 0;
  void* frames[kMaxFrames + 8];
  const int count = backtrace_(frames, kMaxFrames + 8);
  // Drop the interposer's own frames (this function, the hook body, the slot hook).
  int skip = 0;
  while (skip < count && is_own_address(frames[skip])) ++skip;
  const int kept = std::min(count - skip, kMaxFrames);
  if (kept <= 0) return 0;
  sampled_.fetch_add(1, std::memory_order_relaxed);
  return intern(frames + skip, kept);
}

std::uint32_t CallStacks::intern(void* const* frames, int count) {
  std::uint64_t h = hash_frames(frames, count);
  const std::lock_guard lock(mutex_);
  for (;; ++h) {  // probe on the rare hash collision
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    const Site& site = sites_[it->second - 1];
    if (site.frames.size() == static_cast<std::size_t>(count) &&
        std::equal(site.frames.begin(), site.frames.end(), frames)) {
      return it->second;
    }
  }
  if (sites_.size() >= kMaxSites) {
    ++sites_dropped_;
    return 0;
  }
  sites_.push_back(Site{std::vector<void*>(frames, frames + count)});
  const auto id = static_cast<std::uint32_t>(sites_.size());
  by_hash_.emplace(h, id);
  return id;
}

void CallStacks::on_alloc(std::uint32_t site, std::uint64_t bytes) {
  if (site == 0) return;
  const std::lock_guard lock(mutex_);
  Site& s = sites_[site - 1];
  ++s.allocations;
  s.bytes += bytes;
  s.live_bytes += bytes;
  s.peak_live_bytes = std::max(s.peak_live_bytes, s.live_bytes);
}

void CallStacks::on_free(std::uint32_t site, std::uint64_t bytes) {
  if (site == 0) return;
  const std::lock_guard lock(mutex_);
  if (site > sites_.size()) return;
  Site& s = sites_[site - 1];
  s.live_bytes -= std::min(s.live_bytes, bytes);
}

std::string CallStacks::report_json(std::size_t top) const {
  io::json::Object out;
  out.add_bool("enabled", enabled());
  if (!load_error_.empty()) out.add_string("error", load_error_);
  out.add_uint("sample_every", sample_every_);
  out.add_uint("allocations_seen", calls_.load(std::memory_order_relaxed));
  out.add_uint("allocations_sampled", sampled_.load(std::memory_order_relaxed));
  std::vector<Site> sites;
  std::uint64_t dropped = 0;
  {
    const std::lock_guard lock(mutex_);
    sites = sites_;
    dropped = sites_dropped_;
  }
  out.add_uint("sites", sites.size());
  out.add_uint("sites_dropped", dropped);
  std::vector<std::size_t> order(sites.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return sites[a].bytes != sites[b].bytes ? sites[a].bytes > sites[b].bytes : a < b;
  });
  io::json::Array list(",\n  ");  // a site per line
  for (std::size_t i = 0; i < std::min(top, order.size()); ++i) {
    const Site& s = sites[order[i]];
    io::json::Array frames;
    for (void* frame : s.frames) frames.add(frame_json(frame));
    list.add(io::json::Object()
                 .add_uint("allocations", s.allocations)
                 .add_uint("bytes", s.bytes)
                 .add_uint("live_bytes_at_exit", s.live_bytes)
                 .add_uint("peak_live_bytes", s.peak_live_bytes)
                 .add("frames", frames));
  }
  out.add("top_sites", list);
  return out.text();
}

void CallStacks::prepare_fork() { mutex_.lock(); }

void CallStacks::parent_after_fork() { mutex_.unlock(); }

void CallStacks::child_after_fork() {
  // Sites stay (they are code addresses, valid in the child); their counts start again.
  for (Site& s : sites_) s = Site{std::move(s.frames)};
  calls_.store(0, std::memory_order_relaxed);
  sampled_.store(0, std::memory_order_relaxed);
  mutex_.unlock();
}

}  // namespace tide::interpose

// Host memory that could not be had, said in words: the C ABI reports it as
// TIDE_ERROR_OUT_OF_MEMORY with this message, and callers that fall back on out-of-memory
// (a bad_alloc) do so here too.
#pragma once

#include <new>
#include <string>
#include <utility>

namespace tide::allocator::pinned {

// Beyond what the host can give this process (host_budget.h).
class HostMemoryError : public std::bad_alloc {
 public:
  explicit HostMemoryError(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

// Past this rank's share of TIDE_NODE_PINNED_LIMIT (node_limit.h).
class PinnedLimitError : public HostMemoryError {
 public:
  using HostMemoryError::HostMemoryError;
};

}  // namespace tide::allocator::pinned

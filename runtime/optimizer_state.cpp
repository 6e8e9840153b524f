#include "runtime/optimizer_state.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "allocator/pinned/arena.h"
#include "allocator/pinned/host_budget.h"
#include "allocator/pinned/memory_error.h"
#include "allocator/pinned/node_limit.h"
#include "config/bytes.h"

namespace tide::runtime {
namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("tide: optimizer state: " + message);
}

bool known(kernels::Dtype d) {
  return d == kernels::Dtype::kFloat32 || d == kernels::Dtype::kBFloat16 ||
         d == kernels::Dtype::kFloat16;
}

// Pageable buffers start at a cache line and an AVX-512 vector, as the arena's do.
constexpr std::size_t kPageableAlignment = 64;
// Spare slots kept pinned when the state outgrows the pinned share: a double-buffered GPU
// pipeline's (plans with more buffers in flight fall back to the CPU for the rest).
constexpr std::size_t kKeptSpares = 2;

// Once per process: a run whose state outgrew its pinned share keeps going, but slower, and the
// user should know which knob buys the speed back.
void say_pageable(const OptimizerState& state) {
  static std::once_flag once;
  std::call_once(once, [&] {
    const allocator::pinned::NodePinned node = allocator::pinned::node_pinned();
    const std::string why =
        node.rank_limit_bytes != 0
            ? "it is past local rank " + std::to_string(node.local_rank) + "'s pinned share " +
                  config::format_bytes(node.rank_limit_bytes) +
                  " of TIDE_NODE_PINNED_LIMIT=" + config::format_bytes(node.node_limit_bytes) +
                  " (LOCAL_WORLD_SIZE=" + std::to_string(node.local_ranks) +
                  "): raise the limit to update it on the GPU again"
            : "the host would not pin more (RLIMIT_MEMLOCK or memory pressure): raise the "
              "memlock limit or free host memory to update it on the GPU again";
    std::fprintf(stderr,
                 "tide: optimizer state: %zu of %zu subgroups (%s) are held in pageable memory "
                 "and updated on the CPU only: %s\n",
                 state.pageable_subgroups(), state.size(),
                 config::format_bytes(state.pageable_bytes()).c_str(), why.c_str());
  });
}

}  // namespace

void check_state_options(const StateOptions& options) {
  const bool quantized = options.state_format == kernels::StateFormat::kBlockQ8;
  const bool bf16_master = options.master_dtype == kernels::Dtype::kBFloat16;
  require(known(options.grad_dtype), "unknown gradient dtype");
  require(known(options.param_dtype), "unknown parameter dtype");
  require(quantized || options.state_dtype == kernels::Dtype::kFloat32 ||
              options.state_dtype == kernels::Dtype::kBFloat16,
          "the moments' dtype must be float32 or bfloat16");
  require(quantized || options.state_format == kernels::StateFormat::kDtype,
          "unknown state format");
  require(options.master_dtype == kernels::Dtype::kFloat32 || bf16_master,
          "the master weights' dtype must be float32 or bfloat16");
  // Checked before the dtypes each needs, so that asking for both says why they cannot go
  // together rather than which parameter dtype one of them wanted.
  require(!(options.host_params && bf16_master),
          "host-resident parameters are their own fp32 master weights; bf16 master weights need "
          "bf16 parameters: choose one");
  require(!bf16_master || options.param_dtype == kernels::Dtype::kBFloat16,
          "bf16 master weights are the model's parameters: they must be bfloat16");
  require(!bf16_master || !quantized,
          "bf16 master weights with 8-bit moments are not supported (use float32 or bfloat16 "
          "moments)");
  require(!options.host_params || (options.param_dtype == kernels::Dtype::kFloat32 && !quantized),
          "host-resident parameters must be float32 (their own master weights) with moments of "
          "float32 or bfloat16");
}

OptimizerState::OptimizerState(std::vector<SubgroupSpec> subgroups, const StateOptions& options)
    : specs_(std::move(subgroups)), options_(options) {
  require(!specs_.empty(), "no subgroups");
  check_state_options(options_);
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    SubgroupSpec& s = specs_[i];
    const std::string which = "subgroup " + std::to_string(i);
    require(s.params >= 1 && s.params <= (std::uint64_t{1} << 40),
            which + " has " + std::to_string(s.params) + " parameters (1 to 2^40)");
    std::sort(s.slices.begin(), s.slices.end(),
              [](const ParamSlice& a, const ParamSlice& b) { return a.offset < b.offset; });
    std::uint64_t next = 0;
    for (const ParamSlice& slice : s.slices) {
      require(slice.offset == next && slice.count >= 1,
              which + ": its parameter slices must cover elements 0 to " +
                  std::to_string(s.params) + " without gap or overlap (at element " +
                  std::to_string(next) + ")");
      require(slice.device_ptr != 0 && slice.device_ptr % param_bytes() == 0,
              which + ": a slice's device pointer is null or not aligned to its element size");
      next += slice.count;
    }
    require(next == s.params, which + ": its parameter slices cover " + std::to_string(next) +
                                  " of " + std::to_string(s.params) + " elements");
  }
  std::uint64_t index = 0;
  for (const SubgroupSpec& s : specs_) {
    first_index_.push_back(index);
    index += s.params;
  }
  // Refused now, with what is needed and what there is, rather than by the OOM killer later.
  std::uint64_t host_bytes = 0;
  for (std::size_t i = 0; i < specs_.size(); ++i) host_bytes += buffer_bytes(i);
  allocator::pinned::check_host_budget(host_bytes,
                                       "the optimizer state (" + std::to_string(specs_.size()) +
                                           (specs_.size() == 1 ? " subgroup)" : " subgroups)"));
  buffers_.resize(specs_.size());
  std::size_t pinned = 0;  // subgroups [0, pinned) are pinned, the rest pageable
  try {
    arena_ = std::make_unique<allocator::pinned::PinnedArena>();
  } catch (const allocator::pinned::HostMemoryError&) {
    // Not even the arena's own metadata could be pinned (the share is full already): all of the
    // state is pageable, and nothing needs an arena (arena() says so to whoever asks).
  }
  try {
    while (arena_ && pinned < specs_.size()) {
      try {
        allocate_buffers(pinned, false);
        ++pinned;
      } catch (const allocator::pinned::HostMemoryError&) {
        // Past the rank's pinned share, or the host would not lock more: the budget above said
        // the memory is there, so the rest is held pageable rather than refused.
        pinned = keep_spares(pinned);
        break;
      }
    }
    for (std::size_t i = pinned; i < specs_.size(); ++i) allocate_buffers(i, true);
  } catch (...) {
    for (const auto& [n, slot] : spares_) arena_->deallocate(slot, slot_bytes_for(n));
    spares_.clear();
    for (std::size_t i = 0; i < buffers_.size(); ++i) free_buffers(i);
    buffers_.clear();
    throw;
  }
  if (pinned < specs_.size()) say_pageable(*this);
}

// The pinned subgroups go to the GPU only with a pinned spare slot each in flight (see above),
// which a full share could not give later: room for kKeptSpares is made now, by moving the last
// pinned subgroups to pageable memory while it is missing. Returns how many stay pinned.
std::size_t OptimizerState::keep_spares(std::size_t pinned) {
  spares_.reserve(kKeptSpares);
  while (pinned > 0 && spares_.size() < kKeptSpares) {
    try {
      // Subgroup 0's size: tide splits evenly, so it is the size of all but a remainder.
      void* slot = arena_->allocate(slot_bytes(0), slot_alignment());
      spares_.emplace_back(params(0), static_cast<float*>(slot));  // reserved: no throw
    } catch (const std::bad_alloc&) {
      free_buffers(--pinned);
    }
  }
  if (pinned == 0) {
    // No GPU subgroup is left to use them.
    for (const auto& [n, slot] : spares_) arena_->deallocate(slot, slot_bytes_for(n));
    spares_.clear();
  }
  return pinned;
}

OptimizerState::~OptimizerState() {
  if (abandoned_) {
    static_cast<void>(arena_.release());  // its chunks stay registered and mapped
    return;
  }
  for (const auto& [n, slot] : spares_) arena_->deallocate(slot, slot_bytes_for(n));
  for (std::size_t i = 0; i < buffers_.size(); ++i) free_buffers(i);
}

void* OptimizerState::take(std::uint64_t bytes, std::size_t alignment, bool pageable) {
  if (!pageable) return arena_->allocate(bytes, alignment);
  return ::operator new (bytes, std::align_val_t{std::max(alignment, kPageableAlignment)});
}

void OptimizerState::give(void* p, std::uint64_t bytes, std::size_t alignment,
                          bool pageable) noexcept {
  if (p == nullptr) return;
  if (!pageable) {
    arena_->deallocate(p, bytes);
    return;
  }
  ::operator delete (p, std::align_val_t{std::max(alignment, kPageableAlignment)});
}

void OptimizerState::allocate_buffers(std::size_t i, bool pageable) {
  const std::uint64_t n = specs_[i].params;
  Buffers& b = buffers_[i];
  b.pageable = pageable;
  try {
    b.state = take(slot_bytes(i), slot_alignment(), pageable);
    std::memset(b.state, 0, slot_bytes(i));
    if (host_params()) return;  // no gradient buffer, no weight copy
    b.grad = take(n * grad_bytes(), 0, pageable);
    std::memset(b.grad, 0, n * grad_bytes());
    if (separate_weights()) {
      b.copy = take(n * param_bytes(), 0, pageable);
      std::memset(b.copy, 0, n * param_bytes());
    }
  } catch (...) {
    free_buffers(i);
    throw;
  }
}

void OptimizerState::free_buffers(std::size_t i) noexcept {
  const std::uint64_t n = specs_[i].params;
  Buffers& b = buffers_[i];
  give(b.state, slot_bytes(i), slot_alignment(), b.pageable);
  give(b.grad, n * grad_bytes(), 0, b.pageable);
  give(b.copy, n * param_bytes(), 0, b.pageable);
  b = Buffers{};
}

std::uint64_t OptimizerState::buffer_bytes(std::size_t i) const {
  std::uint64_t bytes = slot_bytes(i);
  if (!host_params()) bytes += params(i) * grad_bytes();
  if (separate_weights()) bytes += params(i) * param_bytes();
  return bytes;
}

std::size_t OptimizerState::pageable_subgroups() const {
  std::size_t n = 0;
  for (const Buffers& b : buffers_) n += b.pageable ? 1 : 0;
  return n;
}

std::uint64_t OptimizerState::pageable_bytes() const {
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    if (buffers_[i].pageable) bytes += buffer_bytes(i);
  }
  return bytes;
}

allocator::pinned::PinnedArena& OptimizerState::arena() const {
  if (!arena_) {
    throw allocator::pinned::HostMemoryError(
        "tide: optimizer state: no pinned memory could be had for it (all of it is pageable)");
  }
  return *arena_;
}

std::vector<std::uint64_t> OptimizerState::sizes() const {
  std::vector<std::uint64_t> out;
  out.reserve(specs_.size());
  for (const SubgroupSpec& s : specs_) out.push_back(s.params);
  return out;
}

namespace {
std::uint64_t block_aligned(std::uint64_t bytes) {
  return (bytes + kernels::kQuantBlock - 1) / kernels::kQuantBlock * kernels::kQuantBlock;
}
}  // namespace

std::uint64_t OptimizerState::moment_offset(std::uint64_t n, unsigned which) const {
  if (!quantized()) return ((host_params() ? 0 : 4) + which * moment_bytes()) * n;
  return block_aligned(4 * n) + which * block_aligned(n);
}

std::uint64_t OptimizerState::scale_offset(std::uint64_t n, unsigned which) const {
  return moment_offset(n, 1) + block_aligned(n) + 4 * which * kernels::quant_blocks(n);
}

std::uint64_t OptimizerState::slot_bytes_for(std::uint64_t n) const {
  if (quantized()) return scale_offset(n, 2);
  return (host_params() ? 2 * moment_bytes() : state_bytes()) * n;
}

std::vector<SlotRange> OptimizerState::slot_ranges(std::uint64_t n, std::uint64_t first,
                                                   std::uint64_t count) const {
  if (first % kernels::kQuantBlock != 0 || first + count > n || count == 0) {
    throw std::invalid_argument("tide: slot_ranges: elements [" + std::to_string(first) + ", " +
                                std::to_string(first + count) + ") of " + std::to_string(n) +
                                " do not start a quantization block within the slot");
  }
  std::vector<SlotRange> out;
  auto array = [&](std::uint64_t offset, std::uint64_t bytes_per_element) {
    out.push_back({offset + first * bytes_per_element, count * bytes_per_element});
  };
  if (bf16_master()) {
    array(0, 2);      // the bf16 weights
    array(2 * n, 2);  // their compensation
  } else if (!host_params()) {
    array(0, 4);  // the fp32 master
  }
  array(moment_offset(n, 0), moment_bytes());
  array(moment_offset(n, 1), moment_bytes());
  if (quantized()) {
    const std::uint64_t blocks =
        kernels::quant_blocks(first + count) - first / kernels::kQuantBlock;
    for (unsigned which = 0; which < 2; ++which) {
      out.push_back({scale_offset(n, which) + 4 * (first / kernels::kQuantBlock), 4 * blocks});
    }
  }
  return out;
}

// 0: the arena's default. The codes of 8-bit moments start at kQuantBlock-byte boundaries.
std::size_t OptimizerState::slot_alignment() const {
  return quantized() ? kernels::kQuantBlock : 0;
}

bool OptimizerState::contiguous(std::size_t i) const { return spec(i).slices.size() == 1; }

float* OptimizerState::take_spare(std::size_t i) {
  // A pinned spare committed into a pageable subgroup would be freed as pageable memory.
  if (pageable(i)) {
    throw std::logic_error("tide: optimizer state: subgroup " + std::to_string(i) +
                           " is pageable: it is updated on the CPU, in place, with no spare");
  }
  const std::uint64_t n = params(i);
  for (auto it = spares_.begin(); it != spares_.end(); ++it) {
    if (it->first == n) {
      float* slot = it->second;
      spares_.erase(it);
      return slot;
    }
  }
  return static_cast<float*>(arena_->allocate(slot_bytes(i), slot_alignment()));
}

void OptimizerState::give_spare(std::size_t i, float* slot) {
  try {
    spares_.emplace_back(params(i), slot);
  } catch (const std::bad_alloc&) {
    arena_->deallocate(slot, slot_bytes(i));  // the pool only saves allocations
  }
}

float* OptimizerState::commit(std::size_t i, float* slot) {
  return static_cast<float*>(std::exchange(buffers_.at(i).state, slot));
}

std::size_t OptimizerState::spares() const { return spares_.size(); }

void OptimizerState::set_moment_rounding(kernels::MomentRounding rounding, std::uint64_t seed) {
  require(rounding == kernels::MomentRounding::kNearest ||
              rounding == kernels::MomentRounding::kStochastic,
          "unknown moment rounding");
  require(rounding == kernels::MomentRounding::kNearest ||
              (!quantized() && options_.state_dtype == kernels::Dtype::kBFloat16),
          "stochastic rounding applies to bf16 moments only (fp32 moments are not rounded, 8-bit "
          "moments have their own rounding)");
  require(rounding == kernels::MomentRounding::kNearest || !bf16_master(),
          "stochastic rounding of the moments is not supported with bf16 master weights");
  rounding_ = rounding;
  rounding_seed_ = seed;
}

}  // namespace tide::runtime

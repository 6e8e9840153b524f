#include "runtime/optimizer_state.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "allocator/pinned/arena.h"
#include "allocator/pinned/host_budget.h"

namespace tide::runtime {
namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("tide: optimizer state: " + message);
}

bool known(kernels::Dtype d) {
  return d == kernels::Dtype::kFloat32 || d == kernels::Dtype::kBFloat16 ||
         d == kernels::Dtype::kFloat16;
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
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    host_bytes += slot_bytes(i);
    if (!host_params()) host_bytes += specs_[i].params * grad_bytes();
    if (separate_weights()) host_bytes += specs_[i].params * param_bytes();
  }
  allocator::pinned::check_host_budget(host_bytes,
                                       "the optimizer state (" + std::to_string(specs_.size()) +
                                           (specs_.size() == 1 ? " subgroup)" : " subgroups)"));
  arena_ = std::make_unique<allocator::pinned::PinnedArena>();
  buffers_.resize(specs_.size());
  try {
    for (std::size_t i = 0; i < specs_.size(); ++i) {
      const std::uint64_t n = specs_[i].params;
      Buffers& b = buffers_[i];
      b.state = arena_->allocate(slot_bytes(i), slot_alignment());
      std::memset(b.state, 0, slot_bytes(i));
      if (host_params()) continue;  // no gradient buffer, no weight copy
      b.grad = arena_->allocate(n * grad_bytes());
      std::memset(b.grad, 0, n * grad_bytes());
      if (separate_weights()) {
        b.copy = arena_->allocate(n * param_bytes());
        std::memset(b.copy, 0, n * param_bytes());
      }
    }
  } catch (...) {
    buffers_.clear();  // the arena's destructor releases everything
    throw;
  }
}

OptimizerState::~OptimizerState() {
  if (abandoned_) {
    static_cast<void>(arena_.release());  // its chunks stay registered and mapped
    return;
  }
  for (const auto& [n, slot] : spares_) arena_->deallocate(slot, slot_bytes_for(n));
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    const std::uint64_t n = specs_[i].params;
    arena_->deallocate(buffers_[i].state, slot_bytes(i));
    if (buffers_[i].grad) arena_->deallocate(buffers_[i].grad, n * grad_bytes());
    if (buffers_[i].copy) arena_->deallocate(buffers_[i].copy, n * param_bytes());
  }
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

// 0: the arena's default. The codes of 8-bit moments start at kQuantBlock-byte boundaries.
std::size_t OptimizerState::slot_alignment() const {
  return quantized() ? kernels::kQuantBlock : 0;
}

bool OptimizerState::contiguous(std::size_t i) const { return spec(i).slices.size() == 1; }

float* OptimizerState::take_spare(std::size_t i) {
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

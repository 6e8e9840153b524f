// The optimizer state of one rank, split into subgroups: each subgroup's fp32 master weights and
// moments and its gradient buffer live in pinned host memory (a pinned arena), and its model
// parameters (bf16, fp16 or fp32) live in device memory, described as slices.
//
// Host layout of one subgroup of n parameters: its state slot holds param (fp32), exp_avg and
// exp_avg_sq (of the state dtype: fp32, or bf16 for half the moments' bytes) back to back (12n
// bytes with fp32 moments, 8n with bf16: one copy each way moves the whole state); then the
// gradient (n elements of the gradient dtype), and, when the model's parameters are low
// precision, the host copy of the updated weights that CPU updates upload (n elements of the
// parameter dtype).
//
// 8-bit moments (StateOptions::state_format kBlockQ8, kernels/quant8.h): the slot holds param
// (fp32, 4n bytes), then the codes of exp_avg (n bytes) and of exp_avg_sq (n bytes), each
// starting at a kQuantBlock-byte boundary of the slot (the kernels need it; the slot itself is
// kQuantBlock-aligned, on the host and in a GPU buffer), then quant_blocks(n) fp32 scales of each
// moment: 6n bytes and a few of padding and scales. Every subgroup quantizes its own elements in
// blocks from its element 0, so no block straddles two subgroups; only a subgroup's last block
// may be partial (the layout's subgroup cuts need not be multiples of kQuantBlock).
//
// bf16 master weights (StateOptions::master_dtype kBFloat16, bf16 model parameters only): no fp32
// master. The slot's first 4n bytes hold the bf16 weights (2n bytes: the model's parameters, bit
// for bit, and what a CPU update uploads) and then their bf16 compensation (2n bytes, the part
// of the fp32 weight that rounding to bf16 lost: kernels/adam_math.h), then the moments as
// above; there is no separate weight copy. Per parameter that is the same slot bytes as an fp32
// master (so GPU subgroups copy as many bytes), 2 bytes less host memory (the copy), and a CPU
// update moves 2 bytes less. Moments fp32 or bf16 (the kernels have no 8-bit variant).
//
// State slots and spares. A GPU update must not copy its result over the state it started from:
// a copy that fails half way, or a device lost with the copy still queued, would leave a state
// that is neither the old one nor the new one. So the executor copies a GPU subgroup's result
// into a spare slot of the same size and, once the copy is known complete, commits it: the spare
// becomes the subgroup's state slot and the old slot becomes a spare. The spares are a small pool
// (at most as many as GPU subgroups were ever in flight at once, per subgroup size: kept, as
// pinned memory is slow to get), not a second copy of the state. A
// subgroup's state therefore moves between buffers from one step to the next: param(i),
// exp_avg(i) and exp_avg_sq(i) are valid until the next commit (the next update phase). CPU
// tensors that view the state (tide.torch) are re-pointed after each step.
//
// Host-resident parameters (StateOptions::host_params: FSDP2's CPUOffloadPolicy, whose sharded
// fp32 parameters and gradients are in pinned host memory already): the slices' device_ptr are
// host addresses, and the fp32 parameters there are their own master weights. The slot then
// holds the moments only (exp_avg, exp_avg_sq: 8n bytes with fp32 moments), there is no gradient
// buffer (the executor reads each step's gradients where they are: Executor::set_host_gradient)
// and no weight copy: no byte of what is already pinned is held twice.
//
// Pageable subgroups. State that cannot be pinned (past this rank's share of
// TIDE_NODE_PINNED_LIMIT, or the driver refuses to pin more) but fits the host budget is not
// refused: from the first subgroup that cannot be pinned on, every subgroup's buffers (slot,
// gradient, weight copy) are plain aligned host memory, never registered. Such a subgroup is
// updated on the CPU only (pageable(i)): the CPU reads pageable memory at full speed, while a
// GPU copy from it is synchronous and slow, and it would need pinned spares the share does not
// have. It is never resident and its gradients are offloaded synchronously (gradient_offload.h).
// The share keeps room for two spare slots, so that the pinned subgroups can still be updated on
// the GPU (the last pinned subgroups become pageable to make it). Said once per process on
// stderr, with the bytes and the knob to change.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/quant8.h"
#include "kernels/stochastic_round.h"

namespace tide::allocator::pinned {
class PinnedArena;
}

namespace tide::runtime {

// Elements [offset, offset + count) of a subgroup are the model parameters at device_ptr.
struct ParamSlice {
  std::uint64_t offset = 0;
  std::uint64_t count = 0;
  CUdeviceptr device_ptr = 0;
};

struct SubgroupSpec {
  std::uint64_t params = 0;
  std::vector<ParamSlice> slices;  // disjoint; together they cover [0, params)
};

struct StateOptions {
  kernels::Dtype grad_dtype = kernels::Dtype::kBFloat16;
  kernels::Dtype param_dtype = kernels::Dtype::kBFloat16;  // of the model's parameters
  // Of the moments (exp_avg, exp_avg_sq): kFloat32, or kBFloat16 (rounded to nearest even after
  // every update, by every kernel alike). The master weights are fp32 either way.
  kernels::Dtype state_dtype = kernels::Dtype::kFloat32;
  // kBlockQ8: 8-bit block-wise moments (state_dtype is then ignored).
  kernels::StateFormat state_format = kernels::StateFormat::kDtype;
  // kFloat32: an fp32 master; kBFloat16: bf16 master weights with compensation (see above;
  // param_dtype must be kBFloat16 and the moments fp32 or bf16).
  kernels::Dtype master_dtype = kernels::Dtype::kFloat32;
  // The parameters are fp32 in host memory and are the master weights (see above). Needs
  // param_dtype kFloat32 (so not with a bf16 master_dtype) and moments of a dtype (not kBlockQ8).
  bool host_params = false;
};

// The rules between the options' fields (the one place they are checked: OptimizerState's
// constructor calls it, and the C ABI's tide_optimizer_options_check for callers that check
// their arguments before they have parameters). Throws std::invalid_argument naming the rule.
void check_state_options(const StateOptions& options);

// Bytes [offset, offset + bytes) of a state slot.
struct SlotRange {
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};

class OptimizerState {
 public:
  // Validates the specs (sizes, slices that tile each subgroup, aligned device pointers) and
  // allocates the buffers, zeroed: pinned, or pageable from the first subgroup that cannot be
  // pinned (see above). Throws std::invalid_argument naming the problem, HostMemoryError when
  // the whole state exceeds the host budget (host_budget.h).
  OptimizerState(std::vector<SubgroupSpec> subgroups, const StateOptions& options);
  ~OptimizerState();
  OptimizerState(const OptimizerState&) = delete;
  OptimizerState& operator=(const OptimizerState&) = delete;

  std::size_t size() const { return specs_.size(); }
  const SubgroupSpec& spec(std::size_t i) const { return specs_.at(i); }
  std::uint64_t params(std::size_t i) const { return specs_.at(i).params; }
  std::vector<std::uint64_t> sizes() const;
  const StateOptions& options() const { return options_; }

  // Subgroup i's state slot (see above: valid until the next commit); the moments are of
  // options().state_dtype, or 8-bit codes with their block scales (quantized()). slot(i) is the
  // slot's start: the fp32 master, or with bf16_master() the bf16 weights, or with host_params
  // exp_avg. param(i): the fp32 master or with bf16_master() the bf16 weights (the slot's start);
  // null with host_params (the parameters are the master weights).
  float* slot(std::size_t i) const { return static_cast<float*>(buffers_.at(i).state); }
  float* param(std::size_t i) const { return host_params() ? nullptr : slot(i); }
  bool host_params() const { return options_.host_params; }
  bool bf16_master() const { return options_.master_dtype == kernels::Dtype::kBFloat16; }
  // With bf16_master() (else null): the bf16 weights and their bf16 compensation.
  std::uint16_t* master_bf16(std::size_t i) const {
    return bf16_master() ? static_cast<std::uint16_t*>(buffers_.at(i).state) : nullptr;
  }
  std::uint16_t* master_comp(std::size_t i) const {
    return bf16_master() ? static_cast<std::uint16_t*>(at(i, 2 * params(i))) : nullptr;
  }
  void* exp_avg(std::size_t i) const { return at(i, moment_offset(params(i), 0)); }
  void* exp_avg_sq(std::size_t i) const { return at(i, moment_offset(params(i), 1)); }
  // Null unless quantized(): quant_blocks(params(i)) fp32 scales of each moment.
  float* exp_avg_scale(std::size_t i) const { return scale(i, 0); }
  float* exp_avg_sq_scale(std::size_t i) const { return scale(i, 1); }
  bool quantized() const { return options_.state_format == kernels::StateFormat::kBlockQ8; }
  // Bytes of one parameter's state (fp32 master, or bf16 weight and compensation, and both
  // moments): 12, 8 with bf16 moments, 6 with 8-bit moments (whose scales and padding the slot
  // adds: slot_bytes_for). With host_params the slot holds the moments only, but a GPU subgroup
  // still copies the master (the parameter) each way: these are the bytes a GPU subgroup moves
  // per parameter.
  unsigned state_bytes() const { return 4 + 2 * moment_bytes(); }
  unsigned moment_bytes() const {
    return quantized() ? 1u : kernels::dtype_size(options_.state_dtype);
  }
  // The bytes of a state slot for n parameters, and where in it each moment (0: exp_avg,
  // 1: exp_avg_sq) and, quantized, its scales start (see above).
  std::uint64_t slot_bytes_for(std::uint64_t n) const;
  std::uint64_t moment_offset(std::uint64_t n, unsigned which) const;
  std::uint64_t scale_offset(std::uint64_t n, unsigned which) const;
  std::uint64_t slot_bytes(std::size_t i) const { return slot_bytes_for(params(i)); }
  // The bytes of a slot for n parameters that hold elements [first, first + count), array by
  // array in the slot's order (with bf16_master() the bf16 weights first): what a GPU subgroup
  // copies of one chunk. `first` must start a quantization block (a multiple of
  // kernels::kQuantBlock), so that 8-bit moments' codes and scales split where their blocks do;
  // throws std::invalid_argument otherwise, or for elements past n.
  std::vector<SlotRange> slot_ranges(std::uint64_t n, std::uint64_t first,
                                     std::uint64_t count) const;
  // Null with host_params: the gradients are read where they are.
  void* grad(std::size_t i) const { return buffers_.at(i).grad; }
  // Null when the model's parameters are fp32 (param() itself is uploaded) or with bf16_master()
  // (master_bf16() is).
  void* weight_copy(std::size_t i) const { return buffers_.at(i).copy; }
  // The low-precision weights an update writes are a copy of their own (not the state itself:
  // fp32 parameters or bf16 master weights).
  bool separate_weights() const { return low_precision_params() && !bf16_master(); }

  unsigned grad_bytes() const { return kernels::dtype_size(options_.grad_dtype); }
  unsigned param_bytes() const { return kernels::dtype_size(options_.param_dtype); }
  bool low_precision_params() const { return options_.param_dtype != kernels::Dtype::kFloat32; }
  // One slice covering the whole subgroup: the GPU kernel writes the parameters directly.
  bool contiguous(std::size_t i) const;

  // Throws HostMemoryError when there is none (all of the state is pageable: see above).
  allocator::pinned::PinnedArena& arena() const;

  // Subgroup i's buffers are pageable host memory (see above): it is updated on the CPU only.
  bool pageable(std::size_t i) const { return buffers_.at(i).pageable; }
  std::size_t pageable_subgroups() const;
  std::uint64_t pageable_bytes() const;  // of the slots, gradients and weight copies

  // A spare slot for subgroup i's size: from the pool, else newly allocated (throws
  // std::bad_alloc, or CudaError when registering new pinned memory fails).
  float* take_spare(std::size_t i);
  // Gives a spare of subgroup i's size back to the pool.
  void give_spare(std::size_t i, float* slot);
  // Subgroup i's state is now `slot` (a spare holding its new state); returns its old slot,
  // which is a spare from now on.
  float* commit(std::size_t i, float* slot);
  std::size_t spares() const;  // pooled, all sizes

  // Queued device work that could not be waited for may still write this memory: on
  // destruction, leak every buffer (and the arena) instead of freeing it under that work.
  void abandon() { abandoned_ = true; }

  // How bf16 moments are rounded at each update (kernels/stochastic_round.h): nearest even, or
  // stochastically with `seed` (throws std::invalid_argument unless the moments are bf16). Each
  // element's bits hash its global index: subgroup i's element 0 is first_index(i), the sizes of
  // the subgroups before it summed, the same for any split of the same flat state.
  void set_moment_rounding(kernels::MomentRounding rounding, std::uint64_t seed);
  kernels::MomentRounding moment_rounding() const { return rounding_; }
  std::uint64_t rounding_seed() const { return rounding_seed_; }
  std::uint64_t first_index(std::size_t i) const { return first_index_.at(i); }

 private:
  void* at(std::size_t i, std::uint64_t offset) const {
    return static_cast<char*>(buffers_.at(i).state) + offset;
  }
  float* scale(std::size_t i, unsigned which) const {
    return quantized() ? static_cast<float*>(at(i, scale_offset(params(i), which))) : nullptr;
  }
  std::size_t slot_alignment() const;
  // Subgroup i's buffers, pinned or (`pageable`) plain; frees what it took when it throws.
  void allocate_buffers(std::size_t i, bool pageable);
  void free_buffers(std::size_t i) noexcept;
  std::size_t keep_spares(std::size_t pinned);
  void* take(std::uint64_t bytes, std::size_t alignment, bool pageable);
  void give(void* p, std::uint64_t bytes, std::size_t alignment, bool pageable) noexcept;
  std::uint64_t buffer_bytes(std::size_t i) const;

  struct Buffers {
    void* state = nullptr;
    void* grad = nullptr;
    void* copy = nullptr;
    bool pageable = false;
  };
  std::vector<SubgroupSpec> specs_;
  StateOptions options_;
  std::unique_ptr<allocator::pinned::PinnedArena> arena_;
  std::vector<Buffers> buffers_;
  std::vector<std::pair<std::uint64_t, float*>> spares_;  // (elements, slot)
  bool abandoned_ = false;
  kernels::MomentRounding rounding_ = kernels::MomentRounding::kNearest;
  std::uint64_t rounding_seed_ = 0;
  std::vector<std::uint64_t> first_index_;
};

}  // namespace tide::runtime

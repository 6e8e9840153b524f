// The performance model: how long one rank's update phase takes for a given placement.
//
// ---------------------------------------------------------------------------------------------
// The timing model
//
// Rates (planner/rates.h): r_c CPU update, r_cc CPU update while copies run (taken as
// min(r_cc, r_c)), B_h / B_d host→GPU / GPU→host copy alone, B_h2 / B_d2 the same while the other
// direction also runs (full duplex), r_g GPU update. Bytes per parameter (Footprint): a copied in
// per GPU subgroup parameter (fp32 p, m, v = 12, plus the gradient when it comes from host
// memory), b copied out (12), w uploaded per CPU subgroup parameter (its low-precision weights,
// 2 for bf16, which the CPU computes and the model's parameters on the GPU need). With bf16
// moments the state is 8 bytes (a = b = 8); 8-bit moments: a = b = 6 and the block scales. r_c,
// r_cc and r_g, measured with fp32 state, are scaled to the format: r_g by the bytes each update
// moves (Footprint::update_rate_scale: 28/20 for bf16 moments with bf16 gradients and weights,
// 28/16 for 8-bit moments), r_c and r_cc by the factors `tide calibrate` measured for the format
// on this machine, each its own (planner/cpu_update_factors.h: the copies slow a memory-bound
// format more than a compute-bound one), else both by the same bytes' ratio, or for 8-bit
// moments, whose CPU kernels are compute-bound, Footprint::kQ8CpuUpdateFactor.
//
// The host→GPU link carries both the GPU subgroups' copy-ins and the CPU subgroups' weight
// uploads. The uploads are small and steady (each CPU subgroup's weights as soon as it is
// updated), so the model treats them as a flow: while the CPU side runs they take
//     λ = min(w·r_cc, B/2)                          bytes/s of the link (B: the copy-in's rate)
// until T_w = w·W_c / λ (the end of the CPU side, unless the uploads outpace the link), and the
// copy-ins get the rest. W_c is the CPU subgroups' parameters.
//
// GPU side. The GPU subgroups s_1..s_g (params) run, in their order, through three engines —
// copy in, update kernel, copy out — each taking one subgroup at a time in order. A subgroup
// occupies one of D buffers from the start of its copy-in to the end of its copy-out, so the
// copy-in of s_j waits for the copy-out of s_{j-D}. With
//     h_j = time to move a·s_j from H_{j-1}' at B_h(j) − λ before T_w, B_h(j) after
//     u_j = s_j / r_g,   d_j = b·s_j / B_d(j)
// the completion times are
//     H_j = max(H_{j-1}, E_{j-D}) + h_j         copy-in ends  (E_{j-D} = 0 for j ≤ D)
//     U_j = max(U_{j-1}, H_j)     + u_j         update ends
//     E_j = max(E_{j-1}, U_j)     + d_j         copy-out ends, the buffer is free
//     T_gpu = E_g.
// Copy rates: with D ≥ 2 and g ≥ 2 both directions overlap in steady state, so copies run at the
// duplex rates B_h2, B_d2, except the first copy-in and the last copy-out, which have the link to
// themselves (B_h, B_d). With D = 1 (or g = 1) nothing overlaps and every copy runs alone.
//
// CPU side. The CPU update threads work through the W_c parameters of the CPU subgroups together
// (one subgroup at a time, all threads on it), at r_cc while the GPU side runs and r_c after:
//     T_cpu = W_c / r_cc                            if W_c ≤ r_cc · T_gpu
//           = T_gpu + (W_c − r_cc · T_gpu) / r_c    otherwise
//
// Link. Everything the host→GPU link carries, at its rate (duplex when the GPU side overlaps its
// copies, alone otherwise): T_link = (a·W_g + w·W_c) / B_h(2), W_g the GPU subgroups' parameters.
// It binds when the uploads alone come close to filling the link (a fast CPU, a slow link).
//
// Host memory. The CPU update and the GPU subgroups' copies move their bytes through the same
// host DRAM: c per CPU subgroup parameter (read and write the state, read the gradient, write
// the weight copy: 28 for fp32 state, Footprint::cpu_update_host_bytes_per_param) and w more
// when the DMA reads the weights to upload, a + b per GPU subgroup parameter (what it copies in
// and out). DRAM gives B_m bytes/s to the CPU alone and B_mc (taken ≤ B_m) in all while the
// copies run in both directions (their traffic interleaved with the CPU's costs it row
// switches). While both sides run, for O = min(T_gpu, W_c/r_cc), they ask for
//     X_o = (c+w)·r_cc·O + min((a+b)·W_g·O/T_gpu, B_mc·O)        bytes
// and when that is more than B_mc·O both slow down by the same ratio: the overlap stretches to
//     S = max(O, X_o / B_mc)
// and each side does the rest at its own pace after it (the CPU's tail at its rate alone, at
// most B_m/(c+w), at least B_mc/(c+w)):
//     T_host = max(S + T_gpu − O,  S + (c+w)·(W_c − r_cc·O) / max(B_mc, min((c+w)·r_c, B_m)))
// all-CPU: (c+w)·W_c / B_m; all-GPU: (a+b)·W_g / B_m.
//
// Why each side slowed and not a max-term of all bytes over the budget: a max-term is a lower
// bound that assumes host memory can serve the two sides in any proportion until both end
// together, and the planner, minimising, picks exactly the placements where it is loosest (a
// short CPU side, then copies alone that leave host memory idle): on the simulated host-bound
// machine of tests/planner/refine_test.cpp its plan (32 of 50 subgroups on the GPU) ran 9%
// slower than all-CPU, predicted 17% faster. Slowing
// both sides by the oversubscription ratio is what a memory controller that serves requests
// in turn does. The two caps keep T_host non-decreasing in T_gpu (a copy demand above B_mc alone
// would make a slower GPU side shorten the overlap's stretch; a compute-bound CPU tail, slower
// than B_mc/(c+w), is charged to T_cpu instead), so the phase stays monotone in the buffers and
// the planner's search exact (planner.cpp). It is why interleaving buys little on a host whose
// CPU update alone nearly fills B_m: every GPU subgroup still moves a + b of host memory (24
// bytes against the CPU's 30 with fp32 state), and at B_mc < B_m the overlap costs host time.
//
// Phase. T = max(T_cpu, T_gpu, T_link, T_host); all-CPU: max(W / r_c, w·W / B_h, (c+w)·W / B_m)
// (W all parameters).
//
// What it leaves out, on purpose: per-launch latencies (microseconds against tens of
// milliseconds per subgroup of 1e8), the upload of the last CPU subgroup's weights after its
// update (w·s / B_h: under 1% of the phase with subgroups of 1e8), the order in which the link
// serves copy-ins and uploads (the flow above), and a slowdown of copies by the CPU update other
// than through host memory (the rest of the contention, cores and caches, is charged to the CPU,
// whose rate while copies run is measured). Measured subgroup times refine the rates
// (planner/refine.h), which absorbs what the formulas miss.
// ---------------------------------------------------------------------------------------------
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kernels/quant8.h"
#include "planner/cpu_update_factors.h"
#include "planner/rates.h"

namespace tide::planner {

// What a GPU subgroup moves and holds, per parameter.
struct Footprint {
  // fp32 p, m, v: 12; fp32 p with bf16 m, v: 8. Copied in and out, one buffer.
  std::uint32_t state_bytes_per_param = 12;
  std::uint32_t gradient_bytes_per_param = 2;  // bf16 gradient
  // The low-precision weights a CPU subgroup uploads to the model's parameters on the GPU after
  // its update (bf16: 2; 0 for none). GPU subgroups write theirs on the GPU.
  std::uint32_t weight_bytes_per_param = 2;
  // GPU subgroups keep their gradient on the GPU from the backward pass (it is memory held during
  // the phase, nothing to copy) instead of copying it in from pinned host memory with the state.
  bool gradients_on_gpu = true;
  // bf16 master weights (runtime/optimizer_state.h): the state holds the model's weights
  // themselves. A GPU subgroup takes them from the model's parameters on the GPU (2 bytes of its
  // state not copied in), and an update writes no separate weight copy.
  bool weights_in_state = false;
  std::uint32_t state_bytes_on_gpu = 0;  // of state_bytes_per_param, not copied in
  // The low-precision weights a GPU subgroup's update leaves in its buffer until they are written
  // to the model: an area of their own (runtime: Executor::needs_staging), 0 when the weights are
  // the state (fp32 parameters, bf16 master weights).
  std::uint32_t staging_bytes_per_param = 0;
  // What the executor stages for these weights: low-precision ones (bf16, fp16) that are not the
  // state.
  void stage_low_precision_weights() {
    staging_bytes_per_param =
        !weights_in_state && weight_bytes_per_param < 4 ? weight_bytes_per_param : 0;
  }
  // 8-bit block-wise moments (kernels/quant8.h; state_bytes_per_param 6): the state also holds
  // each moment's fp32 scale per kQuantBlock parameters (8 bytes per block, 0.5% more than the 6
  // bytes), copied with it, and the CPU update runs at kQ8CpuUpdateFactor of fp32 state's rate
  // unless calibrated. (8-bit moments and bf16 master weights do not go together: the kernels
  // have no such variant.)
  bool quantized_moments = false;
  // The CPU update's rate against fp32 state's as calibration measured it for this format
  // (calibrate_cpu); 0: not measured, the model's (model_cpu_update_scale).
  double cpu_update_factor = 0;
  // The same while copies run (the contended rate's factor, planner/cpu_update_factors.h); 0:
  // cpu_update_scale's.
  double cpu_update_contended_factor = 0;
  static constexpr std::uint32_t kScaleBytesPerBlock = 8;

  // The state's bytes per parameter on the links: state_bytes_per_param and the scales.
  double state_copy_bytes_per_param() const {
    return state_bytes_per_param +
           (quantized_moments ? double{kScaleBytesPerBlock} / kernels::kQuantBlock : 0.0);
  }
  double h2d_bytes_per_param() const {
    return state_copy_bytes_per_param() - state_bytes_on_gpu +
           (gradients_on_gpu ? 0u : gradient_bytes_per_param);
  }
  double d2h_bytes_per_param() const { return state_copy_bytes_per_param(); }
  // The update rates (CPU and GPU) are measured with fp32 state (kCalibratedStateBytes). A
  // memory-bound update reads and writes the state and reads the gradient and writes the
  // low-precision weights, at a rate in bytes/s that does not depend on the state format: a
  // format that moves fewer bytes updates proportionally more parameters per second. The model
  // multiplies the GPU update rate by this factor (1 for fp32 state; 28/20 = 1.4 for bf16 moments
  // with bf16 gradients and weights), and the CPU's when calibration did not measure the format
  // (the CPU kernels are partly compute-bound: bf16 moments measured 1.15-1.24x, not 1.4x).
  // bf16 master weights: 26 bytes against fp32 state's 28 with fp32 moments (no weight copy).
  static constexpr std::uint32_t kCalibratedStateBytes = 12;
  double update_rate_scale() const {
    const double others = static_cast<double>(gradient_bytes_per_param) + weight_bytes_per_param;
    const double mine = weights_in_state ? gradient_bytes_per_param : others;
    return (2.0 * kCalibratedStateBytes + others) / (2.0 * state_bytes_per_param + mine);
  }
  // The CPU update's rate with 8-bit moments against fp32 state's. The 8-bit CPU kernels are
  // compute-bound (code-map lookups and searches per vector), not memory-bound: their bytes
  // would give 28/16 = 1.75, but `make bench BENCH=cpu_adam` measured 0.36-0.66 of the fp32-state
  // step at 1e7-1e8 parameters with AVX-512 and 0.32-0.35 with AVX2 (README, "8-bit moments").
  // The planner starts from the low end, so that it does not put on the CPU what the CPU cannot
  // do in time; the executor's refinement (planner/refine.h) then learns the real rate.
  static constexpr double kQ8CpuUpdateFactor = 0.35;
  double model_cpu_update_scale() const {
    return quantized_moments ? kQ8CpuUpdateFactor : update_rate_scale();
  }
  // The CPU update rates' factor the model uses: the calibrated one when set.
  double cpu_update_scale() const {
    return cpu_update_factor > 0 ? cpu_update_factor : model_cpu_update_scale();
  }
  bool cpu_update_calibrated() const { return cpu_update_factor > 0; }
  // The contended CPU update rate's factor: its own when calibrated, else the free rate's.
  double cpu_update_contended_scale() const {
    return cpu_update_contended_factor > 0 ? cpu_update_contended_factor : cpu_update_scale();
  }
  // The format whose CPU update calibration measures (planner/cpu_update_factors.h); nullopt
  // for fp32 state (the rates' own) and for state bytes of a format of their own (tide plan
  // --state-bytes), which the model scales by their bytes.
  std::optional<UpdateFormat> update_format() const {
    if (quantized_moments) {
      if (weights_in_state || state_bytes_per_param != 6) return std::nullopt;
      return UpdateFormat::q8_moments;
    }
    if (weights_in_state) {
      if (state_bytes_per_param == 12) return UpdateFormat::bf16_master;
      if (state_bytes_per_param == 8) return UpdateFormat::bf16_master_bf16_moments;
      return std::nullopt;
    }
    if (state_bytes_per_param == 8) return UpdateFormat::bf16_moments;
    return std::nullopt;
  }
  // This footprint's gradients and weights with the state in `format` (update_format's inverse),
  // as tide plan --state-dtype/--master-dtype set it; no calibrated factor.
  Footprint in_format(UpdateFormat format) const {
    const bool master =
        format == UpdateFormat::bf16_master || format == UpdateFormat::bf16_master_bf16_moments;
    Footprint f = *this;
    f.quantized_moments = format == UpdateFormat::q8_moments;
    f.state_bytes_per_param =
        format == UpdateFormat::q8_moments ? 6 : (format == UpdateFormat::bf16_master ? 12 : 8);
    f.weights_in_state = master;
    f.state_bytes_on_gpu = master ? 2 : 0;
    f.cpu_update_factor = 0;
    f.cpu_update_contended_factor = 0;
    return f;
  }
  // Takes the factor measured for this format, if there is one (else the model's stays).
  void calibrate_cpu(const CpuUpdateFactors& factors) {
    const std::optional<UpdateFormat> format = update_format();
    cpu_update_factor = format ? factors[*format] : 0.0;
    cpu_update_contended_factor = format ? factors.contended_or_free(*format) : 0.0;
  }
  // The GPU update stays memory-bound (HBM bandwidth against its arithmetic): the bytes' ratio.
  double gpu_update_scale() const { return update_rate_scale(); }
  std::uint64_t upload_bytes_per_param() const { return weight_bytes_per_param; }
  // Host DRAM bytes per parameter. A CPU update reads and writes the state, reads the gradient
  // and writes the weight copy (fp32 state 2·12 + 2 + 2 = 28; bf16 moments 20; 8-bit moments
  // 16.06; bf16 master 26, 18 with bf16 moments: the weights are in the state), and the DMA then
  // reads the weights it uploads; a GPU subgroup's copies read what they copy in and write what
  // they copy out.
  double cpu_update_host_bytes_per_param() const {
    return 2.0 * state_copy_bytes_per_param() + gradient_bytes_per_param +
           (weights_in_state ? 0u : weight_bytes_per_param);
  }
  double cpu_host_bytes_per_param() const {
    return cpu_update_host_bytes_per_param() + static_cast<double>(upload_bytes_per_param());
  }
  double gpu_host_bytes_per_param() const { return h2d_bytes_per_param() + d2h_bytes_per_param(); }
  // One buffer holds the state, what is copied in and the staged weights: with 8-bit moments, the
  // state slot's layout (runtime/optimizer_state.h: fp32 weights, each moment's codes from a
  // kQuantBlock-byte boundary, then the scales).
  std::uint64_t buffer_bytes(std::uint64_t params) const {
    const std::uint64_t gradient = (gradients_on_gpu ? 0 : params * gradient_bytes_per_param) +
                                   params * staging_bytes_per_param;
    if (!quantized_moments) return params * state_bytes_per_param + gradient;
    auto aligned = [](std::uint64_t bytes) {
      return (bytes + kernels::kQuantBlock - 1) / kernels::kQuantBlock * kernels::kQuantBlock;
    };
    return aligned(4 * params) + 2 * aligned(params) +
           kernels::quant_blocks(params) * kScaleBytesPerBlock + gradient;
  }
  // Held on the GPU for the whole phase by a GPU subgroup.
  std::uint64_t resident_bytes(std::uint64_t params) const {
    return gradients_on_gpu ? params * gradient_bytes_per_param : 0;
  }

  bool operator==(const Footprint&) const = default;
};

// Predicted times of one GPU subgroup, seconds from the start of the phase.
struct GpuTimes {
  double h2d_start = 0;
  double h2d_end = 0;
  double update_end = 0;
  double d2h_end = 0;
};

// The CPU subgroups' weight uploads as the model sees them: a flow of `rate` bytes/s on the
// host→GPU link (before the per-copy cap of half the copy's rate) until `end` seconds.
struct UploadFlow {
  double rate = 0;
  double end = 0;
};

class PerformanceModel {
 public:
  // Throws std::invalid_argument for rates that are not finite and > 0, or a footprint that
  // copies nothing. `rates` are for fp32 state; the model's own (rates()) have the update
  // rates scaled to the footprint's state format (Footprint::cpu_update_scale,
  // gpu_update_scale).
  PerformanceModel(const Rates& rates, const Footprint& footprint);

  const Rates& rates() const { return rates_; }
  const Footprint& footprint() const { return footprint_; }

  // T_gpu of GPU subgroups `sizes` (params, in pipeline order) with `buffers` ≥ 1 buffers, while
  // the CPU updates `cpu_params` and uploads their weights on the same link. `times`, if given,
  // receives each subgroup's times (resized to sizes.size()). `scratch` keeps the planner's inner
  // loop free of allocations.
  double gpu_side(std::span<const std::uint64_t> sizes, std::size_t buffers, double cpu_params,
                  std::vector<double>& scratch, std::vector<GpuTimes>* times = nullptr) const;
  double gpu_side(std::span<const std::uint64_t> sizes, std::size_t buffers,
                  double cpu_params = 0) const;
  // T_gpu with one buffer and no uploads in closed form: nothing overlaps, so it is the sum of
  // every stage at the alone rates, whatever the order (equal to gpu_side(sizes, 1) up to
  // rounding). With uploads it is a lower bound of gpu_side(sizes, 1, cpu_params).
  double serial_gpu_side(double gpu_params) const;

  // T_cpu for `cpu_params` given the GPU side's duration; also when the CPU side has done its
  // first `cpu_params` (it is monotone), which gives each CPU subgroup's predicted times.
  double cpu_side(double cpu_params, double gpu_side) const;

  // T_link: the host→GPU link's busy time, GPU subgroups' copy-ins and CPU subgroups' uploads;
  // `duplex` when the GPU side overlaps its copies (D ≥ 2 and at least two GPU subgroups).
  double link_side(double gpu_params, double cpu_params, bool duplex) const;

  // T_host: the phase as host memory lets it end, both sides slowed by the same ratio while
  // together they ask more than it gives (never shorter when `gpu_side` is longer).
  double host_side(double gpu_params, double cpu_params, double gpu_side) const;
  // The host memory rates as the model uses them (the contended one never above the free one).
  double host_memory_rate() const { return rates_.host_memory; }
  double contended_host_memory_rate() const;

  // max(T_cpu, T_gpu, T_link, T_host).
  double phase(double cpu_params, double gpu_params, double gpu_side, double link_side) const;
  double all_cpu(double params) const;

  // Per-subgroup stage times, in seconds.
  double h2d_time(double params, bool duplex) const;
  // A copy-in of `params` starting at `start` while the uploads `flow` share the link.
  double h2d_time(double params, bool duplex, double start, const UploadFlow& flow) const;
  double d2h_time(double params, bool duplex) const;
  double update_time(double params) const { return params / rates_.gpu_update; }
  // The CPU rate while copies run, as the model uses it (never above the free rate).
  double contended_cpu_rate() const;
  // The uploads of `cpu_params` CPU parameters while the GPU side runs.
  UploadFlow upload_flow(double cpu_params) const;
  // The share of the link the flow takes from a copy at `link_rate` bytes/s.
  static double upload_share(const UploadFlow& flow, double link_rate) {
    return std::min(flow.rate, link_rate / 2);
  }

 private:
  Rates rates_;
  Footprint footprint_;
};

}  // namespace tide::planner

#include "planner/performance_model.h"

#include <gtest/gtest.h>

#include <limits>
#include <stdexcept>
#include <vector>

#include "planner/plan.h"

namespace tide::planner {
namespace {

// Round numbers so that every expected time is exact arithmetic.
Rates round_rates() {
  Rates r;
  r.cpu_update = 1e9;
  r.cpu_update_contended = 0.5e9;
  r.h2d = 12e9;  // 1e9 params of 12 bytes in 1 s
  r.d2h = 12e9;
  r.h2d_duplex = 6e9;  // half as fast when both directions run
  r.d2h_duplex = 6e9;
  r.gpu_update = 4e9;
  return r;
}

// The GPU subgroups' state alone on the links: gradients kept on the GPU, no CPU weight uploads
// (UploadsShareTheHostToGpuLink and the tests after it add them).
Footprint state_only() {
  Footprint f;
  f.gradients_on_gpu = true;
  f.weight_bytes_per_param = 0;
  return f;
}

TEST(PerformanceModel, OneSubgroupIsCopyInUpdateCopyOut) {
  const PerformanceModel model(round_rates(), state_only());
  const std::vector<std::uint64_t> one = {1'000'000'000};
  // 1 s in, 0.25 s update, 1 s out; alone on the link whatever the buffer count.
  EXPECT_DOUBLE_EQ(model.gpu_side(one, 1), 2.25);
  EXPECT_DOUBLE_EQ(model.gpu_side(one, 4), 2.25);
}

// bf16 moments: 8 state bytes per parameter on the links, and the update rates (given for fp32
// state) scaled by the bytes an update moves: 2·12 + 2 + 2 = 28 against 2·8 + 2 + 2 = 20.
TEST(PerformanceModel, Bf16MomentsMoveFewerBytesAndUpdateFaster) {
  Footprint f = state_only();
  f.weight_bytes_per_param = 2;
  EXPECT_DOUBLE_EQ(f.update_rate_scale(), 1.0);
  f.state_bytes_per_param = 8;
  EXPECT_DOUBLE_EQ(f.update_rate_scale(), 28.0 / 20.0);
  const PerformanceModel model(round_rates(), f);
  EXPECT_DOUBLE_EQ(model.rates().cpu_update, 1.4e9);
  EXPECT_DOUBLE_EQ(model.rates().cpu_update_contended, 0.7e9);
  EXPECT_DOUBLE_EQ(model.rates().gpu_update, 5.6e9);
  EXPECT_DOUBLE_EQ(model.rates().h2d, 12e9);  // bytes/s: the bytes per parameter change instead
  // 1.4e9 parameters in 1 s on the CPU (their uploads take 2·1.4e9 / 12e9 s of the link).
  EXPECT_DOUBLE_EQ(model.all_cpu(1.4e9), 1.0);
  // A subgroup of 1.2e9: 0.8 s in and out (8 bytes at 12 GB/s), its update at 5.6e9/s.
  const std::vector<std::uint64_t> one = {1'200'000'000};
  EXPECT_NEAR(model.gpu_side(one, 1), 0.8 + 1.2e9 / 5.6e9 + 0.8, 1e-12);
}

TEST(PerformanceModel, OneBufferSerialisesEverything) {
  const PerformanceModel model(round_rates(), state_only());
  const std::vector<std::uint64_t> three(3, 1'000'000'000);
  EXPECT_DOUBLE_EQ(model.gpu_side(three, 1), 3 * 2.25);
}

TEST(PerformanceModel, BuffersOverlapCopiesAtDuplexRates) {
  const PerformanceModel model(round_rates(), state_only());
  const std::vector<std::uint64_t> three(3, 1'000'000'000);
  // D = 3: in 1 (alone), 2, 2 (duplex): H = 1, 3, 5; U = 1.25, 3.25, 5.25;
  // out 2 (duplex), 2, 1 (alone): E = 3.25, 5.25, 6.25.
  EXPECT_DOUBLE_EQ(model.gpu_side(three, 3), 6.25);
  // D = 2: the third copy-in waits for the first copy-out (3.25): H3 = 5.25, U3 = 5.5, E3 = 6.5.
  EXPECT_DOUBLE_EQ(model.gpu_side(three, 2), 6.5);
  std::vector<double> scratch;
  std::vector<GpuTimes> times;
  model.gpu_side(three, 2, 0, scratch, &times);
  ASSERT_EQ(times.size(), 3u);
  EXPECT_DOUBLE_EQ(times[2].h2d_start, 3.25);
  EXPECT_DOUBLE_EQ(times[2].h2d_end, 5.25);
  EXPECT_DOUBLE_EQ(times[2].update_end, 5.5);
  EXPECT_DOUBLE_EQ(times[2].d2h_end, 6.5);
}

TEST(PerformanceModel, GradientsFromHostAreCopiedInWithTheState) {
  Footprint f;
  f.gradients_on_gpu = false;
  f.gradient_bytes_per_param = 4;
  const PerformanceModel model(round_rates(), f);
  const std::vector<std::uint64_t> one = {1'000'000'000};
  // 16 bytes/param in at 12e9: 4/3 s.
  EXPECT_DOUBLE_EQ(model.gpu_side(one, 1), 16.0 / 12.0 + 0.25 + 1.0);
  EXPECT_EQ(f.buffer_bytes(10), 160u);
  EXPECT_EQ(f.resident_bytes(10), 0u);
  f.gradients_on_gpu = true;
  EXPECT_EQ(f.buffer_bytes(10), 120u);
  EXPECT_EQ(f.resident_bytes(10), 40u);
}

TEST(PerformanceModel, CpuIsContendedWhileTheGpuSideRuns) {
  const PerformanceModel model(round_rates(), state_only());
  // No GPU side: the free rate.
  EXPECT_DOUBLE_EQ(model.cpu_side(2e9, 0), 2.0);
  // All of it while copies run: half rate.
  EXPECT_DOUBLE_EQ(model.cpu_side(1e9, 3), 2.0);
  // 1 s contended (0.5e9 done), the remaining 1.5e9 at the free rate.
  EXPECT_DOUBLE_EQ(model.cpu_side(2e9, 1), 2.5);
  EXPECT_DOUBLE_EQ(model.phase(2e9, 0, 1, 0), 2.5);
  EXPECT_DOUBLE_EQ(model.phase(0.1e9, 0, 3, 0), 3.0);
  EXPECT_DOUBLE_EQ(model.phase(0.1e9, 0, 3, 3.5), 3.5);  // the link's time binds
  EXPECT_DOUBLE_EQ(model.all_cpu(3e9), 3.0);
}

TEST(PerformanceModel, ContendedRateNeverExceedsTheFreeRate) {
  Rates r = round_rates();
  r.cpu_update_contended = 2e9;  // a noisy calibration
  const PerformanceModel model(r, state_only());
  EXPECT_DOUBLE_EQ(model.contended_cpu_rate(), 1e9);
  EXPECT_DOUBLE_EQ(model.cpu_side(1e9, 5), 1.0);
}

TEST(PerformanceModel, RejectsBadRates) {
  Rates r = round_rates();
  r.h2d_duplex = 0;
  try {
    PerformanceModel model(r, state_only());
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("h2d_duplex_bytes_per_s"), std::string::npos);
  }
  r = round_rates();
  r.gpu_update = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(PerformanceModel(r, state_only()), std::invalid_argument);
}

TEST(PerformanceModel, UploadsShareTheHostToGpuLink) {
  Rates r = round_rates();
  r.cpu_update_contended = 1e9;  // 2 bytes of weights per parameter: 2e9 bytes/s of uploads
  Footprint f = state_only();
  f.weight_bytes_per_param = 2;
  const PerformanceModel model(r, f);
  const UploadFlow flow = model.upload_flow(3e9);
  EXPECT_DOUBLE_EQ(flow.rate, 2e9);
  EXPECT_DOUBLE_EQ(flow.end, 3.0);  // the CPU's 3e9 parameters at 1e9/s
  const std::vector<std::uint64_t> one = {1'000'000'000};
  // 12e9 bytes at 12e9 - 2e9 while the uploads run: 1.2 s; then 0.25 s update, 1 s out.
  EXPECT_DOUBLE_EQ(model.gpu_side(one, 1, 3e9), 2.45);
  // Uploads that end during the copy-in: 1 s at 10e9, the last 2e9 bytes at 12e9.
  EXPECT_DOUBLE_EQ(model.h2d_time(1e9, false, 0, model.upload_flow(1e9)), 1.0 + 2.0 / 12.0);
  // A copy-in that starts after them has the link to itself.
  EXPECT_DOUBLE_EQ(model.h2d_time(1e9, false, 3.0, flow), 1.0);
  // No CPU parameters, no uploads.
  EXPECT_DOUBLE_EQ(model.gpu_side(one, 1, 0), 2.25);
  // The link: 12e9 bytes of copy-in and 6e9 of weights, alone at 12e9 or duplex at 6e9.
  EXPECT_DOUBLE_EQ(model.link_side(1e9, 3e9, false), 1.5);
  EXPECT_DOUBLE_EQ(model.link_side(1e9, 3e9, true), 3.0);
}

TEST(PerformanceModel, UploadsTakeAtMostHalfOfACopyInsLink) {
  Rates r = round_rates();
  r.cpu_update_contended = 1e9;
  Footprint f = state_only();
  f.weight_bytes_per_param = 8;  // 8e9 bytes/s of uploads: more than the link can give them
  const PerformanceModel model(r, f);
  const UploadFlow flow = model.upload_flow(1e9);
  EXPECT_DOUBLE_EQ(flow.rate, 8e9);
  EXPECT_DOUBLE_EQ(flow.end, 8e9 / 3e9);  // at half the duplex link
  EXPECT_DOUBLE_EQ(PerformanceModel::upload_share(flow, 12e9), 6e9);
  // 12e9 bytes at 12e9 - 6e9.
  EXPECT_DOUBLE_EQ(model.h2d_time(1e9, false, 0, flow), 2.0);
}

TEST(PerformanceModel, AllCpuIsBoundByTheUploadsWhenTheLinkIsSlow) {
  Rates r = round_rates();
  Footprint f = state_only();
  f.weight_bytes_per_param = 2;
  EXPECT_DOUBLE_EQ(PerformanceModel(r, f).all_cpu(3e9), 3.0);  // 6e9 bytes in 0.5 s
  r.h2d = 1e9;
  EXPECT_DOUBLE_EQ(PerformanceModel(r, f).all_cpu(3e9), 6.0);
}

// The formats calibration measures the CPU update of, as the footprint describes them; fp32 state
// (the rates' own) and state bytes of a format of their own have none.
TEST(PerformanceModel, FootprintNamesItsUpdateFormat) {
  Footprint f;
  EXPECT_EQ(f.update_format(), std::nullopt);
  f.state_bytes_per_param = 8;
  EXPECT_EQ(f.update_format(), UpdateFormat::bf16_moments);
  f.weights_in_state = true;
  f.state_bytes_on_gpu = 2;
  EXPECT_EQ(f.update_format(), UpdateFormat::bf16_master_bf16_moments);
  f.state_bytes_per_param = 12;
  EXPECT_EQ(f.update_format(), UpdateFormat::bf16_master);
  f = Footprint{};
  f.state_bytes_per_param = 6;
  f.quantized_moments = true;
  EXPECT_EQ(f.update_format(), UpdateFormat::q8_moments);
  f.quantized_moments = false;  // tide plan --state-bytes 6: bytes of their own
  EXPECT_EQ(f.update_format(), std::nullopt);
}

// in_format is update_format's inverse, and keeps the gradients and weights it was given.
TEST(PerformanceModel, FootprintInEachUpdateFormat) {
  Footprint base;
  base.gradient_bytes_per_param = 4;
  base.cpu_update_factor = 1.5;
  for (const UpdateFormatInfo& info : kUpdateFormats) {
    const Footprint f = base.in_format(info.format);
    EXPECT_EQ(f.update_format(), info.format) << info.key;
    EXPECT_EQ(f.gradient_bytes_per_param, 4u) << info.key;
    EXPECT_FALSE(f.cpu_update_calibrated()) << info.key;
  }
}

// A factor calibration measured replaces the model's for the CPU update (both of its rates), and
// only for the format it was measured for; the GPU update keeps the bytes' ratio.
TEST(PerformanceModel, UsesTheCalibratedCpuFactorOfItsFormat) {
  CpuUpdateFactors measured;
  measured[UpdateFormat::bf16_moments] = 1.2;
  measured[UpdateFormat::q8_moments] = 0.6;
  Footprint f = state_only();
  f.weight_bytes_per_param = 2;
  f.state_bytes_per_param = 8;  // bf16 moments: the model's factor is 28/20
  f.calibrate_cpu(measured);
  EXPECT_TRUE(f.cpu_update_calibrated());
  EXPECT_DOUBLE_EQ(f.cpu_update_scale(), 1.2);
  EXPECT_DOUBLE_EQ(f.model_cpu_update_scale(), 1.4);
  const PerformanceModel model(round_rates(), f);
  EXPECT_DOUBLE_EQ(model.rates().cpu_update, 1.2e9);
  EXPECT_DOUBLE_EQ(model.rates().cpu_update_contended, 0.6e9);
  EXPECT_DOUBLE_EQ(model.rates().gpu_update, 5.6e9);
  EXPECT_DOUBLE_EQ(model.all_cpu(1.2e9), 1.0);

  Footprint q8 = state_only();
  q8.state_bytes_per_param = 6;
  q8.quantized_moments = true;
  EXPECT_DOUBLE_EQ(PerformanceModel(round_rates(), q8).rates().cpu_update,
                   1e9 * Footprint::kQ8CpuUpdateFactor);
  q8.calibrate_cpu(measured);
  EXPECT_DOUBLE_EQ(PerformanceModel(round_rates(), q8).rates().cpu_update, 0.6e9);

  // Not measured for bf16 master weights: the model's bytes (28/26 with fp32 moments).
  Footprint master = state_only();
  master.weight_bytes_per_param = 2;
  master.weights_in_state = true;
  master.state_bytes_on_gpu = 2;
  master.calibrate_cpu(measured);
  EXPECT_FALSE(master.cpu_update_calibrated());
  EXPECT_DOUBLE_EQ(PerformanceModel(round_rates(), master).rates().cpu_update, 1e9 * 28 / 26);
  // fp32 state is the rates' own, whatever was measured.
  Footprint fp32 = state_only();
  fp32.calibrate_cpu(measured);
  EXPECT_DOUBLE_EQ(PerformanceModel(round_rates(), fp32).rates().cpu_update, 1e9);

  f.cpu_update_factor = -1;
  EXPECT_THROW(PerformanceModel(round_rates(), f), std::invalid_argument);
}

// The CPU update while copies run has a factor of its own when calibration measured it (the
// copies slow a memory-bound format more than a compute-bound one): it scales the contended rate
// only, the free factor the free rate; without it both take the free factor.
TEST(PerformanceModel, UsesTheCalibratedContendedCpuFactorForTheContendedRate) {
  CpuUpdateFactors measured;
  measured[UpdateFormat::q8_moments] = 0.4;
  measured.contended[static_cast<std::size_t>(UpdateFormat::q8_moments)] = 0.7;
  measured[UpdateFormat::bf16_moments] = 1.2;  // no contended factor: the free one for both
  Footprint q8 = state_only();
  q8.state_bytes_per_param = 6;
  q8.quantized_moments = true;
  q8.calibrate_cpu(measured);
  EXPECT_DOUBLE_EQ(q8.cpu_update_scale(), 0.4);
  EXPECT_DOUBLE_EQ(q8.cpu_update_contended_scale(), 0.7);
  const PerformanceModel model(round_rates(), q8);
  EXPECT_DOUBLE_EQ(model.rates().cpu_update, 0.4e9);
  EXPECT_DOUBLE_EQ(model.rates().cpu_update_contended, 0.35e9);  // 0.5e9 x 0.7
  // The CPU side beside the GPU subgroups runs at the contended rate (not 0.5e9 x 0.4).
  EXPECT_DOUBLE_EQ(model.contended_cpu_rate(), 0.35e9);

  Footprint bf16 = state_only();
  bf16.state_bytes_per_param = 8;
  bf16.calibrate_cpu(measured);
  EXPECT_DOUBLE_EQ(bf16.cpu_update_contended_scale(), 1.2);
  const PerformanceModel bf16_model(round_rates(), bf16);
  EXPECT_DOUBLE_EQ(bf16_model.rates().cpu_update_contended, 0.6e9);

  // Given directly (tide_plan_ex), and not calibrated at all: the free factor, then the model's.
  Footprint given = state_only();
  given.state_bytes_per_param = 8;
  given.cpu_update_contended_factor = 0.9;
  EXPECT_DOUBLE_EQ(PerformanceModel(round_rates(), given).rates().cpu_update_contended, 0.45e9);
  given.cpu_update_contended_factor = 0;
  EXPECT_DOUBLE_EQ(given.cpu_update_contended_scale(), given.model_cpu_update_scale());
  given.cpu_update_contended_factor = -1;
  EXPECT_THROW(PerformanceModel(round_rates(), given), std::invalid_argument);
  given.cpu_update_contended_factor = std::numeric_limits<double>::infinity();
  EXPECT_THROW(PerformanceModel(round_rates(), given), std::invalid_argument);
  // in_format drops both.
  q8.cpu_update_contended_factor = 0.7;
  EXPECT_EQ(q8.in_format(UpdateFormat::q8_moments).cpu_update_contended_factor, 0.0);
}

TEST(PerformanceModel, MoreCpuWorkNeverSpeedsTheGpuSide) {
  const PerformanceModel model(round_rates(), Footprint{});
  const std::vector<std::uint64_t> sizes = {300'000'000, 100'000'000, 200'000'000, 100'000'000};
  for (std::size_t d = 1; d <= 4; ++d) {
    double last = 0;
    for (double cpu = 0; cpu <= 8e9; cpu += 0.25e9) {
      const double t = model.gpu_side(sizes, d, cpu);
      EXPECT_GE(t, last) << d << " " << cpu;
      if (d == 1) {
        EXPECT_GE(t * (1 + 1e-12), model.serial_gpu_side(7e8)) << cpu;  // a lower bound
      }
      last = t;
    }
  }
}

TEST(Evaluate, GivesEachSubgroupItsDeviceOrderBufferAndTimes) {
  Workload w;
  w.subgroup_params = {1'000'000'000, 1'000'000'000, 1'000'000'000, 1'000'000'000};
  w.headroom_bytes = 100'000'000'000;
  w.footprint.weight_bytes_per_param = 0;  // EvaluateChargesTheUploads adds them
  const Plan p = evaluate(w, round_rates(), Placement{{3, 1}, 2});
  EXPECT_EQ(p.gpu_order, (std::vector<std::size_t>{3, 1}));
  EXPECT_EQ(p.cpu_order, (std::vector<std::size_t>{0, 2}));
  EXPECT_EQ(p.subgroups[3].device, Device::gpu);
  EXPECT_EQ(p.subgroups[3].position, 0u);
  EXPECT_EQ(p.subgroups[3].buffer, 0u);
  EXPECT_EQ(p.subgroups[1].position, 1u);
  EXPECT_EQ(p.subgroups[1].buffer, 1u);
  EXPECT_EQ(p.subgroups[0].device, Device::cpu);
  EXPECT_EQ(p.subgroups[0].buffer, kNoBuffer);
  EXPECT_EQ(p.buffers, 2u);
  EXPECT_EQ(p.buffer_bytes, 12'000'000'000u);
  EXPECT_EQ(p.resident_bytes, 4'000'000'000u);
  EXPECT_EQ(p.gpu_bytes(), 28'000'000'000u);
  EXPECT_TRUE(p.fits());
  // GPU: in 1, out 2 (duplex) / in 2 (duplex), out 1 → E = 3.25, 4.25.
  EXPECT_DOUBLE_EQ(p.predicted.gpu_side_s, 4.25);
  // CPU: 2e9 params, 4.25 s contended would do 2.125e9: all contended, 4 s.
  EXPECT_DOUBLE_EQ(p.predicted.cpu_side_s, 4.0);
  EXPECT_DOUBLE_EQ(p.predicted.phase_s, 4.25);
  EXPECT_DOUBLE_EQ(p.predicted.all_cpu_s, 4.0);
  EXPECT_DOUBLE_EQ(p.subgroups[0].start_s, 0.0);
  EXPECT_DOUBLE_EQ(p.subgroups[0].end_s, 2.0);
  EXPECT_DOUBLE_EQ(p.subgroups[2].start_s, 2.0);
  EXPECT_DOUBLE_EQ(p.subgroups[2].end_s, 4.0);
  EXPECT_DOUBLE_EQ(p.subgroups[1].end_s, 4.25);
}

TEST(Evaluate, ChargesTheUploads) {
  Workload w;
  w.subgroup_params = {1'000'000'000, 3'000'000'000};
  w.headroom_bytes = 100'000'000'000;
  Rates r = round_rates();
  r.cpu_update_contended = 1e9;
  const Plan p = evaluate(w, r, Placement{{0}, 1});
  // As in UploadsShareTheHostToGpuLink.
  EXPECT_DOUBLE_EQ(p.predicted.gpu_side_s, 2.45);
  EXPECT_DOUBLE_EQ(p.predicted.cpu_side_s, 3.0);
  EXPECT_DOUBLE_EQ(p.predicted.link_s, 1.5);
  EXPECT_DOUBLE_EQ(p.predicted.phase_s, 3.0);
  EXPECT_DOUBLE_EQ(p.subgroups[0].h2d_end_s, 1.2);
  // All on the CPU: 4e9 at 1e9/s; its uploads, 8e9 bytes alone at 12e9, fit in that.
  EXPECT_DOUBLE_EQ(p.predicted.all_cpu_s, 4.0);
  const Plan cpu = all_cpu_plan(w, r);
  EXPECT_DOUBLE_EQ(cpu.predicted.link_s, 8.0 / 12.0);
  EXPECT_DOUBLE_EQ(cpu.predicted.phase_s, 4.0);
}

TEST(Evaluate, ClampsBuffersToTheGpuSubgroups) {
  Workload w;
  w.subgroup_params = {10, 10, 10};
  const Plan p = evaluate(w, round_rates(), Placement{{0}, 5});
  EXPECT_EQ(p.buffers, 1u);
  EXPECT_FALSE(p.fits());  // no headroom given
}

TEST(Evaluate, RejectsMalformedPlacements) {
  Workload w;
  w.subgroup_params = {10, 10, 10};
  EXPECT_THROW(evaluate(w, round_rates(), Placement{{3}, 1}), std::invalid_argument);
  EXPECT_THROW(evaluate(w, round_rates(), Placement{{1, 1}, 1}), std::invalid_argument);
  EXPECT_THROW(evaluate(w, round_rates(), Placement{{1}, 0}), std::invalid_argument);
  w.subgroup_params = {10, 0};
  EXPECT_THROW(evaluate(w, round_rates(), Placement{}), std::invalid_argument);
  w.subgroup_params = {std::uint64_t{1} << 41};
  EXPECT_THROW(evaluate(w, round_rates(), Placement{}), std::invalid_argument);
  w.subgroup_params = {10};
  w.footprint.state_bytes_per_param = 0;
  EXPECT_THROW(evaluate(w, round_rates(), Placement{}), std::invalid_argument);
}

TEST(Evaluate, GpuBytesSaturates) {
  Plan p;
  p.buffers = std::size_t{1} << 40;
  p.buffer_bytes = std::uint64_t{1} << 40;
  EXPECT_EQ(p.gpu_bytes(), std::numeric_limits<std::uint64_t>::max());
}

// Host memory: 28 bytes per CPU-updated parameter with fp32 state (read and write p, m, v, read
// the bf16 gradient, write the bf16 weights) and 2 more when the DMA reads the weights to upload
// them; what a GPU subgroup copies in and out. Each format from its layout.
TEST(PerformanceModel, HostBytesPerParameterFollowTheStateLayout) {
  const Footprint fp32;
  EXPECT_DOUBLE_EQ(fp32.cpu_update_host_bytes_per_param(), 28.0);
  EXPECT_DOUBLE_EQ(fp32.cpu_host_bytes_per_param(), 30.0);
  EXPECT_DOUBLE_EQ(fp32.gpu_host_bytes_per_param(), 24.0);  // gradients kept on the GPU
  Footprint host_gradients = fp32;
  host_gradients.gradients_on_gpu = false;
  EXPECT_DOUBLE_EQ(host_gradients.gpu_host_bytes_per_param(), 26.0);
  EXPECT_DOUBLE_EQ(fp32.in_format(UpdateFormat::bf16_moments).cpu_update_host_bytes_per_param(),
                   20.0);
  EXPECT_DOUBLE_EQ(fp32.in_format(UpdateFormat::q8_moments).cpu_update_host_bytes_per_param(),
                   2 * (6 + 8.0 / 256) + 4);
  // bf16 master weights: the state's 12 bytes (bf16 weights, their compensation, fp32 moments)
  // each way and the gradient; no weight copy.
  EXPECT_DOUBLE_EQ(fp32.in_format(UpdateFormat::bf16_master).cpu_update_host_bytes_per_param(),
                   26.0);
  EXPECT_DOUBLE_EQ(
      fp32.in_format(UpdateFormat::bf16_master_bf16_moments).cpu_update_host_bytes_per_param(),
      18.0);
  // A GPU subgroup with bf16 master weights copies in 2 bytes fewer (they are on the GPU).
  EXPECT_DOUBLE_EQ(fp32.in_format(UpdateFormat::bf16_master).gpu_host_bytes_per_param(), 22.0);
}

Rates host_bound_rates() {
  Rates r = round_rates();
  r.host_memory = 25e9;
  r.host_memory_contended = 20e9;
  return r;
}

TEST(PerformanceModel, HostMemoryBindsWhenBothSidesOversubscribeIt) {
  const Footprint f;  // fp32 state: 30 bytes per CPU parameter, 24 per GPU one
  const PerformanceModel model(host_bound_rates(), f);
  // 1e9 on the CPU at 0.5e9/s while a GPU side of 2 s copies 1e9: 30 GB and 24 GB of host
  // memory at 20 GB/s take 2.7 s, longer than either side.
  EXPECT_DOUBLE_EQ(model.cpu_side(1e9, 2), 2.0);
  EXPECT_DOUBLE_EQ(model.host_side(1e9, 1e9, 2), 2.7);
  EXPECT_DOUBLE_EQ(model.phase(1e9, 1e9, 2, 0), 2.7);
  // The CPU side outlasts the GPU side: 1e9 CPU parameters in its 2 s, with the copies, at
  // 20 GB/s (2.7 s: both slowed), the other 2e9 after it at 25 GB/s alone.
  EXPECT_DOUBLE_EQ(model.host_side(1e9, 3e9, 2), 54e9 / 20e9 + 60e9 / 25e9);
  // The GPU side outlasts the CPU's: the overlap (1e9 CPU parameters in 2 s, a third of the
  // copies of a 6 s GPU side) stretched by the ratio, then the copies' 4 s at their own pace.
  EXPECT_DOUBLE_EQ(model.host_side(3e9, 1e9, 6), (30e9 + 24e9) / 20e9 + 4);
  // All-CPU and all-GPU: the rate alone.
  EXPECT_DOUBLE_EQ(model.all_cpu(2e9), 60e9 / 25e9);
  EXPECT_DOUBLE_EQ(model.host_side(1e9, 0, 2), 24e9 / 25e9);
  // Never shorter with a longer GPU side (the planner's search relies on it).
  double previous = 0;
  for (double side = 0.1; side < 10; side *= 1.3) {
    const double t = model.host_side(1e9, 3e9, side);
    EXPECT_GE(t, previous);
    previous = t;
  }
  // Ample host memory: the other terms, as before.
  Rates ample = host_bound_rates();
  ample.host_memory = ample.host_memory_contended = 1e15;
  EXPECT_DOUBLE_EQ(PerformanceModel(ample, f).phase(1e9, 1e9, 2, 0), 2.0);
  EXPECT_DOUBLE_EQ(PerformanceModel(ample, f).all_cpu(2e9), 2.0);
}

TEST(PerformanceModel, ContendedHostMemoryNeverExceedsItAlone) {
  Rates r = host_bound_rates();
  r.host_memory_contended = 50e9;  // a noisy calibration
  const PerformanceModel model(r, Footprint{});
  EXPECT_DOUBLE_EQ(model.contended_host_memory_rate(), 25e9);
  EXPECT_DOUBLE_EQ(model.host_side(1e9, 1e9, 2), 54e9 / 25e9);
}

// The plan's prediction carries the host term, and a placement bound by it says so.
TEST(PerformanceModel, PredictionHasTheHostTerm) {
  Workload w;
  w.subgroup_params.assign(4, 500'000'000);
  w.headroom_bytes = 100'000'000'000;
  const Plan p = evaluate(w, host_bound_rates(), Placement{{0, 2}, 2});
  EXPECT_GT(p.predicted.host_s, 0.0);
  EXPECT_GE(p.predicted.host_s, p.predicted.cpu_side_s);
  EXPECT_GE(p.predicted.host_s, p.predicted.gpu_side_s);
  EXPECT_DOUBLE_EQ(p.predicted.phase_s, p.predicted.host_s);
  EXPECT_DOUBLE_EQ(p.predicted.all_cpu_s, 2e9 * 30 / 25e9);
}

}  // namespace
}  // namespace tide::planner

// The scheduler's C ABI, as the Python layer will call it.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <unistd.h>

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "capi/planner.h"
#include "capi/status.h"
#include "planner/calibration_file.h"
#include "planner/planner.h"
#include "tide/tide.h"

namespace {

TEST(SchedulerCapi, PlansLikeThePlanner) {
  const std::vector<uint64_t> sizes(50, 100'000'000);
  const tide_plan_footprint footprint = tide_plan_footprint_default();
  EXPECT_EQ(footprint.state_bytes_per_param, 12u);
  tide_rates rates{};
  unsetenv("TIDE_CALIBRATION_FILE");
  setenv("XDG_CACHE_HOME", "/nonexistent-tide-test", 1);
  ASSERT_EQ(tide_rates_resolve(nullptr, &rates), TIDE_OK) << tide::capi::last_error_text();
  EXPECT_EQ(rates.cpu_update, tide::planner::builtin_rates().cpu_update);

  std::vector<uint8_t> device(sizes.size(), 9);
  std::vector<uint32_t> order(sizes.size(), 999);
  tide_plan_summary summary = tide_plan_summary_default();
  ASSERT_EQ(tide_plan(sizes.data(), sizes.size(), 48'000'000'000, &footprint, &rates, device.data(),
                      order.data(), &summary),
            TIDE_OK)
      << tide::capi::last_error_text();

  tide::planner::Workload w;
  w.subgroup_params.assign(sizes.begin(), sizes.end());
  w.headroom_bytes = 48'000'000'000;
  w.footprint.stage_low_precision_weights();  // as tide_plan does, for the executor's buffers
  const auto p = tide::planner::plan(w, tide::planner::builtin_rates());
  EXPECT_EQ(summary.phase_seconds, p.predicted.phase_s);
  EXPECT_EQ(summary.all_cpu_seconds, p.predicted.all_cpu_s);
  EXPECT_EQ(summary.buffers, p.buffers);
  EXPECT_EQ(summary.gpu_bytes, p.gpu_bytes());
  EXPECT_EQ(summary.optimal, 1);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(device[i], p.subgroups[i].device == tide::planner::Device::gpu ? 1 : 0);
    EXPECT_EQ(order[i], p.subgroups[i].position);
  }
  // NULL footprint and rates: the defaults.
  tide_plan_summary defaults = tide_plan_summary_default();
  ASSERT_EQ(tide_plan(sizes.data(), sizes.size(), 48'000'000'000, nullptr, nullptr, device.data(),
                      order.data(), &defaults),
            TIDE_OK);
  EXPECT_EQ(defaults.phase_seconds, summary.phase_seconds);
  unsetenv("XDG_CACHE_HOME");
}

tide::planner::Plan planner_plan(const std::vector<uint64_t>& sizes,
                                 const tide::planner::Footprint& f) {
  tide::planner::Workload w;
  w.subgroup_params.assign(sizes.begin(), sizes.end());
  w.headroom_bytes = 48'000'000'000;
  w.footprint = f;
  w.footprint.stage_low_precision_weights();  // as tide_plan does, for the executor's buffers
  return tide::planner::plan(w, tide::planner::builtin_rates());
}

// tide_plan says what tide_plan_footprint cannot: 8-bit moments (6 state bytes and the block
// scales, the CPU update at its own rate), bf16 master weights, and the CPU update's measured
// factor for the format.
TEST(SchedulerCapi, PlanExPlansEveryStateFormat) {
  const std::vector<uint64_t> sizes(50, 100'000'000);
  const tide_rates rates = tide::capi::rates_to_c(tide::planner::builtin_rates());
  std::vector<uint8_t> device(sizes.size());
  std::vector<uint32_t> order(sizes.size());
  auto plan_ex = [&](const tide_plan_footprint* f, const tide_rates* r) {
    tide_plan_summary summary = tide_plan_summary_default();
    EXPECT_EQ(tide_plan(sizes.data(), sizes.size(), 48'000'000'000, f, r, device.data(),
                        order.data(), &summary),
              TIDE_OK)
        << tide::capi::last_error_text();
    return summary;
  };
  tide_plan_footprint ex = tide_plan_footprint_default();
  EXPECT_EQ(ex.struct_size, sizeof(tide_plan_footprint));
  EXPECT_EQ(ex.state_bytes_per_param, 12u);
  EXPECT_EQ(ex.weight_bytes_per_param, 2u);
  EXPECT_EQ(ex.cpu_update_factor, 0.0);

  tide::planner::Footprint q8;
  q8.state_bytes_per_param = 6;
  q8.quantized_moments = true;
  ex.state_bytes_per_param = 6;
  ex.quantized_moments = 1;
  const tide_plan_summary q8_summary = plan_ex(&ex, &rates);
  const tide::planner::Plan q8_plan = planner_plan(sizes, q8);
  EXPECT_EQ(q8_summary.phase_seconds, q8_plan.predicted.phase_s);
  EXPECT_EQ(q8_summary.all_cpu_seconds, q8_plan.predicted.all_cpu_s);
  EXPECT_EQ(q8_summary.buffer_bytes, q8_plan.buffer_bytes);  // the scales included
  // The same bytes as plain state bytes are another plan (the CPU update at the bytes' ratio).
  ex.quantized_moments = 0;
  EXPECT_NE(plan_ex(&ex, &rates).all_cpu_seconds, q8_summary.all_cpu_seconds);

  // A measured factor: all-CPU is the parameters over the fp32 rate times it.
  ex.quantized_moments = 1;
  ex.cpu_update_factor = 0.5;
  EXPECT_DOUBLE_EQ(plan_ex(&ex, &rates).all_cpu_seconds,
                   5e9 / (0.5 * tide::planner::builtin_rates().cpu_update));
  // The contended rate's own factor (the CPU side beside the GPU subgroups), else the free one.
  EXPECT_EQ(ex.cpu_update_contended_factor, 0.0);
  q8.cpu_update_factor = 0.5;
  q8.cpu_update_contended_factor = 0.5;
  EXPECT_EQ(plan_ex(&ex, &rates).phase_seconds, planner_plan(sizes, q8).predicted.phase_s);
  ex.cpu_update_contended_factor = 1.5;
  q8.cpu_update_contended_factor = 1.5;
  const tide_plan_summary contended = plan_ex(&ex, &rates);
  EXPECT_EQ(contended.phase_seconds, planner_plan(sizes, q8).predicted.phase_s);
  // A caller built against the first version passes a smaller struct: the field beyond it is
  // not read (the free factor for both).
  ex.struct_size = offsetof(tide_plan_footprint, cpu_update_contended_factor);
  q8.cpu_update_contended_factor = 0.5;
  EXPECT_EQ(plan_ex(&ex, &rates).phase_seconds, planner_plan(sizes, q8).predicted.phase_s);
  EXPECT_NE(contended.phase_seconds, plan_ex(&ex, &rates).phase_seconds);

  tide::planner::Footprint master;
  master.weights_in_state = true;
  master.state_bytes_on_gpu = 2;
  ex = tide_plan_footprint_default();
  ex.bf16_master = 1;
  EXPECT_EQ(plan_ex(&ex, &rates).phase_seconds, planner_plan(sizes, master).predicted.phase_s);

  // The default footprint is what a NULL one means.
  const tide_plan_footprint plain = tide_plan_footprint_default();
  tide_plan_summary summary = tide_plan_summary_default();
  ASSERT_EQ(tide_plan(sizes.data(), sizes.size(), 48'000'000'000, &plain, &rates, device.data(),
                      order.data(), &summary),
            TIDE_OK);
  EXPECT_EQ(summary.phase_seconds, plan_ex(nullptr, &rates).phase_seconds);
}

// Without rates, the calibration file's: its rates and its CPU update factor for the format.
TEST(SchedulerCapi, PlanExTakesTheCalibrationFilesFactor) {
  namespace fs = std::filesystem;
  const fs::path path =
      fs::temp_directory_path() / ("tide_capi_calibration_" + std::to_string(::getpid()) + ".json");
  tide::planner::Calibration c;
  c.machine.hostname = "h";
  c.machine.cpu_threads = 1;
  c.rates = tide::planner::builtin_rates();
  c.cpu_update_factors[tide::planner::UpdateFormat::q8_moments] = 0.8;
  tide::planner::save_calibration(path, c);
  setenv("TIDE_CALIBRATION_FILE", path.c_str(), 1);
  const std::vector<uint64_t> sizes(4, 100'000'000);
  std::vector<uint8_t> device(sizes.size());
  std::vector<uint32_t> order(sizes.size());
  tide_plan_footprint ex = tide_plan_footprint_default();
  ex.state_bytes_per_param = 6;
  ex.quantized_moments = 1;
  tide_plan_summary summary = tide_plan_summary_default();
  ASSERT_EQ(
      tide_plan(sizes.data(), sizes.size(), 0, &ex, nullptr, device.data(), order.data(), &summary),
      TIDE_OK)
      << tide::capi::last_error_text();
  EXPECT_DOUBLE_EQ(summary.all_cpu_seconds, 4e8 / (0.8 * c.rates.cpu_update));
  // Given rates: the model's factor (0.35 for 8-bit moments), not the file's.
  const tide_rates rates = tide::capi::rates_to_c(c.rates);
  ASSERT_EQ(
      tide_plan(sizes.data(), sizes.size(), 0, &ex, &rates, device.data(), order.data(), &summary),
      TIDE_OK);
  EXPECT_DOUBLE_EQ(summary.all_cpu_seconds,
                   4e8 / (tide::planner::Footprint::kQ8CpuUpdateFactor * c.rates.cpu_update));
  unsetenv("TIDE_CALIBRATION_FILE");
  fs::remove(path);
}

TEST(SchedulerCapi, PlanExRefusesWhatItCannotRead) {
  const uint64_t sizes[] = {100'000'000};
  uint8_t device[1];
  uint32_t order[1];
  tide_plan_summary summary = tide_plan_summary_default();
  const tide_rates rates = tide::capi::rates_to_c(tide::planner::builtin_rates());
  auto refused = [&](const tide_plan_footprint& ex, const std::string& why) {
    EXPECT_EQ(tide_plan(sizes, 1, 0, &ex, &rates, device, order, &summary),
              TIDE_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(tide::capi::last_error_text()).find(why), std::string::npos)
        << tide::capi::last_error_text();
  };
  tide_plan_footprint ex = tide_plan_footprint_default();
  ex.struct_size = sizeof(tide_plan_footprint) + 8;  // built against a newer tide.h
  refused(ex, "struct_size");
  ex.struct_size = 4;  // does not even cover struct_size
  refused(ex, "struct_size");
  ex = tide_plan_footprint_default();
  ex.quantized_moments = 1;
  ex.bf16_master = 1;
  refused(ex, "bf16 master weights with 8-bit moments");
  ex = tide_plan_footprint_default();
  ex.quantized_moments = 1;  // with 12 state bytes
  refused(ex, "6");
  ex = tide_plan_footprint_default();
  ex.cpu_update_factor = 1000;
  refused(ex, "cpu_update_factor");
  ex.cpu_update_factor = -0.5;
  refused(ex, "cpu_update_factor");
  ex = tide_plan_footprint_default();
  ex.cpu_update_contended_factor = 0.001;
  refused(ex, "cpu_update_contended_factor must be 0 (not measured) or from 0.01 to 100");
}

TEST(SchedulerCapi, BadArgumentsAreInvalidArgumentWithAMessage) {
  tide_plan_summary summary = tide_plan_summary_default();
  const uint64_t sizes[] = {100, 0};
  uint8_t device[2];
  uint32_t order[2];
  EXPECT_EQ(tide_plan(nullptr, 2, 0, nullptr, nullptr, device, order, &summary),
            TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tide::capi::last_error_text()).find("null array"), std::string::npos);
  EXPECT_EQ(tide_plan(sizes, 2, 0, nullptr, nullptr, device, order, &summary),
            TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tide::capi::last_error_text()).find("subgroup 1"), std::string::npos);
  tide_rates bad{};
  EXPECT_EQ(tide_plan(sizes, 1, 0, nullptr, &bad, device, order, &summary),
            TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tide_rates_resolve("/nonexistent/calibration.json", &bad), TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tide::capi::last_error_text()).find("/nonexistent/calibration.json"),
            std::string::npos);
  EXPECT_EQ(tide_rates_resolve(nullptr, nullptr), TIDE_ERROR_INVALID_ARGUMENT);
}

}  // namespace

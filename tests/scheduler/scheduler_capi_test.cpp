// The scheduler's C ABI, as the Python layer will call it.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "capi/status.h"
#include "scheduler/planner.h"
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
  EXPECT_EQ(rates.cpu_update, tide::scheduler::builtin_rates().cpu_update);

  std::vector<uint8_t> device(sizes.size(), 9);
  std::vector<uint32_t> order(sizes.size(), 999);
  tide_plan_summary summary{};
  ASSERT_EQ(tide_plan(sizes.data(), sizes.size(), 48'000'000'000, &footprint, &rates, device.data(),
                      order.data(), &summary),
            TIDE_OK)
      << tide::capi::last_error_text();

  tide::scheduler::Workload w;
  w.subgroup_params.assign(sizes.begin(), sizes.end());
  w.headroom_bytes = 48'000'000'000;
  const auto p = tide::scheduler::plan(w, tide::scheduler::builtin_rates());
  EXPECT_EQ(summary.phase_seconds, p.predicted.phase_s);
  EXPECT_EQ(summary.all_cpu_seconds, p.predicted.all_cpu_s);
  EXPECT_EQ(summary.buffers, p.buffers);
  EXPECT_EQ(summary.gpu_bytes, p.gpu_bytes());
  EXPECT_EQ(summary.optimal, 1);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(device[i], p.subgroups[i].device == tide::scheduler::Device::gpu ? 1 : 0);
    EXPECT_EQ(order[i], p.subgroups[i].position);
  }
  // NULL footprint and rates: the defaults.
  tide_plan_summary defaults{};
  ASSERT_EQ(tide_plan(sizes.data(), sizes.size(), 48'000'000'000, nullptr, nullptr, device.data(),
                      order.data(), &defaults),
            TIDE_OK);
  EXPECT_EQ(defaults.phase_seconds, summary.phase_seconds);
  unsetenv("XDG_CACHE_HOME");
}

TEST(SchedulerCapi, BadArgumentsAreInvalidArgumentWithAMessage) {
  tide_plan_summary summary{};
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

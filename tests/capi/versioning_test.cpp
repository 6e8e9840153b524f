// tide.h's one versioning rule (the header's top): a caller built against an older tide.h (a
// smaller struct_size) is served, with the library's defaults for the fields it does not know on
// input and nothing written past its struct on output; a larger struct_size (a newer tide.h) is
// refused with a message naming the struct and both sizes.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "capi/status.h"
#include "tests/capi_step.h"
#include "tests/runtime/executor_fixture.h"
#include "tide/tide.h"

namespace tide::runtime::testing {
namespace {

constexpr std::uint64_t kCanary = 0x5a5a5a5a5a5a5a5aull;

// tide_optimizer_options as a caller built against the header before host_params saw it: the
// library's struct with the caller's bytes stopping there, and whatever lies after them.
struct OlderOptions {
  tide_optimizer_options options;
  std::uint64_t after;
};

TEST(AbiVersioning, AnOlderOptionsStructGetsTheDefaultsForTheFieldsItLacks) {
  const driver::CurrentContext context;
  driver::DeviceBuffer params(2 * 1000);
  const std::uint64_t sizes[] = {1000};
  const tide_param_slice whole{0, 0, 1000, params.get()};
  constexpr std::size_t kOlder = offsetof(tide_optimizer_options, host_params);

  // Its initializer writes nothing past the caller's struct.
  OlderOptions older;
  std::memset(&older, 0xa5, sizeof(older));
  older.options.struct_size = kOlder;
  ASSERT_EQ(tide_optimizer_options_init(&older.options), TIDE_OK) << tide::capi::last_error_text();
  EXPECT_EQ(older.options.struct_size, kOlder);
  EXPECT_EQ(older.options.grad_dtype, TIDE_BFLOAT16);
  EXPECT_EQ(older.options.refine, 1);
  std::int32_t untouched = 0;
  std::memset(&untouched, 0xa5, sizeof(untouched));
  EXPECT_EQ(older.options.host_params, untouched);  // beyond its size: not written

  // host_params is garbage here (0xa5a5a5a5): read, it would ask for host-resident fp32
  // parameters, which bf16 parameters are not. The library takes its default (0) instead.
  tide_optimizer* opt = nullptr;
  ASSERT_EQ(tide_optimizer_create(sizes, 1, &whole, 1, &older.options, nullptr, &opt), TIDE_OK)
      << tide::capi::last_error_text();
  tide_subgroup_buffers b;
  ASSERT_EQ(tide_optimizer_buffers(opt, 0, &b), TIDE_OK);
  EXPECT_NE(b.param, nullptr);  // an fp32 master: not host-resident
  EXPECT_NE(b.grad, nullptr);
  EXPECT_EQ(tide_optimizer_destroy(opt), TIDE_OK);

  // The same struct at its full size does read host_params, and refuses it.
  tide_optimizer_options full = tide_optimizer_options_default();
  full.host_params = 1;
  EXPECT_EQ(tide_optimizer_create(sizes, 1, &whole, 1, &full, nullptr, &opt),
            TIDE_ERROR_INVALID_ARGUMENT);
}

TEST(AbiVersioning, ANewerOrUninitializedStructIsRefusedNamingItAndBothSizes) {
  const driver::CurrentContext context;
  driver::DeviceBuffer params(2 * 1000);
  const std::uint64_t sizes[] = {1000};
  const tide_param_slice whole{0, 0, 1000, params.get()};
  tide_optimizer* opt = nullptr;
  tide_optimizer_options newer = tide_optimizer_options_default();
  newer.struct_size = sizeof(tide_optimizer_options) + 8;
  EXPECT_EQ(tide_optimizer_create(sizes, 1, &whole, 1, &newer, nullptr, &opt),
            TIDE_ERROR_INVALID_ARGUMENT);
  const std::string message = tide::capi::last_error_text();
  EXPECT_NE(message.find("tide_optimizer_options"), std::string::npos) << message;
  EXPECT_NE(message.find(std::to_string(sizeof(tide_optimizer_options) + 8)), std::string::npos)
      << message;
  EXPECT_NE(message.find(std::to_string(sizeof(tide_optimizer_options))), std::string::npos)
      << message;
  EXPECT_EQ(opt, nullptr);

  tide_optimizer_options zeros{};  // not initialized with its _default()
  EXPECT_EQ(tide_optimizer_create(sizes, 1, &whole, 1, &zeros, nullptr, &opt),
            TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tide::capi::last_error_text()).find("_default()"), std::string::npos);

  // An output struct from a newer header: refused, nothing written.
  tide_plan_summary summary = tide_plan_summary_default();
  summary.struct_size = sizeof(tide_plan_summary) + 16;
  summary.phase_seconds = -1;
  const std::uint64_t subgroup[] = {1000};
  std::uint8_t device = 9;
  std::uint32_t order = 9;
  EXPECT_EQ(tide_plan(subgroup, 1, 1 << 30, nullptr, nullptr, &device, &order, &summary),
            TIDE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tide::capi::last_error_text()).find("tide_plan_summary"),
            std::string::npos);
  EXPECT_EQ(summary.phase_seconds, -1);
}

// An output struct of an older header: filled up to its size, not a byte further.
struct OlderSummary {
  tide_plan_summary summary;
  std::uint64_t canary;
};

TEST(AbiVersioning, AnOlderOutputStructIsFilledUpToItsSizeOnly) {
  const std::uint64_t sizes[] = {1000, 2000};
  std::uint8_t device[2];
  std::uint32_t order[2];
  tide_plan_summary full = tide_plan_summary_default();
  ASSERT_EQ(tide_plan(sizes, 2, 1 << 30, nullptr, nullptr, device, order, &full), TIDE_OK)
      << tide::capi::last_error_text();

  OlderSummary older;
  std::memset(&older, 0xa5, sizeof(older));
  older.summary.struct_size = offsetof(tide_plan_summary, gpu_bytes);  // before gpu_bytes
  older.canary = kCanary;
  ASSERT_EQ(tide_plan(sizes, 2, 1 << 30, nullptr, nullptr, device, order, &older.summary), TIDE_OK)
      << tide::capi::last_error_text();
  EXPECT_EQ(older.summary.struct_size, offsetof(tide_plan_summary, gpu_bytes));
  EXPECT_EQ(older.summary.phase_seconds, full.phase_seconds);
  EXPECT_EQ(older.summary.buffer_bytes, full.buffer_bytes);
  std::uint64_t untouched = 0;
  std::memset(&untouched, 0xa5, sizeof(untouched));
  EXPECT_EQ(older.summary.gpu_bytes, untouched);
  EXPECT_EQ(older.canary, kCanary);

  // The same for a stats struct written by a CPU kernel call.
  struct {
    tide_cpu_info info;
    std::uint64_t canary;
  } info;
  std::memset(&info, 0xa5, sizeof(info));
  info.info.struct_size = offsetof(tide_cpu_info, threads);
  info.canary = kCanary;
  ASSERT_EQ(tide_cpu_kernels_info(&info.info), TIDE_OK) << tide::capi::last_error_text();
  EXPECT_GE(info.info.best_isa, TIDE_CPU_ISA_SCALAR);
  std::int32_t untouched_threads = 0;
  std::memset(&untouched_threads, 0xa5, sizeof(untouched_threads));
  EXPECT_EQ(info.info.threads, untouched_threads);
  EXPECT_EQ(info.canary, kCanary);
}

TEST(AbiVersioning, EveryExportedCallCountsOneCrossing) {
  const std::uint64_t before = tide_abi_calls();
  EXPECT_EQ(tide_abi_calls(), before);  // reading it is not a crossing
  tide_cpu_info info = tide_cpu_info_default();
  ASSERT_EQ(tide_cpu_kernels_info(&info), TIDE_OK);
  tide_plan_footprint footprint = tide_plan_footprint_default();  // tide_plan_footprint_init
  EXPECT_EQ(footprint.state_bytes_per_param, 12u);
  EXPECT_EQ(tide_abi_calls(), before + 2);
}

}  // namespace
}  // namespace tide::runtime::testing

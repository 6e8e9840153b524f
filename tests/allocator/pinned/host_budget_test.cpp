// The host memory budget, read from a made-up /proc and cgroup mount: cgroup v2 and v1, no limit,
// MemAvailable, and the refusal's message.
#include "allocator/pinned/host_budget.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace tide::allocator::pinned {
namespace {

namespace fs = std::filesystem;
constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

class HostBudgetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("tide_host_budget_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "proc" / "self");
  }
  void TearDown() override { fs::remove_all(root_); }

  void write(const fs::path& relative, const std::string& text) {
    fs::create_directories((root_ / relative).parent_path());
    std::ofstream(root_ / relative) << text;
  }
  HostBudget read() { return host_budget(root_ / "proc", root_ / "cgroup"); }

  fs::path root_;
};

TEST_F(HostBudgetTest, CgroupV2LimitLessItsUseAndMemAvailable) {
  write("proc/self/cgroup", "0::/job.slice/rank0\n");
  write("cgroup/job.slice/rank0/memory.max", "1073741824\n");
  write("cgroup/job.slice/rank0/memory.current", "536870912\n");
  write("proc/meminfo", "MemTotal:       32000000 kB\nMemAvailable:    4194304 kB\n");
  const HostBudget b = read();
  ASSERT_TRUE(b.cgroup_limit.has_value());
  EXPECT_EQ(*b.cgroup_limit, 1024 * kMiB);
  EXPECT_EQ(b.cgroup_usage, 512 * kMiB);
  EXPECT_EQ(b.mem_available, 4096 * kMiB);
  EXPECT_EQ(b.available(), 512 * kMiB);  // the cgroup's room, less than MemAvailable
  EXPECT_EQ(b.describe(), "the cgroup's limit 1.00 GiB with 512 MiB in use; MemAvailable 4.00 GiB");
}

TEST_F(HostBudgetTest, CgroupV2WithoutALimitLeavesMemAvailable) {
  write("proc/self/cgroup", "0::/\n");
  write("cgroup/memory.max", "max\n");
  write("cgroup/memory.current", "123\n");
  write("proc/meminfo", "MemAvailable:    2048 kB\n");
  const HostBudget b = read();
  EXPECT_FALSE(b.cgroup_limit.has_value());
  EXPECT_EQ(b.available(), 2 * kMiB);
}

TEST_F(HostBudgetTest, CgroupV1MemoryController) {
  write("proc/self/cgroup", "5:cpu,cpuacct:/x\n4:memory:/job\n1:name=systemd:/job\n");
  write("cgroup/memory/job/memory.limit_in_bytes", "2147483648\n");
  write("cgroup/memory/job/memory.usage_in_bytes", "1073741824\n");
  const HostBudget b = read();
  ASSERT_TRUE(b.cgroup_limit.has_value());
  EXPECT_EQ(b.available(), 1024 * kMiB);  // no meminfo: the cgroup alone
}

TEST_F(HostBudgetTest, CgroupV1UnlimitedIsNoLimit) {
  write("proc/self/cgroup", "4:memory:/\n");
  write("cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  write("cgroup/memory/memory.usage_in_bytes", "1\n");
  EXPECT_FALSE(read().cgroup_limit.has_value());
}

TEST_F(HostBudgetTest, NothingKnownLimitsNothing) {
  const HostBudget b = read();
  EXPECT_FALSE(b.available().has_value());
  EXPECT_NO_THROW(check_host_budget(std::uint64_t{1} << 50, "state", b));
  EXPECT_EQ(b.describe(), "no limit known");
}

TEST_F(HostBudgetTest, AUseAboveTheLimitLeavesNothing) {
  write("proc/self/cgroup", "0::/\n");
  write("cgroup/memory.max", "1000\n");
  write("cgroup/memory.current", "5000\n");
  EXPECT_EQ(read().available(), 0u);
}

TEST_F(HostBudgetTest, StateBeyondTheBudgetIsRefusedWithWhatIsNeededAndWhatThereIs) {
  write("proc/self/cgroup", "0::/\n");
  write("cgroup/memory.max", "1073741824\n");
  write("cgroup/memory.current", "805306368\n");
  const HostBudget b = read();
  EXPECT_NO_THROW(check_host_budget(256 * kMiB, "the optimizer state", b));
  try {
    check_host_budget(256 * kMiB + 1, "the optimizer state", b);
    FAIL() << "not refused";
  } catch (const HostMemoryError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the optimizer state needs 256.000001 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("can take 256.000000 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("the cgroup's limit 1.00 GiB with 768 MiB in use"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace tide::allocator::pinned

// TIDE_CPU_THREADS sizes the CPU kernels' pool; a bad value is an error that names the knob.
// One test, in its own process: the pool is created once.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "config/env.h"
#include "kernels/thread_pool.h"

namespace tide::kernels {
namespace {

TEST(CpuThreadsKnobTest, SizesThePoolAndRejectsBadValues) {
  for (const char* bad : {"0", "two", "-1", "100000"}) {
    ::setenv("TIDE_CPU_THREADS", bad, 1);
    try {
      cpu_pool();
      FAIL() << "TIDE_CPU_THREADS=" << bad << " was accepted";
    } catch (const config::EnvError& e) {
      EXPECT_NE(std::string(e.what()).find("TIDE_CPU_THREADS"), std::string::npos) << e.what();
    }
  }
  ::setenv("TIDE_CPU_THREADS", "3", 1);
  EXPECT_EQ(cpu_pool().size(), 3u);
}

}  // namespace
}  // namespace tide::kernels

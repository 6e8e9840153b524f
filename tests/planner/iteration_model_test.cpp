#include "planner/iteration_model.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

namespace tide::planner {
namespace {

// Three layers, 1 s of backward each, 2 bytes of gradient each at 1 byte/s (2 s per copy).
std::vector<LayerTimes> three_layers() { return {{0.5, 1, 2}, {0.5, 1, 2}, {0.5, 1, 2}}; }

TEST(IterationModel, ForwardIsTheSumOfItsLayers) {
  EXPECT_DOUBLE_EQ(predict_forward(three_layers()), 1.5);
  EXPECT_DOUBLE_EQ(predict_forward({}), 0);
}

TEST(IterationModel, OffloadedCopiesOverlapTheBackwardOfLaterLayers) {
  // Copies start at 1, 3, 5 (each waits for the one before it), the last ends at 7.
  EXPECT_DOUBLE_EQ(predict_backward(three_layers(), 1, false), 7);
  // Fast copies hide behind the compute but the last layer's: 3 + 2/4.
  EXPECT_DOUBLE_EQ(predict_backward(three_layers(), 4, false), 3.5);
  // Blocking: compute, then every copy.
  EXPECT_DOUBLE_EQ(predict_backward(three_layers(), 1, true), 9);
  EXPECT_DOUBLE_EQ(predict_backward(three_layers(), 4, true), 4.5);
}

TEST(IterationModel, BackwardOrderMatters) {
  // The last layer in forward order runs first in backward: its large gradient copies early.
  const std::vector<LayerTimes> big_last = {{0, 1, 1}, {0, 1, 1}, {0, 1, 4}};
  const std::vector<LayerTimes> big_first = {{0, 1, 4}, {0, 1, 1}, {0, 1, 1}};
  EXPECT_DOUBLE_EQ(predict_backward(big_last, 1, false), 7);   // 1+4=5, 6, 7
  EXPECT_DOUBLE_EQ(predict_backward(big_first, 1, false), 7);  // 2, 3, 3+4=7
  EXPECT_DOUBLE_EQ(predict_backward(big_last, 2, false), 4);   // 3, 3.5, 4
  EXPECT_DOUBLE_EQ(predict_backward(big_first, 2, false), 5);  // 1.5, 2.5, 3+2=5
}

TEST(IterationModel, RejectsARateThatIsNotPositive) {
  EXPECT_THROW(predict_backward(three_layers(), 0, false), std::invalid_argument);
}

TEST(IterationModel, HostGradientBytesLeaveOutTheGradientsKeptOnTheGpu) {
  // Subgroups of 4, 4 and 2 parameters in 3 layers of 3 (the last takes the rest: 4).
  const std::vector<std::uint64_t> sizes = {4, 4, 2};
  EXPECT_EQ(host_gradient_bytes(sizes, 3, 2), (std::vector<std::uint64_t>{6, 6, 8}));
  // Subgroup 1 (parameters 4..7) kept: layer 1 (3..5) keeps 4 and 5, layer 2 (6..9) 6 and 7.
  const std::vector<std::size_t> kept = {1};
  EXPECT_EQ(host_gradient_bytes(sizes, 3, 2, kept), (std::vector<std::uint64_t>{6, 2, 4}));
  const std::vector<std::size_t> all = {0, 1, 2};
  EXPECT_EQ(host_gradient_bytes(sizes, 3, 2, all), (std::vector<std::uint64_t>{0, 0, 0}));
  EXPECT_EQ(host_gradient_bytes(sizes, 1, 4), (std::vector<std::uint64_t>{40}));
  EXPECT_EQ(host_gradient_bytes(sizes, 10, 1), std::vector<std::uint64_t>(10, 1));
  EXPECT_THROW(host_gradient_bytes(sizes, 0, 2), std::invalid_argument);
  EXPECT_THROW(host_gradient_bytes(sizes, 11, 2), std::invalid_argument);
  const std::vector<std::size_t> bad = {3};
  EXPECT_THROW(host_gradient_bytes(sizes, 3, 2, bad), std::invalid_argument);
}

}  // namespace
}  // namespace tide::planner

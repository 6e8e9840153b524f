#include "scheduler/iteration_model.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

namespace tide::scheduler {
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

}  // namespace
}  // namespace tide::scheduler

// The kernels' C ABI types (include/tide/tide.h, "optimizer kernels") as the kernels' own: for
// capi/kernels.cpp and every other C ABI function that takes them (capi/optimizer.cpp).
#pragma once

#include <cstdint>
#include <string_view>

#include "kernels/adam_math.h"
#include "kernels/dtype.h"
#include "tide/tide.h"

namespace tide::capi {

// A tide_dtype; throws std::invalid_argument "<what> is not a tide_dtype (...)" for another value.
kernels::Dtype dtype_from_c(std::int32_t dtype, std::string_view what);

kernels::AdamHyper hyper_from_c(const tide_adam_hyper& hyper);

}  // namespace tide::capi

// cuGetErrorName / cuGetErrorString: the real names, and texts as the real driver words them.
#pragma once

#include <cuda.h>

namespace tide::standin {

CUresult error_name(CUresult error, const char** out);
CUresult error_string(CUresult error, const char** out);

}  // namespace tide::standin

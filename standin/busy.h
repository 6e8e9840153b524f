// Timed stream work (tide_standin_busy: standin.h): an operation that occupies a stream for a given
// time without using a CPU, standing for a GPU kernel of that duration (a forward or backward
// layer in a benchmark of whole iterations).
#pragma once

#include <cuda.h>

namespace tide::standin {

// Enqueues on `handle` (null: the legacy default stream) a sleep of `seconds` from when it
// starts, recorded and held as a kernel named `name` (null: "busy"). CUDA_ERROR_INVALID_VALUE for
// a duration that is not finite and ≥ 0 or above an hour; the stream errors of resolve_stream.
CUresult enqueue_busy(CUstream handle, double seconds, const char* name);

}  // namespace tide::standin

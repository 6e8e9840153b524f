// Holds on stream work by kind (tide_standin_hold, tide_standin_release: standin.h): a held
// copy or kernel waits on its stream's worker, before it starts, until it is let through, so that
// a test can keep work in flight for as long as it needs to observe what runs meanwhile, on a
// machine of any speed.
#pragma once

#include <cstdint>

namespace tide::standin {

// `kinds`: TIDE_STANDIN_OP_* bits. CUDA_ERROR_INVALID_VALUE for none or an unknown bit.
int hold(unsigned kinds);
// `count` more operations of each kind start, or all from now on (TIDE_STANDIN_RELEASE_ALL:
// the hold ends).
int release(unsigned kinds, std::uint64_t count);

// On a stream's worker, before work of `kind` (one TIDE_STANDIN_OP_* bit) starts: returns once
// it may start (at once when its kind is not held).
void pass_hold(unsigned kind);

}  // namespace tide::standin

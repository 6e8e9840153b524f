// What would be an asynchronous fault on a GPU: a kernel's illegal or misaligned access, work that
// reaches memory unmapped or unpinned while it was pending. CUDA reports those later, as a sticky
// error (CUDA_ERROR_ILLEGAL_ADDRESS and the like) from every following call; the stand-in stops
// the process at once, naming what happened, so that the test that caused it fails where it did.
#pragma once

#include <string_view>

namespace tide::standin {

[[noreturn]] void device_fault(std::string_view what);

}  // namespace tide::standin

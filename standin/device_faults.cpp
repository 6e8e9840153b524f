#include "standin/device_faults.h"

#include <cstdio>
#include <cstdlib>

namespace tide::standin {

void device_fault(std::string_view what) {
  std::fprintf(stderr, "tide stand-in driver: device fault: %.*s\n", static_cast<int>(what.size()),
               what.data());
  std::fflush(stderr);
  std::abort();
}

}  // namespace tide::standin

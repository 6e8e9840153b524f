// The C ABI's general part: version, errors, driver. Each component implements the tide_*
// functions of its own area next to its code (e.g. capi/kernels.cpp).
#include "tide/tide.h"

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "capi/optimizer.h"
#include "capi/status.h"
#include "capi/versioned.h"
#include "config/env.h"
#include "config/knobs.h"
#include "driver/context.h"
#include "driver/cuda_api.h"
#include "runtime/executor.h"

namespace {

using tide::capi::require;

}  // namespace

extern "C" {

TIDE_API const char* tide_version(void) {
  tide::capi::count_call();
  return TIDE_VERSION_STRING;
}

TIDE_API const char* tide_last_error(void) {
  tide::capi::count_call();
  return tide::capi::last_error_text();
}

TIDE_API tide_status tide_knob(const char* name, const char* value, tide_knob_value* out) {
  return tide::capi::guard([&] {
    require(name != nullptr && out != nullptr, "tide_knob: null argument");
    tide::capi::check_struct_size<tide_knob_value>(out->struct_size, "tide_knob_value");
    const std::string_view knob = name;
    const tide::config::Knob* registered = tide::config::find_knob(knob);
    tide_knob_value result = tide_knob_value_default();
    result.accepts = registered != nullptr ? registered->accepts.data() : "";
    // What a parse that fails still says: what the knob accepts.
    tide::capi::write_versioned(out, result, "tide_knob_value");
    std::optional<std::string_view> given;
    if (value != nullptr) given = std::string_view(value);
    if (knob == "TIDE_PLACEMENT") {
      std::optional<std::string> text;
      if (given) {
        if (!given->empty()) text = std::string(*given);
      } else {
        text = tide::config::env_text("TIDE_PLACEMENT");
      }
      if (text) {
        result.set = 1;
        tide::runtime::Policy policy;
        try {
          policy = tide::runtime::parse_policy(*text);
        } catch (const std::invalid_argument&) {
          throw tide::config::EnvError("TIDE_PLACEMENT", *text, registered->accepts);
        }
        result.choice = tide::capi::placement_to_c(policy).kind;
        result.integer = tide::capi::placement_to_c(policy).k;
      }
    } else {
      const tide::config::KnobValue v = tide::config::read_knob(knob, given);
      result.set = v.set ? 1 : 0;
      result.choice = static_cast<int32_t>(v.choice);
      result.integer = v.integer;
    }
    tide::capi::write_versioned(out, result, "tide_knob_value");
  });
}

TIDE_API tide_status tide_driver_info(int* device_count, int* driver_version) {
  return tide::capi::guard([&] {
    require(device_count != nullptr && driver_version != nullptr,
            "tide_driver_info: null output pointer");
    const auto& api = tide::driver::cuda();
    *device_count = tide::driver::device_count();
    *driver_version = api.version;
  });
}

TIDE_API tide_status tide_device_memory(int device, size_t* free_bytes, size_t* total_bytes) {
  return tide::capi::guard([&] {
    require(free_bytes != nullptr && total_bytes != nullptr,
            "tide_device_memory: null output pointer");
    require(device >= 0 && device < tide::driver::device_count(),
            "tide_device_memory: no such device");
    const tide::driver::PrimaryContext context(device);
    const tide::driver::ContextScope scope(context);
    const auto info = tide::driver::memory_info();
    *free_bytes = info.free_bytes;
    *total_bytes = info.total_bytes;
  });
}

}  // extern "C"

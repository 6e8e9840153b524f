// tide.h's one versioning rule for options, stats and reports ("Versioned structs" at the top of
// include/tide/tide.h), implemented once: every such struct starts with `size_t struct_size`, the
// size the caller's header gave it. A caller's smaller struct (an older header) is served: on
// input the fields beyond its size keep their defaults, on output they are not written. A larger
// one (a newer header) is refused, as is a size too small to hold struct_size itself.
#pragma once

#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace tide::capi {

// Throws std::invalid_argument (TIDE_ERROR_INVALID_ARGUMENT) naming `name` and both sizes unless
// `given` is a struct_size this library serves for T.
template <typename T>
void check_struct_size(std::size_t given, std::string_view name) {
  static_assert(std::is_trivially_copyable_v<T> && offsetof(T, struct_size) == 0);
  if (given >= sizeof(std::size_t) && given <= sizeof(T)) return;
  throw std::invalid_argument(
      std::string(name) + ": struct_size is " + std::to_string(given) + ", this library's " +
      std::string(name) + " has " + std::to_string(sizeof(T)) +
      (given > sizeof(T) ? " (the caller's tide.h is newer than the library)"
                         : " (initialize it with its _default())"));
}

// What the caller gave: `defaults` with the caller's first struct_size bytes over them.
template <typename T>
T read_versioned(const T& given, T defaults, std::string_view name) {
  check_struct_size<T>(given.struct_size, name);
  std::memcpy(static_cast<void*>(&defaults), &given, given.struct_size);
  defaults.struct_size = sizeof(T);
  return defaults;
}

// Writes `value` into the caller's struct: its first struct_size bytes, the size kept.
template <typename T>
void write_versioned(T* out, T value, std::string_view name) {
  check_struct_size<T>(out->struct_size, name);
  value.struct_size = out->struct_size;
  std::memcpy(static_cast<void*>(out), &value, out->struct_size);
}

}  // namespace tide::capi

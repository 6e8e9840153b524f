// The `tide` command.
//
//   tide info        the CUDA driver tide loads, its devices and their memory
//   tide env         every TIDE_* variable: what it accepts, what it does, its current value
//   tide version
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "config/env.h"
#include "config/knobs.h"
#include "driver/context.h"
#include "driver/cuda_api.h"

namespace {

int usage(std::FILE* out) {
  std::fputs(
      "usage: tide COMMAND\n"
      "\n"
      "commands:\n"
      "  info      the CUDA driver tide loads, its devices and their memory\n"
      "  env       every TIDE_* environment variable: what it accepts and does, and its value\n"
      "  version   tide's version\n",
      out);
  return out == stdout ? 0 : 2;
}

int info() {
  const auto& api = tide::driver::cuda();
  std::printf("driver   %s (CUDA %d.%d)\n", api.library.c_str(), api.version / 1000,
              (api.version % 1000) / 10);
  const int count = tide::driver::device_count();
  std::printf("devices  %d\n", count);
  for (int device = 0; device < count; ++device) {
    const tide::driver::PrimaryContext context(device);
    const auto memory = tide::driver::memory_info();
    std::printf("  %d: %s, %.2f GiB total, %.2f GiB free, virtual memory %s\n", device,
                tide::driver::device_name(device).c_str(),
                static_cast<double>(memory.total_bytes) / (1 << 30),
                static_cast<double>(memory.free_bytes) / (1 << 30),
                api.has_vmm() ? "yes" : "no");
  }
  return 0;
}

int env() {
  for (const auto& knob : tide::config::knobs()) {
    const std::string name(knob.name);
    const auto value = tide::config::env_text(name.c_str());
    std::printf("%s=%s\n    accepts: %.*s\n    %.*s\n", name.c_str(),
                value ? value->c_str() : "(unset)", static_cast<int>(knob.accepts.size()),
                knob.accepts.data(), static_cast<int>(knob.description.size()),
                knob.description.data());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage(stderr);
  const std::string_view command = argv[1];
  try {
    if (command == "info") return info();
    if (command == "env") return env();
    if (command == "version") {
      std::puts(TIDE_VERSION_STRING);
      return 0;
    }
    if (command == "help" || command == "--help" || command == "-h") return usage(stdout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tide %s: %s\n", argv[1], e.what());
    return 1;
  }
  std::fprintf(stderr, "tide: unknown command '%s'\n\n", argv[1]);
  return usage(stderr);
}

// The `tide` command: dispatches to the subcommands of tools/*_command.cpp.
#include <cstdio>
#include <exception>
#include <string_view>

#include "tools/command.h"

namespace {

using tide::tools::Command;

int version_command(int /*argc*/, char** /*argv*/) {
  std::puts(TIDE_VERSION_STRING);
  return 0;
}

constexpr Command kCommands[] = {
    {"info", "the CUDA driver tide loads, its devices and their memory",
     &tide::tools::info_command},
    {"env", "every TIDE_* environment variable: what it accepts and does, and its value",
     &tide::tools::env_command},
    {"plan", "the scheduler's plan for a described workload and machine",
     &tide::tools::plan_command},
    {"calibrate", "measure this machine's rates and write the calibration file",
     &tide::tools::calibrate_command},
    {"run", "run a program under tide's interposer: memory telemetry, limit, report",
     &tide::tools::run_command},
    {"replay", "run an allocation-event trace through tide's device caching allocator",
     &tide::tools::replay_command},
    {"version", "tide's version", &version_command},
};

int usage(std::FILE* out) {
  std::fputs("usage: tide COMMAND [ARGS...]\n\ncommands:\n", out);
  for (const Command& command : kCommands) {
    std::fprintf(out, "  %-10s %s\n", command.name, command.summary);
  }
  return out == stdout ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage(stderr);
  const std::string_view name = argv[1];
  if (name == "help" || name == "--help" || name == "-h") return usage(stdout);
  for (const Command& command : kCommands) {
    if (name != command.name) continue;
    try {
      return command.run(argc - 1, argv + 1);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tide %s: %s\n", command.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "tide: unknown command '%s'\n\n", argv[1]);
  return usage(stderr);
}

// A subcommand of the `tide` command. Each lives in its own file (tools/<name>_command.cpp) and is
// listed in tools/main.cpp.
#pragma once

namespace tide::tools {

struct Command {
  const char* name;
  const char* summary;
  // argv[0] is the subcommand's name. Returns the process exit status; may throw (main prints
  // the message and exits 1).
  int (*run)(int argc, char** argv);
};

int info_command(int argc, char** argv);
int env_command(int argc, char** argv);
int replay_command(int argc, char** argv);
int run_command(int argc, char** argv);
int plan_command(int argc, char** argv);
int calibrate_command(int argc, char** argv);

}  // namespace tide::tools

// Runs tide_membw (bench/membw.cpp, built next to the benchmarks) for the host's memory-bandwidth
// bound a benchmark compares itself with.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace tide::bench {

// tide_membw with `arguments` (e.g. "--threads 8"): its output in `line`, and its "gbps" (the best
// kernel's GB/s), or 0 if it cannot be run.
inline double run_membw(const std::string& arguments, std::string& line) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return 0;
  self[n] = '\0';
  std::string dir(self);
  dir = dir.substr(0, dir.rfind('/'));
  const std::string command = dir + "/tide_membw " + arguments;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return 0;
  char buffer[8192];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) line += buffer;
  pclose(pipe);
  const auto at = line.find("\"gbps\":");
  return at == std::string::npos ? 0 : std::atof(line.c_str() + at + 7);
}

}  // namespace tide::bench

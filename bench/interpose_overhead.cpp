// bench_interpose: what the interposer adds to each intercepted allocation call.
//
// The same allocate+free loop runs against the test stand-in driver (tests/interpose, no GPU)
// twice in one process under LD_PRELOAD=libtide_preload.so: through the functions the driver
// exports (direct) and through the hooks cuGetProcAddress returns (hooked, the CUDA runtime's
// and so PyTorch's path). The difference, per call, is the interposer's cost: recursion guard,
// current device, limit check, live-allocation table, telemetry, and with TIDE_STACKS a
// libunwind backtrace per allocation. Prints one JSON line per case:
//   {"bench":"interpose_overhead","stacks":false,"ns_added":...,...}
// Without arguments it runs itself as a child for each case, with the environment set.
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
using MemAlloc = CUresult (*)(CUdeviceptr*, size_t);
using MemFree = CUresult (*)(CUdeviceptr);

constexpr int kCalls = 20000;  // allocate+free pairs per repetition
constexpr int kRepetitions = 15;

double pair_ns(MemAlloc alloc, MemFree release, int pairs) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < pairs; ++i) {
    CUdeviceptr ptr = 0;
    if (alloc(&ptr, 4096) != CUDA_SUCCESS || release(ptr) != CUDA_SUCCESS) std::abort();
  }
  const std::chrono::duration<double, std::nano> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / pairs;
}

// Allocation and free timed separately: pairs of allocations, the frees in a second loop.
void split_ns(MemAlloc alloc, MemFree release, double& alloc_ns, double& free_ns) {
  static std::vector<CUdeviceptr> ptrs(kCalls);
  auto t0 = std::chrono::steady_clock::now();
  for (auto& ptr : ptrs) {
    if (alloc(&ptr, 4096) != CUDA_SUCCESS) std::abort();
  }
  auto t1 = std::chrono::steady_clock::now();
  for (auto ptr : ptrs) {
    if (release(ptr) != CUDA_SUCCESS) std::abort();
  }
  auto t2 = std::chrono::steady_clock::now();
  alloc_ns = std::chrono::duration<double, std::nano>(t1 - t0).count() / kCalls;
  free_ns = std::chrono::duration<double, std::nano>(t2 - t1).count() / kCalls;
}

// The least-disturbed repetition: on a shared machine, noise only ever adds time.
double least(const std::vector<double>& values) {
  return *std::min_element(values.begin(), values.end());
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

std::string machine() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      std::string name = line.substr(line.find(':') + 2);
      std::replace(name.begin(), name.end(), '"', '\'');
      return name;
    }
  }
  return "unknown";
}

int child(bool stacks) {
  // RTLD_GLOBAL, as for a program linked against libcuda: the PLT path's exports answer then.
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (driver == nullptr) {
    std::fprintf(stderr, "bench_interpose: %s\n", dlerror());
    return 1;
  }
  auto function = reinterpret_cast<void* (*)(const char*)>(dlsym(driver, "fakecuda_function"));
  auto get_proc = reinterpret_cast<GetProc>(dlsym(driver, "cuGetProcAddress_v2"));
  if (function == nullptr || get_proc == nullptr ||
      dlsym(RTLD_DEFAULT, "tide_interpose_read_stats") == nullptr) {
    std::fprintf(stderr, "bench_interpose: needs the test stand-in driver and the preload\n");
    return 1;
  }
  auto direct_alloc = reinterpret_cast<MemAlloc>(function("cuMemAlloc_v2"));
  auto direct_free = reinterpret_cast<MemFree>(function("cuMemFree_v2"));
  void* hooked_alloc = nullptr;
  void* hooked_free = nullptr;
  CUdriverProcAddressQueryResult status{};
  get_proc("cuMemAlloc", &hooked_alloc, 12000, 0, &status);
  get_proc("cuMemFree", &hooked_free, 12000, 0, &status);
  // The preload's exported cuMemAlloc_v2, as a program linked against libcuda calls it.
  auto plt_alloc = reinterpret_cast<MemAlloc>(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
  auto plt_free = reinterpret_cast<MemFree>(dlsym(RTLD_DEFAULT, "cuMemFree_v2"));

  auto h_alloc = reinterpret_cast<MemAlloc>(hooked_alloc);
  auto h_free = reinterpret_cast<MemFree>(hooked_free);
  pair_ns(direct_alloc, direct_free, kCalls / 10);  // warm-up: tables grown, code paged in
  pair_ns(h_alloc, h_free, kCalls / 10);
  pair_ns(plt_alloc, plt_free, kCalls / 10);

  std::vector<double> direct;
  std::vector<double> hooked;
  std::vector<double> plt;
  std::vector<double> direct_alloc_ns;
  std::vector<double> direct_free_ns;
  std::vector<double> hooked_alloc_ns;
  std::vector<double> hooked_free_ns;
  const int pairs = stacks ? kCalls / 10 : kCalls;
  for (int r = 0; r < kRepetitions; ++r) {  // interleaved, so drift hits both alike
    direct.push_back(pair_ns(direct_alloc, direct_free, pairs));
    hooked.push_back(pair_ns(h_alloc, h_free, pairs));
    plt.push_back(pair_ns(plt_alloc, plt_free, pairs));
    double da = 0;
    double df = 0;
    double ha = 0;
    double hf = 0;
    split_ns(direct_alloc, direct_free, da, df);
    split_ns(h_alloc, h_free, ha, hf);
    direct_alloc_ns.push_back(da);
    direct_free_ns.push_back(df);
    hooked_alloc_ns.push_back(ha);
    hooked_free_ns.push_back(hf);
  }
  const double direct_ns = least(direct) / 2;
  const double hooked_ns = least(hooked) / 2;
  const double plt_ns = least(plt) / 2;
  std::printf(
      "{\"bench\":\"interpose_overhead\",\"stacks\":%s,\"ns_added\":%.1f,"
      "\"ns_added_median\":%.1f,\"alloc_ns_added\":%.1f,\"free_ns_added\":%.1f,"
      "\"direct_ns_per_call\":%.1f,\"hooked_ns_per_call\":%.1f,\"plt_ns_added\":%.1f,"
      "\"path\":\"cuGetProcAddress\",\"driver\":\"test stand-in "
      "(tests/interpose/fake_libcuda.c)\",\"calls\":%d,\"repetitions\":%d,"
      "\"statistic\":\"least of the repetitions\",\"machine\":\"%s\",\"cpus\":%ld}\n",
      stacks ? "true" : "false", hooked_ns - direct_ns, (median(hooked) - median(direct)) / 2,
      least(hooked_alloc_ns) - least(direct_alloc_ns),
      least(hooked_free_ns) - least(direct_free_ns), direct_ns, hooked_ns, plt_ns - direct_ns,
      2 * pairs, kRepetitions, machine().c_str(), sysconf(_SC_NPROCESSORS_ONLN));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--child") == 0) {
    return child(std::strcmp(argv[2], "stacks") == 0);
  }
  std::fflush(stdout);
  for (const bool stacks : {false, true}) {
    const pid_t pid = fork();
    if (pid == 0) {
      setenv("LD_PRELOAD", TIDE_BENCH_PRELOAD, 1);
      setenv("LD_LIBRARY_PATH", TIDE_BENCH_FAKECUDA_DIR, 1);
      setenv("TIDE_STACKS", stacks ? "1" : "0", 1);
      unsetenv("TIDE_MEMORY_LIMIT");
      unsetenv("TIDE_REPORT");
      unsetenv("TIDE_STACK_SAMPLE");
      const char* mode = stacks ? "stacks" : "plain";
      execl("/proc/self/exe", argv[0], "--child", mode, static_cast<char*>(nullptr));
      std::perror("bench_interpose: exec");
      _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
      return 1;
    }
  }
  return 0;
}

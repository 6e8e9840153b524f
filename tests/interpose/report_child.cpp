// A small "trainer" for the report tests, run under the preload: it finds the stand-in driver as
// the CUDA runtime does, marks the three phases and allocates in each from functions with
// recognisable names (exported, so the report's call stacks can name them).
//
//   report_child alloc    allocate, exit normally (the report is written at exit)
//   report_child signal   allocate, then die of SIGTERM (the report is written on the signal)
//   report_child loop     six training-like iterations without any phase mark (the telemetry
//                         must find iterations and phases from the curve)
#include <cuda.h>
#include <dlfcn.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>

#define EXPORTED extern "C" __attribute__((noinline, visibility("default")))

namespace {

using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
using MemAlloc = CUresult (*)(CUdeviceptr*, size_t);
using MemFree = CUresult (*)(CUdeviceptr);
using MarkPhase = int (*)(const char*);

MemAlloc g_alloc = nullptr;
MemFree g_free = nullptr;
constexpr size_t kMiB = 1 << 20;

void* lookup(GetProc get_proc, const char* symbol) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  if (get_proc(symbol, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS) {
    return nullptr;
  }
  return fn;
}

void mark(const char* phase) {
  auto mark_phase = reinterpret_cast<MarkPhase>(dlsym(RTLD_DEFAULT, "tide_interpose_mark_phase"));
  if (mark_phase != nullptr) mark_phase(phase);
}

CUdeviceptr allocate(size_t bytes) {
  CUdeviceptr ptr = 0;
  return g_alloc(&ptr, bytes) == CUDA_SUCCESS ? ptr : 0;
}

void release(CUdeviceptr ptr) {
  if (ptr != 0) g_free(ptr);
}

}  // namespace

// forward: three activations of 4 MiB (peak 12 MiB).
EXPORTED void report_child_forward(CUdeviceptr* activations) {
  for (int i = 0; i < 3; ++i) activations[i] = allocate(4 * kMiB);
}

// backward: an 8 MiB gradient buffer on top (peak 20 MiB), then most is released.
EXPORTED CUdeviceptr report_child_backward(CUdeviceptr* activations) {
  const CUdeviceptr gradients = allocate(8 * kMiB);
  release(activations[1]);
  release(activations[2]);
  release(gradients);
  return gradients;
}

// update: 1 MiB of optimizer scratch on what is left (peak 5 MiB), kept until exit.
EXPORTED CUdeviceptr report_child_update() { return allocate(kMiB); }

// One unmarked iteration: activations climb (forward), fall (backward), a little update.
void unmarked_iteration() {
  const timespec step{0, 5000000};  // 5 ms between events: a curve with a time axis
  CUdeviceptr activations[8] = {};
  for (auto& a : activations) {
    a = allocate(4 * kMiB);
    nanosleep(&step, nullptr);
  }
  for (int i = 7; i >= 0; --i) {
    release(activations[i]);
    nanosleep(&step, nullptr);
  }
  for (int i = 0; i < 3; ++i) {
    const CUdeviceptr scratch = allocate(kMiB);
    nanosleep(&step, nullptr);
    release(scratch);
    nanosleep(&step, nullptr);
  }
}

int main(int argc, char** argv) {
  const bool known =
      argc == 2 && (std::strcmp(argv[1], "alloc") == 0 || std::strcmp(argv[1], "signal") == 0 ||
                    std::strcmp(argv[1], "loop") == 0);
  if (!known) {
    std::fprintf(stderr, "usage: report_child alloc|signal|loop\n");
    return 2;
  }
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) {
    std::fprintf(stderr, "report_child: %s\n", dlerror());
    return 3;
  }
  auto get_proc = reinterpret_cast<GetProc>(dlsym(driver, "cuGetProcAddress_v2"));
  g_alloc = reinterpret_cast<MemAlloc>(lookup(get_proc, "cuMemAlloc"));
  g_free = reinterpret_cast<MemFree>(lookup(get_proc, "cuMemFree"));
  if (g_alloc == nullptr || g_free == nullptr) return 4;

  if (std::strcmp(argv[1], "loop") == 0) {
    for (int i = 0; i < 6; ++i) unmarked_iteration();
    return 0;
  }
  CUdeviceptr activations[3] = {};
  mark("forward");
  report_child_forward(activations);
  mark("backward");
  report_child_backward(activations);
  mark("update");
  report_child_update();
  if (std::strcmp(argv[1], "signal") == 0) {
    std::raise(SIGTERM);
    return 5;  // not reached: the preload reports, then the process dies of SIGTERM
  }
  return 0;
}

#include "config/knobs.h"

#include <sys/stat.h>

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "config/env.h"
#include "config/placement.h"

namespace tide::config {
namespace {

constexpr std::int64_t kIntMax = std::numeric_limits<std::int64_t>::max();
constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr std::uint64_t kTiB = std::uint64_t{1} << 40;

// The checks of the registry: each throws EnvError as the variable's reader would.

template <std::int64_t Min, std::int64_t Max>
void integer(std::string_view name, std::string_view value) {
  parse_int(name, value, Min, Max);
}

void params_per_s(std::string_view name, std::string_view value) {
  parse_double(name, value, 1e3, 1e15);
}

void gbps(std::string_view name, std::string_view value) { parse_double(name, value, 0.001, 1e5); }

void margin(std::string_view name, std::string_view value) { parse_double(name, value, 0, 0.5); }

// The names kernels/cpu_isa.cpp reads; whether this CPU runs the one named is the kernels' check.
void cpu_isa(std::string_view name, std::string_view value) {
  parse_choice(name, value, {"auto", "avx512bf16", "avx512", "avx2", "scalar"});
}

void boolean(std::string_view name, std::string_view value) { parse_bool(name, value); }
void size(std::string_view name, std::string_view value) { parse_bytes(name, value); }

void positive(std::string_view name, std::string_view value) {
  if (parse_double(name, value, 0, std::numeric_limits<double>::max()) <= 0) {
    throw EnvError(name, value, "a number greater than 0");
  }
}

void fraction(std::string_view name, std::string_view value) {
  if (parse_double(name, value, 0, 1) <= 0) {
    throw EnvError(name, value, "a number greater than 0 and at most 1");
  }
}

void pinned_chunk(std::string_view name, std::string_view value) {
  parse_bytes(name, value, 4 * kMiB, kTiB, kPinnedChunkAccepts);
}

void pinned_direct(std::string_view name, std::string_view value) {
  parse_bytes(name, value, 16 * 1024, kTiB, kPinnedDirectAccepts);
}

void limit(std::string_view name, std::string_view value) {
  parse_bytes(name, value, 1, std::numeric_limits<std::uint64_t>::max(), kLimitAccepts);
}

// A path with a '/' must name a regular file; a bare name is looked up by the loader.
void library_path(std::string_view name, std::string_view value) {
  struct stat st {};
  const std::string path(value);
  if (path.find('/') != std::string::npos &&
      (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))) {
    throw EnvError(name, value, "a path to an existing shared library");
  }
}

void existing_file(std::string_view name, std::string_view value) {
  struct stat st {};
  const std::string path(value);
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    throw EnvError(name, value, "a path to an existing regular file");
  }
}

void placement(std::string_view name, std::string_view value) {
  if (!parse_placement(value)) throw EnvError(name, value, kPlacementAccepts);
}

// The choice knobs tide.torch reads (through tide_knob): their choices and the registry's words.
constexpr std::string_view kStateDtypeAccepts = "float32, bfloat16 or q8";
constexpr std::string_view kMasterDtypeAccepts = "float32 or bfloat16";
constexpr std::string_view kStateRoundingAccepts = "nearest or stochastic";

std::size_t choice(std::string_view name, std::string_view value,
                   std::initializer_list<std::string_view> choices, std::string_view accepts) {
  std::size_t index = 0;
  for (std::string_view c : choices) {
    if (value == c) return index;
    ++index;
  }
  throw EnvError(name, value, accepts);
}

std::size_t state_dtype_choice(std::string_view name, std::string_view value) {
  return choice(name, value, {"float32", "bfloat16", "q8"}, kStateDtypeAccepts);
}
std::size_t master_dtype_choice(std::string_view name, std::string_view value) {
  return choice(name, value, {"float32", "bfloat16"}, kMasterDtypeAccepts);
}
std::size_t state_rounding_choice(std::string_view name, std::string_view value) {
  return choice(name, value, {"nearest", "stochastic"}, kStateRoundingAccepts);
}

void state_dtype(std::string_view name, std::string_view value) { state_dtype_choice(name, value); }
void master_dtype(std::string_view name, std::string_view value) {
  master_dtype_choice(name, value);
}
void state_rounding(std::string_view name, std::string_view value) {
  state_rounding_choice(name, value);
}
void residency(std::string_view name, std::string_view value) {
  (void)choice(name, value, {"auto", "off"}, "auto or off");
}

// An integer >= 1 with an optional K, M or G suffix (x1024^n).
std::int64_t subgroup_size_value(std::string_view name, std::string_view value) {
  static constexpr std::string_view kAccepts =
      "an integer >= 1, optionally with a K, M or G suffix (x1024^n), e.g. 16M";
  std::string_view digits = value;
  std::int64_t scale = 1;
  if (!digits.empty()) {
    const char last = digits.back();
    for (const auto& [suffix, factor] :
         {std::pair{'K', std::int64_t{1} << 10}, std::pair{'M', std::int64_t{1} << 20},
          std::pair{'G', std::int64_t{1} << 30}}) {
      if (last == suffix || last == suffix - 'A' + 'a') {
        scale = factor;
        digits.remove_suffix(1);
      }
    }
  }
  for (char c : digits) {
    if (c < '0' || c > '9') throw EnvError(name, value, kAccepts);
  }
  try {
    return parse_int(name, digits, 1, kIntMax / scale) * scale;
  } catch (const EnvError&) {
    throw EnvError(name, value, kAccepts);
  }
}

void subgroup_size(std::string_view name, std::string_view value) {
  subgroup_size_value(name, value);
}

// A multiple of 256 (one 8-bit moments' quantization block), like TIDE_SUBGROUP_SIZE otherwise.
constexpr std::string_view kGpuChunkAccepts =
    "a multiple of 256 from 256 to 1G, optionally with a K, M or G suffix (x1024^n), e.g. 4M";
std::int64_t gpu_chunk_value(std::string_view name, std::string_view value) {
  std::int64_t n = 0;
  try {
    n = subgroup_size_value(name, value);
  } catch (const EnvError&) {
    throw EnvError(name, value, kGpuChunkAccepts);
  }
  if (n % 256 != 0 || n > (std::int64_t{1} << 30)) throw EnvError(name, value, kGpuChunkAccepts);
  return n;
}

void gpu_chunk(std::string_view name, std::string_view value) { gpu_chunk_value(name, value); }

}  // namespace

std::span<const Knob> knobs() {
  static constexpr Knob kKnobs[] = {
      {"TIDE_CUDA_DRIVER", "a path to a shared library",
       "CUDA driver library to load instead of libcuda.so.1 (e.g. the host stand-in driver "
       "build/lib/libtide_standin_cuda.so)",
       &library_path},
      {"TIDE_LIBRARY", "a path to libtide.so",
       "Python: the libtide.so to load instead of the package's own or the build tree's",
       &library_path},
      {"TIDE_CPU_THREADS", "an integer from 1 to 1024",
       "threads of the CPU optimizer kernels (default: the CPUs this process may run on, "
       "sched_getaffinity; with LOCAL_WORLD_SIZE > 1, the rank's share of the node's cores, and a "
       "value above that share is an error)",
       &integer<1, 1024>},
      {"TIDE_CPU_PIN", "a boolean (1/0, true/false, yes/no, on/off)",
       "with LOCAL_WORLD_SIZE > 1: pin the CPU optimizer kernels' threads to the rank's share of "
       "the node's cores (default on; off: the share's size, placed by the kernel)",
       &boolean},
      {"TIDE_CPU_ISA", "auto, avx512bf16, avx512, avx2 or scalar",
       "instruction set of the CPU optimizer kernels: auto, the widest this CPU runs, or the one "
       "named, which this CPU must be able to run; avx512bf16 is avx512 with AVX512_BF16's bf16 "
       "conversion, the same bits (default auto)",
       &cpu_isa},
      {"TIDE_STANDIN_MEMORY", "a size (e.g. 8GiB)",
       "stand-in driver: device memory capacity (default 8GiB)", &size},
      {"TIDE_STANDIN_DEVICES", "an integer from 1 to 16",
       "stand-in driver: number of devices (default 1)", &integer<1, 16>},
      {"TIDE_STANDIN_H2D_GBPS", "a number of GB/s, > 0",
       "stand-in driver: simulated host-to-device copy bandwidth (default: memcpy speed)",
       &positive},
      {"TIDE_STANDIN_D2H_GBPS", "a number of GB/s, > 0",
       "stand-in driver: simulated device-to-host copy bandwidth (default: memcpy speed)",
       &positive},
      {"TIDE_STANDIN_FAIL_ALLOC", "an integer >= 1",
       "stand-in driver: the Nth device allocation fails with CUDA_ERROR_OUT_OF_MEMORY",
       &integer<1, kIntMax>},
      {"TIDE_STANDIN_FAIL_COPY", "an integer >= 1",
       "stand-in driver: the Nth copy fails with CUDA_ERROR_LAUNCH_FAILED", &integer<1, kIntMax>},
      {"TIDE_STANDIN_DEVICE_LOST", "an integer >= 1",
       "stand-in driver: from the Nth driver call on, every call fails with "
       "CUDA_ERROR_DEVICE_UNAVAILABLE (device lost)",
       &integer<1, kIntMax>},
      {"TIDE_STANDIN_HMM", "a boolean (1/0, true/false, yes/no, on/off)",
       "stand-in driver: devices may address pageable host memory (HMM), as tide's CPU mode "
       "needs for CPU tensors",
       &boolean},
      {"TIDE_PINNED_CHUNK", kPinnedChunkAccepts,
       "pinned host arenas: largest size of a regular chunk (each chunk is one registration with "
       "the driver; chunks start at 4 MiB and grow with the arena) (default 256MiB)",
       &pinned_chunk},
      {"TIDE_PINNED_DIRECT", kPinnedDirectAccepts,
       "pinned host arenas: requests of at least this size skip jemalloc's size classes and are "
       "placed in chunks rounded up to a page only (default 1MiB)",
       &pinned_direct},
      {"TIDE_PINNED_RETAIN", "a size (e.g. 256MiB; 0: keep none)",
       "pinned host arenas: wholly free chunks kept registered for reuse, at most; beyond that "
       "a chunk is unregistered and unmapped as soon as it is free (default 256MiB)",
       &size},
      {"TIDE_PINNED_NUMA_NODE", "an integer from -1 to 1023",
       "pinned host arenas: NUMA node their chunks are bound to (mbind); -1: no binding "
       "(default -1)",
       &integer<-1, 1023>},
      {"TIDE_PINNED_HUGEPAGES", "a boolean (1/0, true/false, yes/no, on/off)",
       "pinned host arenas: ask for transparent huge pages on chunks (default on)", &boolean},
      {"TIDE_PINNED_TOUCH_THREADS", "an integer from 0 to 256",
       "pinned host arenas: threads that touch a new chunk's pages before it is registered; 0: "
       "min(8, cores) (default 0)",
       &integer<0, 256>},
      {"TIDE_NODE_PINNED_LIMIT", kLimitAccepts,
       "pinned host memory the ranks of this node may hold together: each of the LOCAL_WORLD_SIZE "
       "ranks may pin an equal share, over all its arenas; growing past it is an out-of-memory "
       "error naming this knob (default: none)",
       &limit},
      {"TIDE_HOST_MEMORY_LIMIT", kLimitAccepts,
       "host memory an optimizer's state may take in this process, at most: state larger than "
       "what this, the cgroup's memory limit (less its use) and MemAvailable leave is refused "
       "when the optimizer is made, saying how much is needed and how much there is (default: "
       "the cgroup's limit and MemAvailable only)",
       &limit},
      {"TIDE_MEMORY_LIMIT", kLimitAccepts,
       "interposer (tide run --limit): device memory limit per device for the process: "
       "cuMemGetInfo and cuDeviceTotalMem report it, allocations beyond it fail with "
       "CUDA_ERROR_OUT_OF_MEMORY (default: none; 0 is refused: unset means no limit)",
       &limit},
      {"TIDE_REPORT", "a path; %p becomes the process id",
       "interposer (tide run --report): where a process that used CUDA writes its memory report "
       "at exit (JSON), with the Perfetto trace next to it as *.trace.json (default: no file, a "
       "one-line summary on stderr; tide run's default is "
       "$XDG_STATE_HOME/tide/reports/tide-report.%p.json, ~/.local/state/... without "
       "XDG_STATE_HOME)",
       nullptr},
      {"TIDE_STACKS", "a boolean (1/0, true/false, yes/no, on/off)",
       "interposer (tide run --stacks): capture device allocation call stacks with libunwind "
       "for the report's top allocation sites (default off)",
       &boolean},
      {"TIDE_STACK_SAMPLE", "an integer from 1 to 1000000000",
       "interposer: with TIDE_STACKS, capture the call stack of one device allocation in N "
       "(default 1: every one)",
       &integer<1, 1000000000>},
      {"TIDE_CALIBRATION_FILE", "a path to an existing calibration file",
       "scheduler: the calibration file to read (and `tide calibrate` to write) instead of "
       "$XDG_CACHE_HOME/tide/calibration.json or ~/.cache/tide/calibration.json; it must exist "
       "when set",
       &existing_file},
      {"TIDE_RATE_CPU_UPDATE", "a number of params/s from 1e3 to 1e15",
       "scheduler: CPU update rate, per rank, with no copies running (overrides the calibration)",
       &params_per_s},
      {"TIDE_RATE_CPU_UPDATE_CONTENDED", "a number of params/s from 1e3 to 1e15",
       "scheduler: CPU update rate, per rank, while host-GPU copies run", &params_per_s},
      {"TIDE_RATE_H2D_GBPS", "a number of GB/s from 0.001 to 1e5",
       "scheduler: pinned host to GPU copy bandwidth, per rank, alone on the link", &gbps},
      {"TIDE_RATE_D2H_GBPS", "a number of GB/s from 0.001 to 1e5",
       "scheduler: GPU to pinned host copy bandwidth, per rank, alone on the link", &gbps},
      {"TIDE_RATE_H2D_DUPLEX_GBPS", "a number of GB/s from 0.001 to 1e5",
       "scheduler: host to GPU copy bandwidth while a GPU to host copy also runs", &gbps},
      {"TIDE_RATE_D2H_DUPLEX_GBPS", "a number of GB/s from 0.001 to 1e5",
       "scheduler: GPU to host copy bandwidth while a host to GPU copy also runs", &gbps},
      {"TIDE_RATE_GPU_UPDATE", "a number of params/s from 1e3 to 1e15",
       "scheduler: GPU (fused Adam kernel) update rate", &params_per_s},
      {"TIDE_RATE_HOST_MEMORY_GBPS", "a number of GB/s from 0.001 to 1e5",
       "scheduler: host memory bandwidth, per rank, the CPU update alone", &gbps},
      {"TIDE_RATE_HOST_MEMORY_CONTENDED_GBPS", "a number of GB/s from 0.001 to 1e5",
       "scheduler: host memory bandwidth, per rank, shared by the CPU update and copies in both "
       "directions",
       &gbps},
      {"TIDE_ALLOC_MEMORY_FRACTION", "a number greater than 0 and at most 1",
       "device caching allocator: cap on the device memory it holds, as a fraction of the "
       "device's (as torch.cuda.set_per_process_memory_fraction) (default: no cap)",
       &fraction},
      {"TIDE_ALLOC_MAX_BYTES", kLimitAccepts,
       "device caching allocator: cap on the device memory it holds, in bytes (the smaller of "
       "this and TIDE_ALLOC_MEMORY_FRACTION applies) (default: no cap; 0 is refused: unset means "
       "no cap)",
       &limit},
      {"TIDE_ALLOC_ROUND_DIVISIONS", "an integer from 0 to 64",
       "device caching allocator: requests above 1 MiB are rounded up to one of N equal steps per "
       "power of two, so that blocks of nearby sizes serve each other; 0: 512-byte multiples "
       "only (default 0)",
       &integer<0, 64>},
      {"TIDE_ALLOC_GROWABLE", "a boolean (1/0, true/false, yes/no, on/off)",
       "device caching allocator: grow the large pool as one address range backed in steps "
       "(cuMemAddressReserve/cuMemCreate/cuMemMap) where the driver supports it (default on)",
       &boolean},
      {"TIDE_ALLOC_THREAD_CACHE", "a size (e.g. 4MiB; 0: none)",
       "device caching allocator: free small blocks (up to 1 MiB) each thread keeps for itself, "
       "reused without the allocator's lock (default 4MiB)",
       &size},
      {"TIDE_TELEMETRY_SAMPLES", "an integer from 1024 to 67108864",
       "memory telemetry: samples of the live/reserved timeline kept per device (default 65536)",
       &integer<1024, 67108864>},
      {"TIDE_TELEMETRY_RESOLUTION", "a size (e.g. 1MiB; 0: automatic)",
       "memory telemetry: change of live or reserved bytes that makes a new timeline sample "
       "(default: the device's memory / 16384, at least 64KiB)",
       &size},
      {"TIDE_HEADROOM_MARGIN", "a number from 0 to 0.5",
       "headroom forecast: safety margin, as a fraction of the device memory limit, kept free "
       "below the update phase's forecast peak (default 0.02)",
       &margin},
      {"TIDE_HEADROOM_ITERATIONS", "an integer from 1 to 1000",
       "headroom forecast: recent iterations whose highest update-phase peak it forecasts "
       "(default 5)",
       &integer<1, 1000>},
      {"TIDE_PLACEMENT", "auto, cpu, gpu, or an integer K >= 1",
       "executor: where the update phase runs its subgroups when the caller names no policy: "
       "auto (the planner's choice within the headroom), cpu (all on the CPU), gpu (all on the "
       "GPU), K (one GPU subgroup every K) (default auto)",
       &placement},
      {"TIDE_RESIDENCY", "auto or off",
       "executor: with placement auto, keep the optimizer state (master weights and moments) "
       "of as many subgroups in device memory across steps as the memory free through a whole "
       "iteration allows (the allocator's held headroom forecast; tide's allocator only), so "
       "that their updates copy nothing over the link; off: every step copies it (default auto)",
       &residency},
      {"TIDE_GPU_CHUNK", kGpuChunkAccepts,
       "executor: parameters per chunk of a GPU subgroup's copies and update; a chunk's update "
       "starts once its copy-in is done and its copy-out once its update is, so the pipeline "
       "fills and drains one chunk at a time, not one subgroup; a subgroup is split into at most "
       "64 chunks, larger ones where this would give more (default 4M)",
       &gpu_chunk},
      {"TIDE_SUBGROUP_SIZE", "an integer >= 1, optionally with a K, M or G suffix (x1024^n)",
       "tide.torch.AdamW/Adam: elements per optimizer subgroup when the subgroup_size argument "
       "is not given (default 16M)",
       &subgroup_size},
      {"TIDE_STATE_DTYPE", kStateDtypeAccepts,
       "tide.torch.AdamW/Adam: dtype of the moments (exp_avg, exp_avg_sq) in pinned memory when "
       "the state_dtype argument is not given: bfloat16 halves their bytes (rounded to nearest "
       "even at every update), q8 keeps them as 8-bit block-wise codes (1 byte each and an fp32 "
       "scale per 256 elements); the master weights stay fp32 (default float32)",
       &state_dtype},
      {"TIDE_MASTER_DTYPE", kMasterDtypeAccepts,
       "tide.torch.AdamW/Adam: the master weights when the master_dtype argument is not given: "
       "float32 keeps an fp32 copy in pinned memory; bfloat16 makes the model's bf16 parameters "
       "the master weights with a bf16 compensation each (Kahan-style, no fp32 master; bf16 "
       "parameters and float32 or bfloat16 moments only) (default float32)",
       &master_dtype},
      {"TIDE_STATE_ROUNDING", kStateRoundingAccepts,
       "tide.torch.AdamW/Adam: how bf16 moments are rounded at every update when the "
       "state_rounding argument is not given: nearest (even), or stochastic (unbiased: rounded "
       "up with the probability of the ulp's fraction lost; random bits hashed from a seed, the "
       "step and each element's index, so every kernel and placement gives the same bits); "
       "stochastic with fp32 or q8 moments is an error (default nearest)",
       &state_rounding},
  };
  return kKnobs;
}

const Knob* find_knob(std::string_view name) {
  for (const Knob& knob : knobs()) {
    if (knob.name == name) return &knob;
  }
  return nullptr;
}

KnobValue read_knob(std::string_view name, std::optional<std::string_view> value) {
  std::optional<std::string> from_env;
  if (!value) {
    from_env = env_text(std::string(name).c_str());
    if (from_env) value = *from_env;
  }
  KnobValue out;
  if (!value || value->empty()) return out;
  out.set = true;
  if (name == "TIDE_SUBGROUP_SIZE") {
    out.integer = subgroup_size_value(name, *value);
  } else if (name == "TIDE_GPU_CHUNK") {
    out.integer = gpu_chunk_value(name, *value);
  } else if (name == "TIDE_STATE_DTYPE") {
    out.choice = state_dtype_choice(name, *value);
  } else if (name == "TIDE_MASTER_DTYPE") {
    out.choice = master_dtype_choice(name, *value);
  } else if (name == "TIDE_STATE_ROUNDING") {
    out.choice = state_rounding_choice(name, *value);
  } else {
    throw std::invalid_argument("tide: read_knob: " + std::string(name) +
                                " is not one of the knobs it parses (TIDE_SUBGROUP_SIZE, "
                                "TIDE_GPU_CHUNK, TIDE_STATE_DTYPE, TIDE_MASTER_DTYPE, "
                                "TIDE_STATE_ROUNDING)");
  }
  return out;
}

void check_environment() {
  for (const Knob& knob : knobs()) {
    if (knob.check == nullptr) continue;
    const std::string name(knob.name);
    if (const auto value = env_text(name.c_str())) knob.check(knob.name, *value);
  }
}

}  // namespace tide::config

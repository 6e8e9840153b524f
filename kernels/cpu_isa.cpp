// Which instruction sets this CPU and OS can run, from CPUID and XGETBV, and which one the kernels
// use (TIDE_CPU_ISA).
#include <string_view>

#include "config/env.h"
#include "kernels/cpu_adam.h"
#include "kernels/cpu_variant.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <stdexcept>
#include <string>

namespace tide::kernels {
namespace {

struct Features {
  bool avx2 = false;
  bool avx512 = false;
  bool avx512bf16 = false;
};

Features detect() {
  Features f;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) return f;
  const bool fma = (c & (1u << 12)) != 0;
  const bool osxsave = (c & (1u << 27)) != 0;
  const bool avx = (c & (1u << 28)) != 0;
  const bool f16c = (c & (1u << 29)) != 0;
  const bool popcnt = (c & (1u << 23)) != 0;
  if (!osxsave || !avx) return f;
  // The OS must save the vector registers: XCR0 bits 1-2 (SSE, AVX) and 5-7 (AVX-512 opmask,
  // upper halves of ZMM0-15, ZMM16-31).
  unsigned xcr0_low = 0, xcr0_high = 0;
  __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  const bool os_avx = (xcr0_low & 0x6u) == 0x6u;
  const bool os_avx512 = (xcr0_low & 0xe6u) == 0xe6u;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return f;
  const bool avx2 = (b & (1u << 5)) != 0;
  const bool avx512f = (b & (1u << 16)) != 0;
  const bool avx512dq = (b & (1u << 17)) != 0;
  const bool avx512bw = (b & (1u << 30)) != 0;
  const bool avx512vl = (b & (1u << 31)) != 0;
  f.avx2 = os_avx && avx2 && fma && f16c && popcnt;
  f.avx512 = f.avx2 && os_avx512 && avx512f && avx512dq && avx512bw && avx512vl;
  // AVX512_BF16: CPUID leaf 7, subleaf 1, EAX bit 5.
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d) == 0) return f;
  f.avx512bf16 = f.avx512 && (a & (1u << 5)) != 0;
#endif
  return f;
}

const Features& features() {
  static const Features f = detect();
  return f;
}

}  // namespace

std::string_view isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512Bf16:
      return "avx512bf16";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kScalar:
      break;
  }
  return "scalar";
}

bool cpu_supports(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512Bf16:
      return features().avx512bf16;
    case CpuIsa::kAvx512:
      return features().avx512;
    case CpuIsa::kAvx2:
      return features().avx2;
    case CpuIsa::kScalar:
      return true;
  }
  return false;
}

CpuIsa best_cpu_isa() {
  if (cpu_supports(CpuIsa::kAvx512Bf16)) return CpuIsa::kAvx512Bf16;
  if (cpu_supports(CpuIsa::kAvx512)) return CpuIsa::kAvx512;
  if (cpu_supports(CpuIsa::kAvx2)) return CpuIsa::kAvx2;
  return CpuIsa::kScalar;
}

CpuIsa choose_cpu_isa(std::string_view knob_value, unsigned supported) {
  static constexpr CpuIsa kWidestFirst[] = {CpuIsa::kAvx512Bf16, CpuIsa::kAvx512, CpuIsa::kAvx2,
                                            CpuIsa::kScalar};
  const std::size_t choice = config::parse_choice(
      "TIDE_CPU_ISA", knob_value, {"auto", "avx512bf16", "avx512", "avx2", "scalar"});
  const auto runs = [&](CpuIsa isa) {
    return isa == CpuIsa::kScalar || (supported & (1u << static_cast<unsigned>(isa))) != 0;
  };
  if (choice == 0) {  // auto
    for (CpuIsa isa : kWidestFirst) {
      if (runs(isa)) return isa;
    }
  }
  const CpuIsa isa = kWidestFirst[choice - 1];
  if (runs(isa)) return isa;
  // A machine that lacks the forced variant: say which ones it can run.
  std::string accepts = "one of: auto";
  for (CpuIsa other : kWidestFirst) {
    if (runs(other)) accepts += ", " + std::string(isa_name(other));
  }
  accepts += " (this CPU cannot run the " + std::string(isa_name(isa)) + " kernels)";
  throw config::EnvError("TIDE_CPU_ISA", knob_value, accepts);
}

CpuIsa default_cpu_isa() {
  // Thread-safe and once: a throwing initialiser leaves it to be tried again, so a bad value fails
  // every call, never just the first.
  static const CpuIsa isa = [] {
    unsigned supported = 0;
    for (CpuIsa i : kCpuIsas) {
      if (cpu_supports(i)) supported |= 1u << static_cast<unsigned>(i);
    }
    return choose_cpu_isa(config::env_text("TIDE_CPU_ISA").value_or("auto"), supported);
  }();
  return isa;
}

const CpuKernels& cpu_kernels(CpuIsa isa) {
  if (!cpu_supports(isa)) {
    throw std::invalid_argument("tide: this CPU cannot run the " + std::string(isa_name(isa)) +
                                " kernels");
  }
  switch (isa) {
    case CpuIsa::kAvx512Bf16:
      return avx512_bf16_kernels();
    case CpuIsa::kAvx512:
      return avx512_kernels();
    case CpuIsa::kAvx2:
      return avx2_kernels();
    case CpuIsa::kScalar:
      break;
  }
  return scalar_kernels();
}

}  // namespace tide::kernels

#include "pinned_workloads.h"

#include <random>

namespace tide::bench {

PinnedWorkload subgroup_workload(const std::string& name, std::size_t params,
                                 std::size_t total_bytes) {
  PinnedWorkload w{name, "", {}};
  std::mt19937_64 rng(2024);
  std::uniform_int_distribution<std::size_t> mixed(10'000'000, 100'000'000);
  std::size_t total = 0;
  std::size_t id = 0;
  while (total < total_bytes) {
    const std::size_t p = params != 0 ? params : mixed(rng);
    for (int buffer = 0; buffer < 3; ++buffer) {
      w.ops.push_back({true, id++, p * 4});
      total += p * 4;
    }
  }
  w.description = params != 0 ? "subgroups of " + std::to_string(params) + " params x 3 fp32"
                              : "subgroups of 1e7..1e8 params (uniform) x 3 fp32";
  return w;
}

PinnedWorkload grad_staging_workload() {
  PinnedWorkload w{"grad_staging_mixed",
                   "bf16 gradients of a 12-layer h=2048 GPT (every tensor), then 400 "
                   "alloc/free of 1..64 MiB staging buffers, at most 4 live",
                   {}};
  constexpr std::size_t h = 2048;
  constexpr std::size_t vocab = 32000;
  constexpr std::size_t bf16 = 2;
  std::size_t id = 0;
  auto add = [&](std::size_t elements) { w.ops.push_back({true, id++, elements * bf16}); };
  add(vocab * h);  // token embedding
  add(1024 * h);   // position embedding
  for (int layer = 0; layer < 12; ++layer) {
    add(h), add(h);              // attention layer norm
    add(3 * h * h), add(3 * h);  // qkv
    add(h * h), add(h);          // attention output
    add(h), add(h);              // mlp layer norm
    add(4 * h * h), add(4 * h);  // mlp up
    add(4 * h * h), add(h);      // mlp down
  }
  add(h), add(h);  // final layer norm

  // Staging buffers for copies: sizes vary with the subgroup being copied.
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<std::size_t> mib(1, 64);
  std::vector<PinnedOp> live;
  for (int i = 0; i < 400; ++i) {
    if (live.size() == 4 || (!live.empty() && rng() % 2 == 0)) {
      const std::size_t k = rng() % live.size();
      w.ops.push_back({false, live[k].id, live[k].bytes});
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    } else {
      // Sizes are not whole MiB: a tensor's bytes rarely are.
      const std::size_t bytes = mib(rng) * (1 << 20) - 4096 * (rng() % 100) + rng() % 4096;
      PinnedOp op{true, id++, bytes};
      w.ops.push_back(op);
      live.push_back(op);
    }
  }
  return w;
}

}  // namespace tide::bench

#include "allocator/telemetry/synthetic_trace.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

namespace tide::allocator::telemetry {
namespace {

class Generator {
 public:
  Generator(const SyntheticOptions& options) : options_(options), rng_(options.seed) {}

  std::uint64_t alloc(std::uint64_t bytes) {
    TraceEvent e;
    e.t_ns = t_;
    e.op = TraceOp::kAlloc;
    e.id = next_id_++;
    e.bytes = std::max<std::uint64_t>(bytes, 1);
    out_.trace.events.push_back(e);
    ++allocs_;
    return e.id;
  }
  void free(std::uint64_t id) {
    TraceEvent e;
    e.t_ns = t_;
    e.op = TraceOp::kFree;
    e.id = id;
    out_.trace.events.push_back(e);
  }
  void mark(Mark m) {
    if (!options_.marks) return;
    TraceEvent e;
    e.t_ns = t_;
    e.op = TraceOp::kMark;
    e.mark = m;
    out_.trace.events.push_back(e);
  }
  // Time passes: `ns`, varied by the time jitter.
  void advance(std::uint64_t ns) {
    const double j = options_.time_jitter;
    const double f = j > 0 ? std::uniform_real_distribution<double>(1 - j, 1 + j)(rng_) : 1.0;
    t_ += static_cast<std::uint64_t>(std::llround(static_cast<double>(ns) * f));
  }
  double size_factor() {
    const double j = options_.size_jitter;
    return j > 0 ? std::uniform_real_distribution<double>(1 - j, 1 + j)(rng_) : 1.0;
  }
  std::uint64_t now() const { return t_; }
  std::uint64_t allocs() const { return allocs_; }
  SyntheticTrace& out() { return out_; }

 private:
  const SyntheticOptions& options_;
  std::mt19937_64 rng_;
  std::uint64_t t_ = 0;
  std::uint64_t next_id_ = 1;
  std::uint64_t allocs_ = 0;
  SyntheticTrace out_;
};

}  // namespace

std::vector<TransformerShape> standard_shapes() {
  return {
      {"gpt-tiny", 4, 256, 256, 8, 8192, 4},
      {"gpt2-small", 12, 768, 1024, 4, 50257, 12},
      {"gpt2-medium", 24, 1024, 1024, 4, 50257, 16},
      {"gpt-1.3b", 24, 2048, 1024, 1, 50257, 16},
  };
}

TransformerShape shape_named(const std::string& name) {
  std::string known;
  for (const TransformerShape& s : standard_shapes()) {
    if (s.name == name) return s;
    known += (known.empty() ? "" : ", ") + s.name;
  }
  throw std::invalid_argument("no transformer shape named '" + name + "' (known: " + known + ")");
}

SyntheticTrace generate_transformer_trace(const TransformerShape& shape,
                                          const SyntheticOptions& options) {
  Generator g(options);
  const std::uint64_t h = static_cast<std::uint64_t>(shape.hidden);
  const std::uint64_t vocab = static_cast<std::uint64_t>(shape.vocab);
  constexpr std::uint64_t kBf16 = 2;
  constexpr std::uint64_t kFp32 = 4;

  // Weights: per layer qkv, projection, MLP in and out, two layer norms; the tied embedding.
  struct LayerWeights {
    std::uint64_t bytes[6];
  };
  const LayerWeights lw{{3 * h * h * kBf16, h * h * kBf16, 4 * h * h * kBf16, 4 * h * h * kBf16,
                         2 * h * kBf16, 2 * h * kBf16}};
  std::uint64_t params = vocab * h;
  for (int l = 0; l < shape.layers; ++l) {
    for (std::uint64_t b : lw.bytes) {
      g.alloc(b);
      params += b / kBf16;
    }
  }
  g.alloc(vocab * h * kBf16);
  g.advance(options.layer_ns);
  const std::uint64_t groups =
      std::max<std::uint64_t>(1, params * kFp32 / std::max<std::uint64_t>(options.group_bytes, 1));
  const std::uint64_t group_bytes = params * kFp32 / groups;

  const std::uint64_t step = options.layer_ns / 8;
  for (int it = 0; it < options.iterations; ++it) {
    const std::uint64_t alloc_before = g.allocs();
    const auto seq = static_cast<std::uint64_t>(
        std::max(8.0, std::round(shape.seq * g.size_factor() / 8.0) * 8.0));
    const std::uint64_t tokens = seq * static_cast<std::uint64_t>(shape.batch);
    const std::uint64_t act = tokens * h * kBf16;

    // ---- forward
    g.out().iteration_start_ns.push_back(g.now());
    g.mark(Mark::kForward);
    const std::uint64_t embedded = g.alloc(act);
    g.advance(step);
    std::vector<std::vector<std::uint64_t>> saved(static_cast<std::size_t>(shape.layers));
    for (int l = 0; l < shape.layers; ++l) {
      auto& s = saved[static_cast<std::size_t>(l)];
      for (std::uint64_t bytes :
           {act, 3 * act, act, tokens * static_cast<std::uint64_t>(shape.heads) * kFp32, act, act,
            4 * act, 4 * act}) {
        s.push_back(g.alloc(bytes));
        g.advance(step);
      }
      const std::uint64_t residual = g.alloc(act);  // short-lived
      g.advance(step / 2);
      g.free(residual);
    }
    const std::uint64_t logits = g.alloc(tokens * vocab * kBf16);
    g.advance(step * 4);
    const std::uint64_t softmax = g.alloc(tokens * vocab * kFp32);
    g.advance(step * 4);
    g.free(softmax);
    g.advance(step);

    // ---- backward
    g.out().backward_start_ns.push_back(g.now());
    g.mark(Mark::kBackward);
    std::vector<std::uint64_t> grads;
    const std::uint64_t dlogits = g.alloc(tokens * vocab * kBf16);
    g.advance(step * 4);
    g.free(logits);
    std::uint64_t dh = g.alloc(act);
    g.advance(step * 4);
    g.free(dlogits);
    for (int l = shape.layers - 1; l >= 0; --l) {
      auto& s = saved[static_cast<std::size_t>(l)];
      // MLP: input gradient, weight gradients, then the MLP's saved tensors go.
      const std::uint64_t dmlp = g.alloc(4 * act);
      g.advance(step * 2);
      grads.push_back(g.alloc(lw.bytes[3]));
      g.advance(step * 2);
      g.free(s[7]);
      g.free(s[6]);
      grads.push_back(g.alloc(lw.bytes[2]));
      g.advance(step * 2);
      const std::uint64_t dln2 = g.alloc(act);
      g.free(dmlp);
      g.free(s[5]);
      grads.push_back(g.alloc(lw.bytes[5]));
      g.advance(step * 2);
      // Attention.
      grads.push_back(g.alloc(lw.bytes[1]));
      g.free(s[4]);
      g.free(s[3]);
      g.free(s[2]);
      g.advance(step * 2);
      const std::uint64_t dqkv = g.alloc(3 * act);
      g.advance(step * 2);
      grads.push_back(g.alloc(lw.bytes[0]));
      g.free(s[1]);
      g.free(dqkv);
      g.advance(step * 2);
      grads.push_back(g.alloc(lw.bytes[4]));
      g.free(s[0]);
      const std::uint64_t dh_next = g.alloc(act);
      g.free(dln2);
      g.free(dh);
      dh = dh_next;
      g.advance(step * 2);
    }
    g.free(dh);
    g.free(embedded);
    grads.push_back(g.alloc(vocab * h * kBf16));
    g.advance(step * 2);

    // ---- update
    g.out().update_start_ns.push_back(g.now());
    g.mark(Mark::kUpdate);
    for (std::uint64_t k = 0; k < groups; ++k) {
      const std::uint64_t a = g.alloc(group_bytes);
      g.advance(step);
      const std::uint64_t b = g.alloc(group_bytes);
      g.advance(step * 2);
      g.free(b);
      g.free(a);
      g.advance(step);
    }
    for (std::uint64_t id : grads) g.free(id);  // zero_grad(set_to_none=True)
    g.out().update_end_ns.push_back(g.now());
    g.mark(Mark::kIterationEnd);
    g.advance(step);  // the data loader's turn
    g.out().allocations_per_iteration = g.allocs() - alloc_before;
  }
  return std::move(g.out());
}

}  // namespace tide::allocator::telemetry

#include "planner/planner.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <span>
#include <stdexcept>

#include "planner/interleave.h"
#include "planner/performance_model.h"

namespace tide::planner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A predicted time and the fewest buffers that reach it.
struct Timing {
  double time = kInf;
  std::size_t buffers = 0;  // 0: no buffer count fits
};

// The most buffers a GPU set may have, given its size, the gradients it keeps and its largest
// subgroup; 0 when not even one fits.
std::size_t max_buffers(const Workload& workload, const PlannerOptions& options, std::size_t g,
                        std::uint64_t resident, std::uint64_t largest) {
  const std::uint64_t headroom = workload.headroom_bytes;
  if (g == 0 || resident > headroom) return 0;
  const std::uint64_t buffer = workload.footprint.buffer_bytes(largest);
  std::uint64_t fit = buffer == 0 ? g : (headroom - resident) / buffer;
  fit = std::min<std::uint64_t>(fit, g);
  if (options.max_buffers != 0) fit = std::min<std::uint64_t>(fit, options.max_buffers);
  return static_cast<std::size_t>(fit);
}

// The phase of GPU subgroups `order` (sizes, pipeline order) with `buffers` buffers.
double phase_of(const PerformanceModel& model, std::vector<double>& scratch,
                std::span<const std::uint64_t> order, double gpu_params, double cpu_params,
                std::size_t buffers) {
  const bool duplex = buffers >= 2 && order.size() >= 2;
  return model.phase(cpu_params, gpu_params, model.gpu_side(order, buffers, cpu_params, scratch),
                     model.link_side(gpu_params, cpu_params, duplex));
}

// The best time of GPU subgroups `order` (sizes, pipeline order) over 1..dmax buffers. From D = 2
// up the GPU side only shrinks with D (and the phase never shrinks when the GPU side grows; the
// link's time does not depend on D, host memory's only grows with the GPU side), so the best is D =
// 1 or D = dmax; `buffers` is dmax in the second case, see fewest_buffers().
Timing time_of(const PerformanceModel& model, std::vector<double>& scratch,
               std::span<const std::uint64_t> order, double gpu_params, double cpu_params,
               std::size_t dmax) {
  Timing t;
  if (dmax == 0) return t;
  if (dmax > 1) {
    t.time = phase_of(model, scratch, order, gpu_params, cpu_params, dmax);
    t.buffers = dmax;
    // One buffer serialises everything; its closed form (a lower bound with uploads, up to
    // rounding, hence the margin) says when it cannot win without running the recurrence.
    const double serial = model.phase(cpu_params, gpu_params, model.serial_gpu_side(gpu_params),
                                      model.link_side(gpu_params, cpu_params, false));
    if (serial * (1 - 1e-9) > t.time) return t;
  }
  const double one = phase_of(model, scratch, order, gpu_params, cpu_params, 1);
  if (one <= t.time) {
    t.time = one;
    t.buffers = 1;
  }
  return t;
}

// The fewest buffers in [2, dmax] whose phase time is that of dmax (binary search: the phase is
// monotone in D from 2 up). When the CPU side is the longer one, that can be far fewer than the
// buffers that would make the GPU side itself shortest.
std::size_t fewest_buffers(const PerformanceModel& model, std::vector<double>& scratch,
                           std::span<const std::uint64_t> order, double gpu_params,
                           double cpu_params, std::size_t dmax) {
  const double target = phase_of(model, scratch, order, gpu_params, cpu_params, dmax);
  std::size_t lo = 2;
  std::size_t hi = dmax;
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (phase_of(model, scratch, order, gpu_params, cpu_params, mid) <= target) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// The best candidate so far, in the model's terms.
struct Best {
  double time = kInf;
  std::uint64_t gpu_bytes = 0;
  std::vector<std::size_t> gpu_order;  // subgroup indices, pipeline order
  std::size_t buffers = 0;
};

class Search {
 public:
  Search(const Workload& workload, const Rates& rates, const PlannerOptions& options)
      : workload_(workload),
        options_(options),
        model_(rates, workload.footprint),
        sizes_(workload.subgroup_params),
        total_(std::accumulate(sizes_.begin(), sizes_.end(), std::uint64_t{0})) {
    // All-CPU is the first candidate: anything else must beat it.
    best_.time = model_.all_cpu(static_cast<double>(total_));
  }

  const Best& best() const { return best_; }
  const std::vector<std::uint64_t>& sizes() const { return sizes_; }
  bool fits_one_buffer(std::uint64_t resident, std::uint64_t largest) const {
    return max_buffers(workload_, options_, 1, resident, largest) == 1;
  }
  std::uint64_t resident_bytes(std::uint64_t params) const {
    return workload_.footprint.resident_bytes(params);
  }

  // Considers GPU subgroups with sizes `order`; `indices()` turns them into subgroup indices and
  // is called only when the candidate wins (faster, or as fast with less GPU memory).
  template <typename Indices>
  double consider(std::span<const std::uint64_t> order, std::uint64_t gpu_params,
                  std::uint64_t resident, std::uint64_t largest, Indices&& indices) {
    const std::size_t dmax = max_buffers(workload_, options_, order.size(), resident, largest);
    const double cpu_params = static_cast<double>(total_ - gpu_params);
    Timing t = time_of(model_, scratch_, order, static_cast<double>(gpu_params), cpu_params, dmax);
    if (t.buffers == 0 || t.time > best_.time) return t.time;
    if (t.buffers > 1) {
      t.buffers = fewest_buffers(model_, scratch_, order, static_cast<double>(gpu_params),
                                 cpu_params, dmax);
    }
    const std::uint64_t bytes = t.buffers * workload_.footprint.buffer_bytes(largest) + resident;
    if (t.time == best_.time && bytes >= best_.gpu_bytes) return t.time;
    best_.time = t.time;
    best_.gpu_bytes = bytes;
    best_.buffers = t.buffers;
    best_.gpu_order = indices();
    return t.time;
  }

  // Considers GPU subgroups given by index, in this order.
  double consider_indices(const std::vector<std::size_t>& gpu_order) {
    order_.clear();
    std::uint64_t gpu_params = 0;
    std::uint64_t resident = 0;
    std::uint64_t largest = 0;
    for (std::size_t i : gpu_order) {
      order_.push_back(sizes_[i]);
      gpu_params += sizes_[i];
      resident += resident_bytes(sizes_[i]);
      largest = std::max(largest, sizes_[i]);
    }
    return consider(order_, gpu_params, resident, largest, [&] { return gpu_order; });
  }

 private:
  const Workload& workload_;
  PlannerOptions options_;
  PerformanceModel model_;
  const std::vector<std::uint64_t>& sizes_;
  std::uint64_t total_;
  Best best_;
  std::vector<double> scratch_;
  std::vector<std::uint64_t> order_;
};

// Orders worth trying for a GPU set, as permutations of its ascending positions 0..g-1: the
// pipeline's fill wants a small first subgroup, its drain a small last one.
void ordering_rules(std::size_t g, std::vector<std::vector<std::size_t>>& rules) {
  rules.clear();
  std::vector<std::size_t> ascending(g);
  std::iota(ascending.begin(), ascending.end(), std::size_t{0});
  rules.push_back(ascending);
  rules.emplace_back(ascending.rbegin(), ascending.rend());
  if (g < 3) return;
  // smallest first, the second smallest last, the rest descending or ascending between them
  for (bool descending : {true, false}) {
    for (bool swap_ends : {false, true}) {
      std::vector<std::size_t> r;
      r.push_back(swap_ends ? 1 : 0);
      if (descending) {
        for (std::size_t p = g; p-- > 2;) r.push_back(p);
      } else {
        for (std::size_t p = 2; p < g; ++p) r.push_back(p);
      }
      r.push_back(swap_ends ? 0 : 1);
      rules.push_back(std::move(r));
    }
  }
  // a pyramid: small at both ends, the largest in the middle
  std::vector<std::size_t> pyramid;
  for (std::size_t p = 0; p < g; p += 2) pyramid.push_back(p);
  for (std::size_t p = (g % 2 == 0 ? g - 1 : g - 2); p < g; p -= 2) {
    pyramid.push_back(p);
    if (p < 2) break;
  }
  rules.push_back(std::move(pyramid));
}

// `count` of `members` (ascending indices), spread evenly: with half of them, every other one,
// the way the published interleaving picks one subgroup in K.
void spread(const std::vector<std::size_t>& members, std::size_t count,
            std::vector<std::size_t>& out) {
  for (std::size_t k = 0; k < count; ++k) out.push_back(members[k * members.size() / count]);
}

struct SizeClass {
  std::uint64_t size;
  std::vector<std::size_t> members;  // ascending index
};

std::vector<SizeClass> size_classes(const std::vector<std::uint64_t>& sizes) {
  std::vector<std::size_t> by_size(sizes.size());
  std::iota(by_size.begin(), by_size.end(), std::size_t{0});
  std::stable_sort(by_size.begin(), by_size.end(),
                   [&](std::size_t a, std::size_t b) { return sizes[a] < sizes[b]; });
  std::vector<SizeClass> classes;
  for (std::size_t i : by_size) {
    if (classes.empty() || classes.back().size != sizes[i]) classes.push_back({sizes[i], {}});
    classes.back().members.push_back(i);
  }
  return classes;
}

// Distinct orders of a multiset with these counts, saturating at `cap`.
double distinct_orders(const std::vector<std::size_t>& counts, double cap) {
  double orders = 1;
  std::size_t placed = 0;
  for (std::size_t c : counts) {
    for (std::size_t k = 1; k <= c; ++k) {
      ++placed;
      orders = orders * static_cast<double>(placed) / static_cast<double>(k);
      if (orders > cap) return cap;
    }
  }
  return std::round(orders);
}

// Advances an odometer over counts[k] in [0, limits[k]]; false after the last.
bool next_counts(std::vector<std::size_t>& counts, const std::vector<std::size_t>& limits) {
  for (std::size_t k = 0; k < counts.size(); ++k) {
    if (counts[k] < limits[k]) {
      ++counts[k];
      return true;
    }
    counts[k] = 0;
  }
  return false;
}

// Every GPU multiset, every distinct order when `all_orders`, else the ordering rules.
void search_classes(Search& search, const std::vector<SizeClass>& classes, bool all_orders) {
  std::vector<std::size_t> counts(classes.size(), 0);
  std::vector<std::size_t> limits;
  limits.reserve(classes.size());
  for (const SizeClass& c : classes) limits.push_back(c.members.size());
  std::vector<std::uint64_t> ascending;
  std::vector<std::size_t> ascending_index;
  std::vector<std::uint64_t> order;
  std::vector<std::vector<std::size_t>> rules;
  std::vector<std::vector<std::uint64_t>> tried;
  while (next_counts(counts, limits)) {  // the all-zero vector (all-CPU) is already the best
    ascending.clear();
    ascending_index.clear();
    std::uint64_t gpu_params = 0;
    std::uint64_t largest = 0;
    for (std::size_t k = 0; k < classes.size(); ++k) {
      ascending.insert(ascending.end(), counts[k], classes[k].size);
      spread(classes[k].members, counts[k], ascending_index);
      gpu_params += counts[k] * classes[k].size;
      if (counts[k] > 0) largest = classes[k].size;
    }
    std::uint64_t resident = 0;
    for (std::uint64_t s : ascending) resident += search.resident_bytes(s);
    if (!search.fits_one_buffer(resident, largest)) continue;
    // Subgroup indices for sizes in `order`: the k-th subgroup of a size in the order takes the
    // k-th chosen index of that size.
    auto indices = [&] {
      std::vector<std::size_t> out;
      std::vector<std::size_t> used(ascending.size(), 0);
      for (std::uint64_t s : order) {
        const auto first = static_cast<std::size_t>(
            std::lower_bound(ascending.begin(), ascending.end(), s) - ascending.begin());
        out.push_back(ascending_index[first + used[first]++]);
      }
      return out;
    };
    if (all_orders) {
      order = ascending;
      do {
        search.consider(order, gpu_params, resident, largest, indices);
      } while (std::next_permutation(order.begin(), order.end()));
    } else {
      ordering_rules(ascending.size(), rules);
      tried.clear();
      for (const auto& rule : rules) {
        order.clear();
        for (std::size_t p : rule) order.push_back(ascending[p]);
        // With repeated sizes several rules give the same order.
        if (std::find(tried.begin(), tried.end(), order) != tried.end()) continue;
        tried.push_back(order);
        search.consider(order, gpu_params, resident, largest, indices);
      }
    }
  }
}

// GPU sets that are windows of the subgroups sorted by size (all of them when there are at most
// kGrid subgroups, else a kGrid × kGrid grid of (count, start) refined around its best), each with
// the ordering rules.
void search_windows(Search& search) {
  constexpr std::size_t kGrid = 64;
  const std::vector<std::uint64_t>& sizes = search.sizes();
  const std::size_t n = sizes.size();
  std::vector<std::size_t> by_size(n);
  std::iota(by_size.begin(), by_size.end(), std::size_t{0});
  std::stable_sort(by_size.begin(), by_size.end(),
                   [&](std::size_t a, std::size_t b) { return sizes[a] < sizes[b]; });
  std::vector<std::uint64_t> params(n + 1, 0);
  std::vector<std::uint64_t> resident(n + 1, 0);
  for (std::size_t p = 0; p < n; ++p) {
    params[p + 1] = params[p] + sizes[by_size[p]];
    resident[p + 1] = resident[p] + search.resident_bytes(sizes[by_size[p]]);
  }
  std::vector<std::vector<std::size_t>> rules;
  std::vector<std::vector<std::uint64_t>> tried;
  std::vector<std::uint64_t> order;
  // Windows already tried, by (count, params, smallest, largest): with repeated sizes many
  // windows hold the same multiset.
  std::set<std::array<std::uint64_t, 4>> seen;
  auto window = [&](std::size_t g, std::size_t start) {
    const std::array<std::uint64_t, 4> key = {g, params[start + g] - params[start],
                                              sizes[by_size[start]], sizes[by_size[start + g - 1]]};
    if (!seen.insert(key).second) return kInf;
    ordering_rules(g, rules);
    tried.clear();
    double best = kInf;
    for (const auto& rule : rules) {
      order.clear();
      for (std::size_t p : rule) order.push_back(sizes[by_size[start + p]]);
      if (std::find(tried.begin(), tried.end(), order) != tried.end()) continue;
      tried.push_back(order);
      const double t = search.consider(order, params[start + g] - params[start],
                                       resident[start + g] - resident[start],
                                       sizes[by_size[start + g - 1]], [&] {
                                         std::vector<std::size_t> out;
                                         out.reserve(rule.size());
                                         for (std::size_t p : rule)
                                           out.push_back(by_size[start + p]);
                                         return out;
                                       });
      best = std::min(best, t);
    }
    return best;
  };
  auto stride_for = [](std::size_t span) {
    return std::max<std::size_t>(1, (span + kGrid - 1) / kGrid);
  };

  // first, first + stride, ..., and last.
  auto grid = [](std::size_t first, std::size_t last, std::size_t stride) {
    std::vector<std::size_t> points;
    for (std::size_t x = first; x < last; x += stride) points.push_back(x);
    points.push_back(last);
    return points;
  };

  const std::size_t stride_g = stride_for(n);
  double best = kInf;
  std::size_t best_g = 0;
  std::size_t best_start = 0;
  std::size_t widest_stride = 1;
  for (std::size_t g : grid(1, n, stride_g)) {
    const std::size_t stride_s = stride_for(n - g + 1);
    widest_stride = std::max(widest_stride, stride_s);
    for (std::size_t start : grid(0, n - g, stride_s)) {
      const double t = window(g, start);
      if (t < best) {
        best = t;
        best_g = g;
        best_start = start;
      }
    }
  }
  if (stride_g == 1 && widest_stride == 1) return;  // every window was tried
  const std::size_t g_lo = best_g > stride_g ? best_g - stride_g : 1;
  const std::size_t g_hi = std::min(n, best_g + stride_g);
  for (std::size_t g = g_lo; g <= g_hi; ++g) {
    const std::size_t s_lo = best_start > widest_stride ? best_start - widest_stride : 0;
    const std::size_t s_hi = std::min(n - g, best_start + widest_stride);
    for (std::size_t start = s_lo; start <= s_hi; ++start) window(g, start);
  }
}

// Local search around the best plan, first improvement, while it helps: exchanges of a GPU and a
// CPU subgroup, adding or dropping one (at either end of the pipeline), then swaps and moves
// within the GPU order. It repairs what the windows cannot express (GPU sets that are not
// contiguous in size order) and what the ordering rules miss.
void improve(Search& search) {
  constexpr std::size_t kMaxSubgroups = 48;  // each pass is O(n^2) candidates of O(n)
  constexpr int kMaxPasses = 8;
  const std::size_t n = search.sizes().size();
  if (n > kMaxSubgroups) return;
  for (int pass = 0; pass < kMaxPasses; ++pass) {
    const std::vector<std::size_t> start = search.best().gpu_order;
    std::vector<bool> on_gpu(n, false);
    for (std::size_t i : start) on_gpu[i] = true;
    // CPU subgroups of a size already tried would give the same candidates.
    std::vector<std::uint64_t> tried;
    for (std::size_t c = 0; c < n; ++c) {
      if (on_gpu[c]) continue;
      const std::uint64_t size = search.sizes()[c];
      if (std::find(tried.begin(), tried.end(), size) != tried.end()) continue;
      tried.push_back(size);
      // c added at any place, or in place of any GPU subgroup, there or at either end
      for (std::size_t at = 0; at <= start.size(); ++at) {
        std::vector<std::size_t> candidate = start;
        candidate.insert(candidate.begin() + static_cast<std::ptrdiff_t>(at), c);
        search.consider_indices(candidate);
      }
      for (std::size_t j = 0; j < start.size(); ++j) {
        std::vector<std::size_t> candidate = start;
        candidate[j] = c;
        search.consider_indices(candidate);
        candidate.erase(candidate.begin() + static_cast<std::ptrdiff_t>(j));
        candidate.insert(candidate.begin(), c);
        search.consider_indices(candidate);
        candidate.erase(candidate.begin());
        candidate.push_back(c);
        search.consider_indices(candidate);
      }
    }
    for (std::size_t j = 0; j < start.size(); ++j) {
      std::vector<std::size_t> candidate = start;
      candidate.erase(candidate.begin() + static_cast<std::ptrdiff_t>(j));
      search.consider_indices(candidate);
    }
    const std::vector<std::size_t> order = search.best().gpu_order;
    const std::size_t g = order.size();
    for (std::size_t i = 0; i < g; ++i) {
      for (std::size_t j = i + 1; j < g; ++j) {
        if (search.sizes()[order[i]] == search.sizes()[order[j]]) continue;  // the same order
        std::vector<std::size_t> candidate = order;
        std::swap(candidate[i], candidate[j]);
        search.consider_indices(candidate);
        candidate = order;
        const std::size_t moved = candidate[i];
        candidate.erase(candidate.begin() + static_cast<std::ptrdiff_t>(i));
        candidate.insert(candidate.begin() + static_cast<std::ptrdiff_t>(j), moved);
        search.consider_indices(candidate);
        candidate = order;
        const std::size_t back = candidate[j];
        candidate.erase(candidate.begin() + static_cast<std::ptrdiff_t>(j));
        candidate.insert(candidate.begin() + static_cast<std::ptrdiff_t>(i), back);
        search.consider_indices(candidate);
      }
    }
    if (search.best().gpu_order == start) return;
  }
}

}  // namespace

Plan plan(const Workload& workload, const Rates& rates, const PlannerOptions& options) {
  validate(workload);
  Search search(workload, rates, options);
  const std::vector<SizeClass> classes = size_classes(workload.subgroup_params);
  if (classes.empty() ||
      !search.fits_one_buffer(workload.footprint.resident_bytes(classes.front().size),
                              classes.front().size)) {
    Plan all_cpu = all_cpu_plan(workload, rates);  // not even the smallest subgroup fits
    all_cpu.optimal = true;
    return all_cpu;
  }

  // How many GPU multisets, and how many (multiset, order) pairs, an exact search takes.
  const double set_cap = static_cast<double>(options.exact_set_limit) + 1;
  double sets = 1;
  for (const SizeClass& c : classes) {
    sets = std::min(set_cap, sets * static_cast<double>(c.members.size() + 1));
  }
  bool exact = false;
  if (sets <= static_cast<double>(options.exact_set_limit)) {
    const double order_cap = static_cast<double>(options.exact_order_limit) + 1;
    double orders = 0;
    std::vector<std::size_t> counts(classes.size(), 0);
    std::vector<std::size_t> limits;
    limits.reserve(classes.size());
    for (const SizeClass& c : classes) limits.push_back(c.members.size());
    while (next_counts(counts, limits) && orders < order_cap) {
      orders += distinct_orders(counts, order_cap);
    }
    exact = orders <= static_cast<double>(options.exact_order_limit);
    search_classes(search, classes, exact);
  } else {
    search_windows(search);
  }
  // The published interleavings, so that the plan is never predicted slower than one of them.
  for (std::size_t k = 1; k <= workload.subgroup_params.size(); ++k) {
    search.consider_indices(interleaved_gpu_subgroups(workload.subgroup_params.size(), k));
  }
  if (!exact) improve(search);

  Placement placement;
  placement.gpu_order = search.best().gpu_order;
  placement.buffers = search.best().buffers;
  Plan result = evaluate(workload, rates, placement);
  result.optimal = exact;
  return result;
}

std::optional<Plan> plan_for_order(const Workload& workload, const Rates& rates,
                                   const std::vector<std::size_t>& gpu_order,
                                   const PlannerOptions& options) {
  // Validates the workload and the order (indices, repeats) before anything indexes with them.
  Plan plan = evaluate(workload, rates, Placement{gpu_order, 1});
  if (gpu_order.empty()) return plan;
  std::vector<std::uint64_t> sizes;
  std::uint64_t largest = 0;
  for (std::size_t i : gpu_order) {
    sizes.push_back(workload.subgroup_params[i]);
    largest = std::max(largest, workload.subgroup_params[i]);
  }
  const std::size_t dmax =
      max_buffers(workload, options, sizes.size(), plan.resident_bytes, largest);
  const PerformanceModel model(rates, workload.footprint);
  std::vector<double> scratch;
  const double cpu_params = static_cast<double>(plan.cpu_params);
  Timing t = time_of(model, scratch, sizes, static_cast<double>(plan.gpu_params), cpu_params, dmax);
  if (t.buffers == 0) return std::nullopt;
  if (t.buffers > 1) {
    t.buffers = fewest_buffers(model, scratch, sizes, static_cast<double>(plan.gpu_params),
                               cpu_params, dmax);
  }
  return evaluate(workload, rates, Placement{gpu_order, t.buffers});
}

}  // namespace tide::planner

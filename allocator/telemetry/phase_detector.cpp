#include "allocator/telemetry/phase_detector.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tide::allocator::telemetry {
namespace {

// The curve as a step function: sample i holds from its time until the next sample's.
// Cell averages over a uniform grid of `points` cells spanning the samples.
std::vector<double> resample(std::span<const Sample> samples, std::size_t points, double* dt_out) {
  const double t0 = static_cast<double>(samples.front().t_ns);
  const double t1 = static_cast<double>(samples.back().t_ns);
  const double dt = (t1 - t0) / static_cast<double>(points);
  *dt_out = dt;
  std::vector<double> grid(points, 0.0);
  const std::size_t n = samples.size();
  std::size_t j = 0;  // the sample holding at `pos`
  for (std::size_t c = 0; c < points; ++c) {
    const double lo = t0 + dt * static_cast<double>(c);
    const double hi = lo + dt;
    double pos = lo;
    double acc = 0;
    while (j + 1 < n && static_cast<double>(samples[j + 1].t_ns) <= pos) ++j;
    while (pos < hi) {
      const double next = j + 1 < n ? static_cast<double>(samples[j + 1].t_ns) : hi;
      const double end = std::min(hi, next);
      acc += static_cast<double>(samples[j].live) * (end - pos);
      pos = end;
      if (j + 1 < n && pos >= next) {
        ++j;
      } else if (pos < hi) {
        break;
      }
    }
    grid[c] = acc / dt;
  }
  return grid;
}

// Normalised autocorrelation for lags 0..max_lag.
std::vector<double> autocorrelation(const std::vector<double>& x, std::size_t max_lag) {
  double mean = 0;
  for (double v : x) mean += v;
  mean /= static_cast<double>(x.size());
  std::vector<double> c(x.size());
  double var = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    c[i] = x[i] - mean;
    var += c[i] * c[i];
  }
  std::vector<double> r(max_lag + 1, 0.0);
  if (var <= 0) return r;
  const double n = static_cast<double>(x.size());
  for (std::size_t k = 0; k <= max_lag; ++k) {
    double acc = 0;
    for (std::size_t i = 0; i + k < c.size(); ++i) acc += c[i] * c[i + k];
    // Unbiased: a long lag overlaps fewer points.
    r[k] = acc / var * n / (n - static_cast<double>(k));
  }
  return r;
}

// The lag of the curve's period in grid cells (with a parabolic refinement), or 0.
double period_lag(const std::vector<double>& r, const DetectorOptions& options) {
  std::size_t k = 1;
  while (k < r.size() && r[k] > 0) ++k;  // past the first zero crossing
  double best = -1;
  for (std::size_t j = k + 1; j + 1 < r.size(); ++j) {
    if (r[j] >= r[j - 1] && r[j] >= r[j + 1]) best = std::max(best, r[j]);
  }
  if (best < options.min_correlation) return 0;
  // The smallest lag whose peak is close to the best: a multiple of the period correlates
  // about as well as the period itself, so the first one is the period.
  for (std::size_t j = k + 1; j + 1 < r.size(); ++j) {
    if (r[j] >= r[j - 1] && r[j] >= r[j + 1] && r[j] >= 0.8 * best) {
      const double a = r[j - 1];
      const double b = r[j];
      const double c = r[j + 1];
      const double denom = a - 2 * b + c;
      const double shift = denom < 0 ? 0.5 * (a - c) / denom : 0.0;
      return static_cast<double>(j) + std::clamp(shift, -0.5, 0.5);
    }
  }
  return 0;
}

std::size_t first_at_or_after(std::span<const Sample> s, std::uint64_t t) {
  return static_cast<std::size_t>(
      std::lower_bound(s.begin(), s.end(), t,
                       [](const Sample& a, std::uint64_t v) { return a.t_ns < v; }) -
      s.begin());
}

// The value holding at time t (the last sample at or before t).
std::uint64_t value_at(std::span<const Sample> s, std::uint64_t t) {
  std::size_t i = first_at_or_after(s, t);
  if (i < s.size() && s[i].t_ns == t) return s[i].live;
  return i == 0 ? s.front().live : s[i - 1].live;
}

// The start of the climb out of the minimum within [lo, hi]: the first sample after the last one
// at the minimum's level (an update phase may dip to that level before the iteration ends, so
// the last visit, not the first, is the boundary). Returns false if the window has no samples.
bool climb_start(std::span<const Sample> s, std::uint64_t lo, std::uint64_t hi,
                 std::uint64_t tolerance, std::uint64_t* out) {
  const std::size_t a = first_at_or_after(s, lo);
  const std::size_t b = first_at_or_after(s, hi + 1);
  if (a >= b) return false;
  std::uint64_t vmin = std::numeric_limits<std::uint64_t>::max();
  for (std::size_t i = a; i < b; ++i) vmin = std::min(vmin, s[i].live);
  std::size_t last = a;
  for (std::size_t i = a; i < b; ++i) {
    if (s[i].live <= vmin + tolerance) last = i;
  }
  *out = last + 1 < s.size() ? s[last + 1].t_ns : s[last].t_ns;
  return true;
}

}  // namespace

std::uint64_t estimate_period(std::span<const Sample> samples, const DetectorOptions& options) {
  if (samples.size() < 16 || samples.back().t_ns <= samples.front().t_ns) return 0;
  double dt = 0;
  const std::vector<double> grid = resample(samples, options.grid_points, &dt);
  const std::size_t max_lag =
      options.grid_points / static_cast<std::size_t>(std::max(2, options.min_iterations));
  const std::vector<double> r = autocorrelation(grid, max_lag);
  const double lag = period_lag(r, options);
  return lag > 0 ? static_cast<std::uint64_t>(lag * dt) : 0;
}

std::vector<std::uint64_t> detect_boundaries(std::span<const Sample> samples,
                                             const DetectorOptions& options) {
  std::vector<std::uint64_t> boundaries;
  if (samples.size() < 16 || samples.back().t_ns <= samples.front().t_ns) return boundaries;
  double dt = 0;
  const std::vector<double> grid = resample(samples, options.grid_points, &dt);
  const std::size_t max_lag =
      options.grid_points / static_cast<std::size_t>(std::max(2, options.min_iterations));
  const std::vector<double> r = autocorrelation(grid, max_lag);
  const double lag = period_lag(r, options);
  if (lag <= 0) return boundaries;
  const double period = lag * dt;

  // Where in the period the minimum falls: fold the grid over the period and average.
  const auto cells = static_cast<std::size_t>(std::lround(lag));
  std::vector<double> fold(cells, 0.0);
  std::vector<int> counts(cells, 0);
  for (std::size_t c = 0; c < grid.size(); ++c) {
    const auto p = static_cast<std::size_t>(std::fmod(static_cast<double>(c), lag)) % cells;
    fold[p] += grid[c];
    ++counts[p];
  }
  std::size_t phase = 0;
  for (std::size_t p = 0; p < cells; ++p) {
    fold[p] /= std::max(1, counts[p]);
    if (fold[p] < fold[phase]) phase = p;
  }

  const std::uint64_t t0 = samples.front().t_ns;
  const std::uint64_t t1 = samples.back().t_ns;
  double expected = static_cast<double>(t0) + (static_cast<double>(phase) + 0.5) * dt;
  while (expected <= static_cast<double>(t1)) {
    const double half = 0.3 * period;
    const auto lo = static_cast<std::uint64_t>(std::max(static_cast<double>(t0), expected - half));
    const auto hi = static_cast<std::uint64_t>(std::min(static_cast<double>(t1), expected + half));
    const std::size_t a = first_at_or_after(samples, lo);
    const std::size_t b = first_at_or_after(
        samples, static_cast<std::uint64_t>(std::min(static_cast<double>(t1), expected + period)));
    std::uint64_t vmin = std::numeric_limits<std::uint64_t>::max();
    std::uint64_t vmax = 0;
    for (std::size_t i = a; i < b; ++i) {
      vmin = std::min(vmin, samples[i].live);
      vmax = std::max(vmax, samples[i].live);
    }
    // The floor between iterations is flat; what rises above it by 0.25% of the swing climbs.
    const std::uint64_t tolerance = vmax > vmin ? (vmax - vmin) / 400 : 0;
    std::uint64_t boundary = 0;
    if (climb_start(samples, lo, hi, tolerance, &boundary) &&
        (boundaries.empty() || boundary > boundaries.back())) {
      boundaries.push_back(boundary);
      expected = static_cast<double>(boundary) + period;
    } else {
      expected += period;
    }
  }
  return boundaries;
}

PhaseSplit split_phases(std::span<const Sample> samples, std::uint64_t start_ns,
                        std::uint64_t end_ns) {
  PhaseSplit split{end_ns, end_ns};
  const std::size_t a = first_at_or_after(samples, start_ns);
  const std::size_t b = first_at_or_after(samples, end_ns);
  if (a >= b) return split;
  std::size_t peak = a;
  for (std::size_t i = a; i < b; ++i) {
    if (samples[i].live > samples[peak].live) peak = i;
  }
  split.backward_start_ns = samples[peak].t_ns;
  std::uint64_t floor_end = samples[peak].live;
  for (std::size_t i = peak; i < b; ++i) floor_end = std::min(floor_end, samples[i].live);
  const std::uint64_t range = samples[peak].live - floor_end;
  if (range == 0) return split;
  const std::uint64_t tolerance = range / 50;
  // The first time the curve gets down to the iteration's floor, and the fall that gets it there
  // (zero_grad freeing the gradients one by one, the update's last buffers before them): the
  // update ends with that fall, whatever the next iteration's start adds after it.
  std::size_t floor_at = peak;
  while (floor_at < b && samples[floor_at].live > floor_end + tolerance / 4) ++floor_at;
  std::size_t fall = floor_at;
  while (fall > peak + 1 && samples[fall - 1].live > samples[fall].live) --fall;
  // The floor the backward pass falls to before the update: the update starts where the fall
  // first gets there.
  std::uint64_t floor_update = floor_end;
  if (fall > peak + 1) {
    floor_update = samples[peak].live;
    for (std::size_t i = peak; i < fall; ++i)
      floor_update = std::min(floor_update, samples[i].live);
  }
  for (std::size_t i = peak; i < b; ++i) {
    if (samples[i].live <= floor_update + tolerance) {
      split.update_start_ns = samples[i].t_ns;
      break;
    }
  }
  return split;
}

IterationStats summarize_iteration(std::span<const Sample> samples, std::uint64_t start_ns,
                                   std::uint64_t end_ns, const IterationStats* marked) {
  IterationStats it;
  if (marked != nullptr) it = *marked;
  it.start_ns = start_ns;
  it.end_ns = end_ns;
  if (marked == nullptr || !marked->any_phase()) {
    const PhaseSplit split = split_phases(samples, start_ns, end_ns);
    it.phase_start_ns = {start_ns, split.backward_start_ns, split.update_start_ns};
    it.phase_seen = {true, true, true};
    it.detected = true;
    it.peak_live = {};
    it.peak_reserved = {};
    const std::uint64_t first = value_at(samples, start_ns);
    it.peak_live_all = first;
    it.min_live = first;
    const std::size_t a = first_at_or_after(samples, start_ns);
    const std::size_t b = first_at_or_after(samples, end_ns);
    // The value holding at the start belongs to the forward phase too.
    std::size_t i = a;
    auto phase_of = [&](std::uint64_t t) {
      int p = 0;
      for (int q = 0; q < kPhaseCount; ++q) {
        if (t >= it.phase_start_ns[q]) p = q;
      }
      return p;
    };
    const Sample held = a > 0 ? samples[a - 1] : samples.front();
    it.peak_live[0] = held.live;
    it.peak_reserved[0] = held.reserved;
    for (; i < b; ++i) {
      const Sample& s = samples[i];
      const int p = phase_of(s.t_ns);
      it.peak_live[p] = std::max(it.peak_live[p], s.live);
      it.peak_reserved[p] = std::max(it.peak_reserved[p], s.reserved);
      it.peak_live_all = std::max(it.peak_live_all, s.live);
      it.min_live = std::min(it.min_live, s.live);
    }
    // A phase's peak includes the value it starts at (what the previous phase left).
    for (int p = 1; p < kPhaseCount; ++p) {
      const std::uint64_t at_start = value_at(samples, it.phase_start_ns[p]);
      if (it.phase_start_ns[p] < end_ns) it.peak_live[p] = std::max(it.peak_live[p], at_start);
    }
  }
  return it;
}

std::vector<IterationStats> detect_iterations(std::span<const Sample> samples,
                                              const DetectorOptions& options) {
  std::vector<IterationStats> out;
  const std::vector<std::uint64_t> b = detect_boundaries(samples, options);
  for (std::size_t i = 0; i + 1 < b.size(); ++i) {
    IterationStats it = summarize_iteration(samples, b[i], b[i + 1]);
    it.index = i;
    it.detected = true;
    out.push_back(it);
  }
  return out;
}

}  // namespace tide::allocator::telemetry

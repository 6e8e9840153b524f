#include "interpose/allocator_telemetry.h"

#include <algorithm>
#include <mutex>
#include <sstream>
#include <string>

#include "allocator/telemetry/chrome_trace.h"
#include "allocator/telemetry/phase_detector.h"
#include "io/json_writer.h"
#include "io/safe_file.h"

namespace tide::interpose {
namespace {

// The allocator's forecast settings, as its own defaults use them: the largest update peak of the
// last 8 iterations, 5% of the limit kept as margin.
constexpr double kHeadroomMargin = 0.05;
constexpr int kHeadroomWindow = 8;

// How much of an existing file at a trace's path is read to recognise it as a trace.
constexpr std::size_t kRecognisedBytes = 256;

allocator::telemetry::Mark mark_of(Phase phase) {
  switch (phase) {
    case Phase::backward:
      return allocator::telemetry::Mark::kBackward;
    case Phase::update:
      return allocator::telemetry::Mark::kUpdate;
    default:
      return allocator::telemetry::Mark::kForward;
  }
}

io::json::Object phase_peaks_json(const std::uint64_t (&peaks)[kPhaseCount]) {
  io::json::Object out;
  for (std::size_t p = 0; p < kPhaseCount; ++p) {
    out.add_uint(phase_name(static_cast<Phase>(p)), peaks[p]);
  }
  return out;
}

std::string trace_path(const std::string& path, int device, int devices) {
  if (devices <= 1) return path;
  const std::string suffix = ".trace.json";
  const std::string base = path.size() > suffix.size() && path.compare(path.size() - suffix.size(),
                                                                       suffix.size(), suffix) == 0
                               ? path.substr(0, path.size() - suffix.size())
                               : path;
  return base + ".device" + std::to_string(device) + suffix;
}

}  // namespace

AllocatorTelemetry::AllocatorTelemetry(std::uint64_t limit_bytes) : limit_(limit_bytes) {}

AllocatorTelemetry::Device& AllocatorTelemetry::device(int index) {
  Device& d = devices_[index];
  if (!d.ready.load(std::memory_order_acquire)) {
    const std::lock_guard lock(create_lock_);
    if (!d.ready.load(std::memory_order_relaxed)) {
      // Every change is a sample (resolution 1 byte): driver-level changes are few and large.
      d.telemetry = std::make_unique<allocator::telemetry::Telemetry>(kSamplesPerDevice, 1);
      d.phase = Phase::unmarked;
      d.ready.store(true, std::memory_order_release);
      int seen = devices_seen_.load(std::memory_order_relaxed);
      while (seen < index + 1 && !devices_seen_.compare_exchange_weak(seen, index + 1)) {
      }
    }
  }
  return d;
}

template <typename Change>
void AllocatorTelemetry::apply(const MemoryEvent& event, Change&& change) {
  if (event.device < 0 || event.device >= kMaxDevices) return;
  Device& d = device(event.device);
  const std::uint64_t now = clock_.now();
  const std::lock_guard lock(d.lock);
  const Phase phase = phase_.load(std::memory_order_relaxed);
  if (phase != d.phase) mark_locked(d, phase, now);
  change(d, phase);
  d.telemetry->on_change(d.memory.live_bytes, d.memory.live_bytes, [now] { return now; });
}

void AllocatorTelemetry::on_alloc(const MemoryEvent& event) {
  apply(event, [&](Device& d, Phase phase) {
    DeviceMemory& m = d.memory;
    m.live_bytes += event.bytes;
    m.peak_bytes = std::max(m.peak_bytes, m.live_bytes);
    std::uint64_t& phase_peak = m.phase_peak_bytes[static_cast<std::size_t>(phase)];
    phase_peak = std::max(phase_peak, m.live_bytes);
    if (d.phase != Phase::unmarked) {
      allocator::telemetry::IterationStats& it = d.open;
      it.peak_live_all = std::max(it.peak_live_all, m.live_bytes);
      const int p = static_cast<int>(d.phase) - 1;
      it.peak_live[p] = std::max(it.peak_live[p], m.live_bytes);
      it.peak_reserved[p] = std::max(it.peak_reserved[p], m.live_bytes);
    }
  });
}

void AllocatorTelemetry::on_free(const MemoryEvent& event) {
  apply(event, [&](Device& d, Phase /*phase*/) {
    DeviceMemory& m = d.memory;
    m.live_bytes -= std::min(m.live_bytes, event.bytes);
    if (d.phase != Phase::unmarked) d.open.min_live = std::min(d.open.min_live, m.live_bytes);
  });
}

void AllocatorTelemetry::on_refused(const MemoryEvent& event) {
  if (event.device < 0 || event.device >= kMaxDevices) return;
  Device& d = device(event.device);
  const std::uint64_t now = clock_.now();
  const std::lock_guard lock(d.lock);
  if (d.refusals.size() >= kRefusalsKept) return;
  allocator::telemetry::OomRecord record;
  record.t_ns = now;
  record.requested = event.bytes;
  record.rounded = event.bytes;
  record.stream = event.stream;
  record.allocated = d.memory.live_bytes;
  record.reserved = d.memory.live_bytes;
  record.limit = limit_;
  record.device_total = d.total.load(std::memory_order_relaxed);
  record.limit_reached = true;
  d.refusals.push_back(record);
}

void AllocatorTelemetry::mark_phase(Phase phase) {
  if (phase == Phase::count || phase == Phase::unmarked) return;
  phase_.store(phase, std::memory_order_relaxed);
  // Devices with telemetry take the mark now (so a phase boundary is exact even if the device
  // is idle); a device that appears later takes it with its first event.
  const std::uint64_t now = clock_.now();
  for (int index = 0; index < devices_seen_.load(); ++index) {
    Device& d = devices_[index];
    if (!d.ready.load(std::memory_order_acquire)) continue;
    const std::lock_guard lock(d.lock);
    if (d.phase != phase) mark_locked(d, phase, now);
  }
}

void AllocatorTelemetry::mark_locked(Device& d, Phase phase, std::uint64_t now) {
  if (phase == Phase::unmarked) return;
  const std::uint64_t live = d.memory.live_bytes;
  // A new forward pass after a backward or update closes the iteration (the allocator's
  // telemetry counts iterations by their end marks).
  const bool new_iteration =
      d.phase == Phase::unmarked || (phase == Phase::forward && d.phase != Phase::forward);
  if (new_iteration && d.phase != Phase::unmarked) {
    d.telemetry->mark(allocator::telemetry::Mark::kIterationEnd, now, live, live);
    ++d.iterations_closed;
  }
  if (new_iteration) {
    d.open = allocator::telemetry::IterationStats{};
    d.open.index = d.iterations_closed;
    d.open.start_ns = now;
    d.open.peak_live_all = live;
    d.open.min_live = live;
  }
  d.telemetry->mark(mark_of(phase), now, live, live);
  const int p = static_cast<int>(phase) - 1;
  d.open.phase_seen[p] = true;
  d.open.phase_start_ns[p] = now;
  d.open.peak_live[p] = std::max(d.open.peak_live[p], live);
  d.open.peak_reserved[p] = std::max(d.open.peak_reserved[p], live);
  d.phase = phase;
  std::uint64_t& peak = d.memory.phase_peak_bytes[static_cast<std::size_t>(phase)];
  peak = std::max(peak, live);
}

void AllocatorTelemetry::note_device_total(int device, std::uint64_t total_bytes) {
  if (device < 0 || device >= kMaxDevices) return;
  devices_[device].total.store(total_bytes, std::memory_order_relaxed);
}

DeviceMemory AllocatorTelemetry::device_memory(int device) const {
  if (device < 0 || device >= kMaxDevices) return {};
  const Device& d = devices_[device];
  const std::lock_guard lock(d.lock);
  return d.memory;
}

int AllocatorTelemetry::devices_seen() const { return devices_seen_.load(); }

AllocatorTelemetry::Snapshot AllocatorTelemetry::snapshot(int index, double ns_per_tick) const {
  Snapshot s;
  const Device& d = devices_[index];
  if (!d.ready.load(std::memory_order_acquire)) return s;
  {
    const std::lock_guard lock(d.lock);
    s.samples = d.telemetry->samples();
    s.samples_dropped = d.telemetry->samples_dropped();
    s.marks = d.telemetry->marks();
    s.iterations = d.telemetry->marked_iterations();
    if (d.phase != Phase::unmarked) {
      s.iterations.push_back(d.open);  // the iteration in progress, up to now
      s.iterations.back().end_ns = clock_.now();
    }
    s.refusals = d.refusals;
    s.memory = d.memory;
  }
  auto ns = [&](std::uint64_t ticks) { return clock_.to_ns(ticks, ns_per_tick); };
  for (auto& sample : s.samples) sample.t_ns = ns(sample.t_ns);
  for (auto& mark : s.marks) mark.t_ns = ns(mark.t_ns);
  for (auto& refusal : s.refusals) refusal.t_ns = ns(refusal.t_ns);
  for (auto& it : s.iterations) {
    it.start_ns = ns(it.start_ns);
    it.end_ns = ns(it.end_ns);
    for (auto& start : it.phase_start_ns) start = ns(start);
  }
  // No marks: iterations and phases from the shape of the curve.
  if (s.iterations.empty()) {
    s.iterations = allocator::telemetry::detect_iterations(s.samples);
    s.detected = !s.iterations.empty();
  }
  std::uint64_t limit = d.total.load(std::memory_order_relaxed);
  if (limit_ != 0) limit = limit == 0 ? limit_ : std::min(limit, limit_);
  s.headroom = allocator::telemetry::forecast_headroom(s.iterations, limit, kHeadroomMargin,
                                                       kHeadroomWindow, s.memory.peak_bytes);
  return s;
}

std::string AllocatorTelemetry::report_json() const {
  const double scale = clock_.ns_per_tick();
  io::json::Array devices;
  std::uint64_t phase_peaks[kPhaseCount] = {};
  std::uint64_t samples = 0;
  std::uint64_t dropped = 0;
  std::uint64_t iterations_total = 0;
  bool any_detected = false;
  bool any_marked = false;
  for (int index = 0; index < devices_seen(); ++index) {
    const Snapshot s = snapshot(index, scale);
    samples += s.samples.size();
    dropped += s.samples_dropped;
    iterations_total += s.iterations.size();
    any_detected = any_detected || s.detected;
    any_marked = any_marked || (!s.detected && !s.iterations.empty());
    // Phase peaks: as tracked, or (unmarked trainers) the highest of the detected iterations.
    std::uint64_t peaks[kPhaseCount] = {};
    std::copy(std::begin(s.memory.phase_peak_bytes), std::end(s.memory.phase_peak_bytes), peaks);
    if (s.detected) {
      for (const auto& it : s.iterations) {
        for (int p = 0; p < allocator::telemetry::kPhaseCount; ++p) {
          std::uint64_t& peak = peaks[p + 1];  // allocator phases start at forward
          if (it.phase_seen[p]) peak = std::max(peak, it.peak_live[p]);
        }
      }
    }
    for (std::size_t p = 0; p < kPhaseCount; ++p)
      phase_peaks[p] = std::max(phase_peaks[p], peaks[p]);
    devices.add(io::json::Object()
                    .add_uint("device", static_cast<std::uint64_t>(index))
                    .add_uint("peak_bytes", s.memory.peak_bytes)
                    .add_uint("live_bytes_at_exit", s.memory.live_bytes)
                    .add("phase_peak_bytes", phase_peaks_json(peaks))
                    .add_uint("iterations", s.iterations.size())
                    .add_string("phases_from",
                                s.iterations.empty() ? "none" : (s.detected ? "detected" : "marks"))
                    .add_uint("limit_refusals", s.refusals.size())
                    .add("headroom_forecast",
                         io::json::Object()
                             .add_uint("headroom_bytes", s.headroom.headroom)
                             .add_uint("update_peak_bytes", s.headroom.update_peak)
                             .add_uint("limit_bytes", s.headroom.limit)
                             .add_uint("margin_bytes", s.headroom.margin)
                             .add_uint("iterations", static_cast<std::uint64_t>(
                                                         std::max(s.headroom.iterations, 0)))));
  }
  io::json::Object out;
  out.add("devices", devices);
  out.add("phases",
          io::json::Object()
              .add("peak_bytes", phase_peaks_json(phase_peaks))
              .add_string("from", any_marked ? "marks" : (any_detected ? "detected" : "none"))
              .add_uint("iterations", iterations_total));
  out.add("timeline", io::json::Object().add_uint("samples", samples).add_uint("dropped", dropped));
  return out.text();
}

bool AllocatorTelemetry::write_trace(const std::string& path, std::vector<std::string>* written,
                                     std::string* error) const {
  const double scale = clock_.ns_per_tick();
  const int devices = std::max(devices_seen(), 1);
  for (int index = 0; index < devices; ++index) {
    const Snapshot s = snapshot(index, scale);
    const std::string file = trace_path(path, index, devices);
    allocator::telemetry::TimelineExport data;
    data.device = index;
    data.samples = s.samples;
    data.iterations = s.iterations;
    data.marks = s.marks;
    data.ooms = s.refusals;
    data.headroom = s.headroom;
    std::ostringstream text;
    allocator::telemetry::write_chrome_trace(text, data);
    try {
      io::replace_file(file, text.str(), kRecognisedBytes, &allocator::telemetry::is_chrome_trace,
                       io::Folder::kMustExist);
    } catch (const io::FileError& e) {
      if (error != nullptr) *error = file + ": " + e.what();
      return false;
    }
    if (written != nullptr) written->push_back(file);
  }
  return true;
}

void AllocatorTelemetry::prepare_fork() {
  create_lock_.lock();
  for (Device& d : devices_) d.lock.lock();
}

void AllocatorTelemetry::parent_after_fork() {
  for (Device& d : devices_) d.lock.unlock();
  create_lock_.unlock();
}

void AllocatorTelemetry::child_after_fork() {
  for (Device& d : devices_) {
    if (d.ready.load(std::memory_order_relaxed)) d.telemetry->clear();
    d.memory = DeviceMemory{};
    d.phase = Phase::unmarked;
    d.open = allocator::telemetry::IterationStats{};
    d.iterations_closed = 0;
    d.refusals.clear();
    d.lock.unlock();
  }
  phase_.store(Phase::unmarked);
  clock_.restart();
  create_lock_.unlock();
}

}  // namespace tide::interpose

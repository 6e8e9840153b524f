#include "interpose/interposer.h"

#include <pthread.h>
#include <semaphore.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <utility>

#include "config/bytes.h"
#include "config/env.h"
#include "interpose/allocator_telemetry.h"
#include "interpose/bindings.h"
#include "interpose/counters.h"
#include "interpose/event_clock.h"
#include "interpose/thread_state.h"
#include "io/json_writer.h"
#include "io/safe_file.h"

namespace tide::interpose {
namespace {

Interposer* g_instance = nullptr;  // set once by get(), read by the fork and signal handlers

// The telemetry the hooks feed: the allocator's, behind the interposer's interface.
std::unique_ptr<MemoryTelemetry> make_telemetry(const Settings& settings) {
  return std::make_unique<AllocatorTelemetry>(settings.memory_limit);
}

void write_stderr(const std::string& text) {
  // write(2), not stdio: this may run while another thread holds stderr's lock.
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(STDERR_FILENO, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!raw.empty() && raw.back() == '\0') raw.pop_back();
  for (char& c : raw) {
    if (c == '\0') c = ' ';
  }
  return raw;
}

std::string trace_path_for(const std::string& report_path) {
  const std::string suffix = ".json";
  if (report_path.size() > suffix.size() &&
      report_path.compare(report_path.size() - suffix.size(), suffix.size(), suffix) == 0) {
    return report_path.substr(0, report_path.size() - suffix.size()) + ".trace.json";
  }
  return report_path + ".trace.json";
}

// A report is tide's own to replace when it starts as write_report starts it; this much of an
// existing file is read to tell.
constexpr std::string_view kReportHead = "{\"tide_report\": 1,";
constexpr std::size_t kRecognisedBytes = 256;
bool is_report(std::string_view head) { return head.starts_with(kReportHead); }

using config::format_bytes;

// ---- The report on a fatal signal -------------------------------------------------------------
//
// A signal handler cannot write the report itself (it allocates, and takes locks the interrupted
// thread may hold), so it wakes a reporter thread, waits for it (bounded), and then dies of the
// signal as it would have without tide. Only signals whose disposition was the default get a
// handler: a program's own handlers (Python's SIGINT) stay as they are.

sem_t g_report_request;
std::atomic<bool> g_report_done{false};
constexpr int kFatalSignals[] = {SIGTERM, SIGINT, SIGHUP};
constexpr int kReportWaitMs = 30000;

void on_fatal_signal(int signal) {
  const int saved_errno = errno;
  Interposer* ip = g_instance;
  if (ip != nullptr && !g_report_done.load()) {
    sem_post(&g_report_request);
    for (int waited = 0; waited < kReportWaitMs && !g_report_done.load(); waited += 10) {
      timespec ten_ms{0, 10000000};
      nanosleep(&ten_ms, nullptr);
    }
  }
  struct sigaction fallback {};
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  sigaction(signal, &fallback, nullptr);
  sigset_t unblock;
  sigemptyset(&unblock);
  sigaddset(&unblock, signal);
  pthread_sigmask(SIG_UNBLOCK, &unblock, nullptr);
  raise(signal);
  errno = saved_errno;
}

void install_signal_handlers() {
  for (const int signal : kFatalSignals) {
    struct sigaction current {};
    if (sigaction(signal, nullptr, &current) != 0) continue;
    const bool is_default = (current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == SIG_DFL;
    if (!is_default) continue;
    struct sigaction handler {};
    handler.sa_handler = &on_fatal_signal;
    sigemptyset(&handler.sa_mask);
    handler.sa_flags = SA_RESTART;
    sigaction(signal, &handler, nullptr);
  }
}

void* reporter_main(void* /*unused*/) {
  while (sem_wait(&g_report_request) != 0) {
    if (errno != EINTR) return nullptr;
  }
  if (g_instance != nullptr) g_instance->write_final_report();
  g_report_done.store(true);
  return nullptr;
}

void at_exit() {
  if (g_instance != nullptr) g_instance->write_final_report();
}

}  // namespace

Interposer* Interposer::instance_if_started() { return g_instance; }

Interposer& Interposer::get() {
  static Interposer* const instance = [] {
    Settings settings;
    try {
      settings = read_settings();
    } catch (const config::EnvError& e) {
      // Strict like every tide knob: a limit that silently did not apply would be worse.
      write_stderr(std::string("tide preload: ") + e.what() + "\n");
      std::_Exit(1);
    }
    auto telemetry = make_telemetry(settings);
    auto* ip = new Interposer(std::move(settings), std::move(telemetry));
    g_instance = ip;
    sem_init(&g_report_request, 0, 0);
    pthread_atfork(&Interposer::prepare_fork, &Interposer::parent_after_fork,
                   &Interposer::child_after_fork);
    std::atexit(&at_exit);
    install_signal_handlers();
    if (!ip->stacks().load_error().empty()) {
      write_stderr("tide preload: TIDE_STACKS is on but " + ip->stacks().load_error() + "\n");
    }
    return ip;
  }();
  return *instance;
}

Interposer::Interposer(Settings settings, std::unique_ptr<MemoryTelemetry> telemetry)
    : settings_(std::move(settings)),
      limit_(settings_.memory_limit),
      stacks_(settings_.stacks, settings_.stack_sample),
      telemetry_(std::move(telemetry)),
      start_ns_(monotonic_ns()) {}

void Interposer::count_call(Kind kind, bool ok, std::uint64_t bytes) {
  ThreadCounters::PerKind& c = ThreadCounters::mine().kinds[index(kind)];
  ThreadCounters::add(c.calls, 1);
  if (!ok) ThreadCounters::add(c.failures, 1);
  if (ok && bytes != 0) ThreadCounters::add(c.bytes, bytes);
}

void Interposer::count_limit_rejection(Kind origin, std::uint64_t bytes, int device,
                                       CUstream stream) {
  note_used();
  ThreadCounters& c = ThreadCounters::mine();
  ThreadCounters::add(c.limit_rejections, 1);
  ThreadCounters::add(c.limit_rejected_bytes, bytes);
  telemetry_->on_refused({0, bytes, device, stream, origin, 0});
}

void Interposer::count_mapping(int device, std::int64_t delta_bytes) {
  if (device < 0 || device >= kMaxDevices) return;
  const std::int64_t now =
      mapped_[device].fetch_add(delta_bytes, std::memory_order_relaxed) + delta_bytes;
  std::int64_t peak = mapped_peak_[device].load(std::memory_order_relaxed);
  while (now > peak &&
         !mapped_peak_[device].compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void Interposer::count_runtime_fallback() {
  ThreadCounters::add(ThreadCounters::mine().runtime_fallbacks, 1);
}

void Interposer::record_alloc(LiveAllocations& table, Kind origin, std::uint64_t key,
                              std::uint64_t bytes, int device, CUstream stream) {
  note_used();
  const std::uint32_t site = stacks_.capture();
  if (auto missed = table.insert(key, {bytes, device, site, origin})) {
    // The address was live already: its release escaped the hooks. Close it now.
    record_free(missed->api, *missed, key, nullptr);
  }
  stacks_.on_alloc(site, bytes);
  ThreadCounters& c = ThreadCounters::mine();
  ThreadCounters::add(c.allocations, 1);
  ThreadCounters::add(c.kinds[index(origin)].allocations, 1);
  ThreadCounters::add(c.kinds[index(origin)].allocated_bytes, bytes);
  ++thread_state().driver_records;
  telemetry_->on_alloc({key, bytes, device, stream, origin, site});
}

std::optional<Allocation> Interposer::take(LiveAllocations& table, std::uint64_t key) {
  return table.take(key);
}

void Interposer::record_free(Kind api, const Allocation& allocation, std::uint64_t key,
                             CUstream stream) {
  note_used();
  limit_.release(allocation.device, allocation.bytes);
  stacks_.on_free(allocation.site, allocation.bytes);
  ThreadCounters::add(ThreadCounters::mine().frees, 1);
  ++thread_state().driver_records;
  telemetry_->on_free({key, allocation.bytes, allocation.device, stream, api, allocation.site});
}

void Interposer::restore(LiveAllocations& table, std::uint64_t key, const Allocation& allocation) {
  table.insert(key, allocation);
}

void Interposer::note_used() {
  if (used_.load(std::memory_order_relaxed)) return;
  if (!used_.exchange(true)) start_reporter();
}

void Interposer::start_reporter() {
  // A child forked from a multi-threaded process should not start threads (POSIX allows only
  // async-signal-safe calls there; sanitizers refuse): a forked child reports at exit, not on a
  // signal.
  if (forked_child_.load()) return;
  const long pid = static_cast<long>(getpid());
  if (reporter_pid_.exchange(pid) == pid) return;
  g_report_done.store(false);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  // The reporter must never take a signal meant for the program.
  sigset_t all;
  sigset_t previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  pthread_t thread;
  if (pthread_create(&thread, &attr, &reporter_main, nullptr) != 0) reporter_pid_.store(0);
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  pthread_attr_destroy(&attr);
}

Interposer::Totals Interposer::totals() const {
  const Counters c = ThreadCounters::total();
  Totals t;
  t.allocations = c.allocations;
  t.frees = c.frees;
  t.limit_rejections = c.limit_rejections;
  for (std::size_t k = 0; k < kKindCount; ++k) {
    if (is_runtime(static_cast<Kind>(k))) t.runtime_allocations += c.kinds[k].allocations;
  }
  t.runtime_fallback_records = c.runtime_fallbacks;
  return t;
}

io::json::Object Interposer::report() const {
  const Counters counters = ThreadCounters::total();
  io::json::Object out;
  out.add_uint("tide_report", 1);  // first: is_report() knows a report by it
  out.add_uint("pid", static_cast<std::uint64_t>(getpid()));
  out.add_string("command", command_line());
  char duration[32];
  std::snprintf(duration, sizeof duration, "%.3f",
                static_cast<double>(monotonic_ns() - start_ns_) * 1e-9);
  out.add_raw("duration_s", duration);
  out.add_bool("stand_in_driver", bound_to_standin());
  out.add("settings", io::json::Object()
                          .add_uint("memory_limit_bytes", settings_.memory_limit)
                          .add_bool("stacks", settings_.stacks)
                          .add_uint("stack_sample", settings_.stack_sample));
  out.add("totals",
          io::json::Object()
              .add_uint("allocations", counters.allocations)
              .add_uint("frees", counters.frees)
              .add_uint("live_allocations_at_exit", allocations_.size() + physical_.size())
              .add_uint("limit_rejections", counters.limit_rejections)
              .add_uint("limit_rejected_bytes", counters.limit_rejected_bytes)
              .add_uint("runtime_fallback_records", counters.runtime_fallbacks)
              .add_uint("unbound_lookups", unbound_lookups()));

  io::json::Object entry_points;
  io::json::Object origins;
  for (std::size_t k = 0; k < kKindCount; ++k) {
    const Counters::PerKind& c = counters.kinds[k];
    const std::string_view kind = kind_name(static_cast<Kind>(k));
    if (c.calls != 0) {
      entry_points.add(kind, io::json::Object()
                                 .add_uint("calls", c.calls)
                                 .add_uint("failures", c.failures)
                                 .add_uint("bytes", c.bytes));
    }
    if (c.allocations != 0) {
      origins.add(kind, io::json::Object()
                            .add_uint("allocations", c.allocations)
                            .add_uint("bytes", c.allocated_bytes));
    }
  }
  out.add("entry_points", entry_points);
  out.add("allocations_by_origin", origins);

  io::json::Array mapped;
  for (int d = 0; d < telemetry_->devices_seen(); ++d) {
    mapped.add_uint(static_cast<std::uint64_t>(std::max<std::int64_t>(0, mapped_peak_[d].load())));
  }
  out.add("mapped_peak_bytes", mapped);
  out.add_raw("telemetry", telemetry_->report_json());
  out.add_raw("stacks", stacks_.report_json(20));
  return out;
}

bool Interposer::write_report(const std::string& path, std::string* error) {
  // Nothing but tide's own reports and traces is ever replaced, nor a FIFO or a device opened, and
  // a crash leaves the old file or the new one (io/safe_file.h). The report's path is checked
  // first: a path it may not take gets no traces either.
  try {
    io::check_replaceable(path, kRecognisedBytes, &is_report);
    std::vector<std::string> traces;
    if (!telemetry_->write_trace(trace_path_for(path), &traces, error)) return false;
    io::json::Object json = report();
    io::json::Array list;
    for (const std::string& trace : traces) list.add_string(trace);
    json.add("traces", list);
    io::replace_file(path, json.text() + "\n", kRecognisedBytes, &is_report,
                     io::Folder::kMustExist);
    return true;
  } catch (const std::exception& e) {
    // FileError, and whatever else may fail (memory, the filesystem): at exit, never an exception.
    if (error != nullptr) *error = path + ": " + e.what();
    return false;
  }
}

std::string Interposer::summary_line(const std::string& report_path) const {
  const bool standin = bound_to_standin();
  std::string line = "tide: device memory peak";
  const int devices = telemetry_->devices_seen();
  if (devices == 0) line += " 0 B";
  for (int d = 0; d < devices; ++d) {
    const DeviceMemory m = telemetry_->device_memory(d);
    line += (d > 0 ? "; " : " ") + format_bytes(m.peak_bytes) +
            (standin ? " on stand-in device " : " on device ") + std::to_string(d);
    std::string phases;
    for (Phase p : {Phase::forward, Phase::backward, Phase::update}) {
      const std::uint64_t peak = m.phase_peak_bytes[static_cast<std::size_t>(p)];
      if (peak == 0) continue;
      phases +=
          (phases.empty() ? "" : ", ") + std::string(phase_name(p)) + " " + format_bytes(peak);
    }
    if (!phases.empty()) line += " (" + phases + ")";
  }
  if (standin) line += " (tide's host stand-in driver: host memory, no GPU)";
  const Counters counters = ThreadCounters::total();
  line += ", " + std::to_string(counters.allocations) + " allocations";
  if (limit_.enabled()) {
    line += ", limit " + format_bytes(limit_.limit()) + " (" +
            std::to_string(counters.limit_rejections) + " refused)";
  }
  line += report_path.empty() ? "" : "; report: " + report_path;
  return line + "\n";
}

void Interposer::write_final_report() {
  if (!used_.load() || reported_.exchange(true)) return;
  std::string path;
  if (settings_.report_pattern) {
    path = expand_report_path(*settings_.report_pattern, static_cast<long>(getpid()));
    std::string error;
    if (!write_report(path, &error)) {
      write_stderr("tide preload: could not write the report: " + error + "\n");
      path.clear();
    }
  }
  write_stderr(summary_line(path));
}

void Interposer::prepare_fork() {
  Interposer* ip = g_instance;
  if (ip == nullptr) return;
  ip->stacks_.prepare_fork();
  ip->allocations_.prepare_fork();
  ip->physical_.prepare_fork();
  ip->mappings_.prepare_fork();
  ip->telemetry_->prepare_fork();
}

void Interposer::parent_after_fork() {
  Interposer* ip = g_instance;
  if (ip == nullptr) return;
  ip->telemetry_->parent_after_fork();
  ip->mappings_.parent_after_fork();
  ip->physical_.parent_after_fork();
  ip->allocations_.parent_after_fork();
  ip->stacks_.parent_after_fork();
}

void Interposer::child_after_fork() {
  Interposer* ip = g_instance;
  if (ip == nullptr) return;
  // The child shares none of the parent's device memory (CUDA state does not cross fork): it
  // starts from nothing, and reports only if it uses CUDA itself.
  ip->telemetry_->child_after_fork();
  ip->mappings_.child_after_fork();
  ip->physical_.child_after_fork();
  ip->allocations_.child_after_fork();
  ip->stacks_.child_after_fork();
  ip->limit_.reset();
  ThreadCounters::reset_all();
  for (auto& m : ip->mapped_) m.store(0);
  for (auto& m : ip->mapped_peak_) m.store(0);
  ip->used_.store(false);
  ip->reported_.store(false);
  ip->start_ns_ = monotonic_ns();
  // The reporter thread did not survive the fork, and the child starts none (start_reporter).
  ip->forked_child_.store(true);
  sem_destroy(&g_report_request);
  sem_init(&g_report_request, 0, 0);
  g_report_done.store(false);
}

}  // namespace tide::interpose

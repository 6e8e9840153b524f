#include "allocator/trace.h"

#include <fstream>
#include <istream>
#include <ostream>
#include <sstream>
#include <stdexcept>

namespace tide::allocator {
namespace {

[[noreturn]] void bad(const std::string& source, std::size_t line, const std::string& what) {
  throw std::invalid_argument(source + ":" + std::to_string(line) + ": " + what);
}

bool parse_mark(const std::string& word, Mark* out) {
  for (Mark m : {Mark::kForward, Mark::kBackward, Mark::kUpdate, Mark::kIterationEnd}) {
    if (word == mark_name(m)) {
      *out = m;
      return true;
    }
  }
  return false;
}

}  // namespace

void write_trace(std::ostream& out, const Trace& trace) {
  out << "tide-trace 1\n"
      << "# t_ns alloc <id> <bytes> <stream> | free <id> | record <id> <stream> | mark <phase>"
         " | empty\n"
      << "device " << trace.device << "\nlimit " << trace.limit << "\n";
  for (const TraceEvent& e : trace.events) {
    out << e.t_ns << ' ';
    switch (e.op) {
      case TraceOp::kAlloc:
        out << "alloc " << e.id << ' ' << e.bytes << ' ' << e.stream;
        break;
      case TraceOp::kFree:
        out << "free " << e.id;
        break;
      case TraceOp::kRecordStream:
        out << "record " << e.id << ' ' << e.stream;
        break;
      case TraceOp::kMark:
        out << "mark " << mark_name(e.mark);
        break;
      case TraceOp::kEmptyCache:
        out << "empty";
        break;
    }
    out << '\n';
  }
}

Trace read_trace(std::istream& in, const std::string& source) {
  Trace trace;
  std::string line;
  std::size_t number = 0;
  bool header = false;
  std::uint64_t last_t = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    std::string first;
    words >> first;
    if (!header) {
      int version = 0;
      if (first != "tide-trace" || !(words >> version) || version != 1) {
        bad(source, number, "not a tide allocation trace (expected 'tide-trace 1')");
      }
      header = true;
      continue;
    }
    if (first == "device") {
      if (!(words >> trace.device)) bad(source, number, "expected 'device <ordinal>'");
      continue;
    }
    if (first == "limit") {
      if (!(words >> trace.limit)) bad(source, number, "expected 'limit <bytes>'");
      continue;
    }
    TraceEvent e;
    try {
      std::size_t used = 0;
      e.t_ns = std::stoull(first, &used);
      if (used != first.size()) throw std::invalid_argument(first);
    } catch (const std::exception&) {
      bad(source, number, "expected a time in nanoseconds, found '" + first + "'");
    }
    if (e.t_ns < last_t) bad(source, number, "time goes backwards");
    last_t = e.t_ns;
    std::string op;
    words >> op;
    bool ok = true;
    if (op == "alloc") {
      e.op = TraceOp::kAlloc;
      ok = static_cast<bool>(words >> e.id >> e.bytes >> e.stream) && e.id != 0;
    } else if (op == "free") {
      e.op = TraceOp::kFree;
      ok = static_cast<bool>(words >> e.id) && e.id != 0;
    } else if (op == "record") {
      e.op = TraceOp::kRecordStream;
      ok = static_cast<bool>(words >> e.id >> e.stream) && e.id != 0;
    } else if (op == "mark") {
      e.op = TraceOp::kMark;
      std::string word;
      ok = static_cast<bool>(words >> word) && parse_mark(word, &e.mark);
    } else if (op == "empty") {
      e.op = TraceOp::kEmptyCache;
    } else {
      bad(source, number, "unknown event '" + op + "'");
    }
    std::string extra;
    if (!ok || (words >> extra)) bad(source, number, "malformed '" + op + "' event: " + line);
    trace.events.push_back(e);
  }
  if (!header) bad(source, number, "empty: no 'tide-trace 1' line");
  return trace;
}

void save_trace(const std::string& path, const Trace& trace) {
  std::ofstream out(path);
  if (!out) throw std::invalid_argument("cannot write the trace to " + path);
  write_trace(out, trace);
  out.flush();
  if (!out) throw std::runtime_error("writing the trace to " + path + " failed");
}

Trace load_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot read the trace " + path);
  return read_trace(in, path);
}

void TraceRecorder::start(std::uint64_t now_ns, std::size_t max_events, int device,
                          std::uint64_t limit) {
  active_ = true;
  t0_ = now_ns;
  max_events_ = max_events;
  next_id_ = 1;
  streams_.clear();
  streams_.push_back(nullptr);  // index 0: the default stream
  trace_ = Trace{};
  trace_.device = device;
  trace_.limit = limit;
}

std::uint32_t TraceRecorder::stream_index(CUstream stream) {
  for (std::size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i] == stream) return static_cast<std::uint32_t>(i);
  }
  streams_.push_back(stream);
  return static_cast<std::uint32_t>(streams_.size() - 1);
}

void TraceRecorder::push(const TraceEvent& event) {
  if (trace_.events.size() >= max_events_) {
    ++trace_.dropped;
    return;
  }
  trace_.events.push_back(event);
}

std::uint64_t TraceRecorder::alloc(std::uint64_t now_ns, std::uint64_t bytes, CUstream stream) {
  TraceEvent e;
  e.t_ns = since(now_ns);
  e.op = TraceOp::kAlloc;
  e.id = next_id_++;
  e.bytes = bytes;
  e.stream = stream_index(stream);
  push(e);
  return e.id;
}

void TraceRecorder::free(std::uint64_t now_ns, std::uint64_t id) {
  TraceEvent e;
  e.t_ns = since(now_ns);
  e.op = TraceOp::kFree;
  e.id = id;
  push(e);
}

void TraceRecorder::record_stream(std::uint64_t now_ns, std::uint64_t id, CUstream stream) {
  TraceEvent e;
  e.t_ns = since(now_ns);
  e.op = TraceOp::kRecordStream;
  e.id = id;
  e.stream = stream_index(stream);
  push(e);
}

void TraceRecorder::mark(std::uint64_t now_ns, Mark mark) {
  TraceEvent e;
  e.t_ns = since(now_ns);
  e.op = TraceOp::kMark;
  e.mark = mark;
  push(e);
}

void TraceRecorder::empty_cache(std::uint64_t now_ns) {
  TraceEvent e;
  e.t_ns = since(now_ns);
  e.op = TraceOp::kEmptyCache;
  push(e);
}

Trace TraceRecorder::stop() {
  active_ = false;
  Trace out = std::move(trace_);
  trace_ = Trace{};
  return out;
}

}  // namespace tide::allocator

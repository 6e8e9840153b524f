#include "allocator/telemetry/trace.h"

#include <charconv>
#include <fstream>
#include <istream>
#include <limits>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

namespace tide::allocator::telemetry {
namespace {

[[noreturn]] void bad(const std::string& source, std::size_t line, const std::string& what) {
  throw std::invalid_argument(source + ":" + std::to_string(line) + ": " + what);
}

std::string malformed(const std::string& op, const std::string& line) {
  std::string message = "malformed '";
  message += op;
  message += "' event: ";
  message += line;
  return message;
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
  // Ids allocated so far, and whether each is still live: an id names one allocation only.
  std::unordered_map<std::uint64_t, bool> live;
  while (std::getline(in, line)) {
    ++number;
    if (line.size() > kMaxTraceLine) bad(source, number, "line longer than 4096 characters");
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    std::string first;
    words >> first;
    if (!header) {
      std::string version;
      if (first != "tide-trace" || !(words >> version) || version != "1") {
        bad(source, number, "not a tide allocation trace (expected 'tide-trace 1')");
      }
      header = true;
      continue;
    }
    std::string op = first;  // the event's name, once read
    // One unsigned decimal field (no sign, no spaces inside), at most `max`.
    auto field = [&](const char* what, std::uint64_t max) {
      std::string word;
      if (!(words >> word)) bad(source, number, malformed(op, line));
      std::uint64_t value = 0;
      const auto [end, error] = std::from_chars(word.data(), word.data() + word.size(), value);
      if (error != std::errc() || end != word.data() + word.size() || value > max) {
        bad(source, number,
            std::string(what) + " '" + word + "' is not an integer from 0 to " +
                std::to_string(max));
      }
      return value;
    };
    auto end_of_line = [&](const std::string& keyword) {
      std::string extra;
      if (words >> extra) bad(source, number, malformed(keyword, line));
    };
    if (first == "device") {
      trace.device = static_cast<int>(field("device ordinal", kMaxTraceDevice));
      end_of_line(first);
      continue;
    }
    if (first == "limit") {
      trace.limit = field("limit", std::numeric_limits<std::uint64_t>::max());
      end_of_line(first);
      continue;
    }
    if (trace.events.size() >= kMaxTraceEvents) {
      bad(source, number, "more than " + std::to_string(kMaxTraceEvents) + " events");
    }
    TraceEvent e;
    {
      std::uint64_t t = 0;
      const auto [end, error] = std::from_chars(first.data(), first.data() + first.size(), t);
      if (error != std::errc() || end != first.data() + first.size()) {
        bad(source, number, "expected a time in nanoseconds, found '" + first + "'");
      }
      e.t_ns = t;
    }
    if (e.t_ns < last_t) bad(source, number, "time goes backwards");
    last_t = e.t_ns;
    op.clear();
    words >> op;
    constexpr std::uint64_t kAnyId = std::numeric_limits<std::uint64_t>::max();
    auto id_field = [&] {
      const std::uint64_t id = field("id", kAnyId);
      if (id == 0) bad(source, number, "id 0: ids start at 1");
      return id;
    };
    if (op == "alloc") {
      e.op = TraceOp::kAlloc;
      e.id = id_field();
      e.bytes = field("bytes", kMaxTraceBytes);
      e.stream = static_cast<std::uint32_t>(field("stream", kMaxTraceStreams));
      end_of_line(op);
      if (!live.emplace(e.id, true).second) {
        bad(source, number,
            "id " + std::to_string(e.id) +
                " allocated again (ids name one "
                "allocation each)");
      }
    } else if (op == "free" || op == "record") {
      e.op = op == "free" ? TraceOp::kFree : TraceOp::kRecordStream;
      e.id = id_field();
      if (e.op == TraceOp::kRecordStream) {
        e.stream = static_cast<std::uint32_t>(field("stream", kMaxTraceStreams));
      }
      end_of_line(op);
      const auto it = live.find(e.id);
      if (it == live.end() || !it->second) {
        bad(source, number,
            op + " of id " + std::to_string(e.id) +
                (it == live.end() ? ", which was never allocated" : ", which was freed already"));
      }
      if (e.op == TraceOp::kFree) it->second = false;
    } else if (op == "mark") {
      e.op = TraceOp::kMark;
      std::string word;
      if (!(words >> word) || !parse_mark(word, &e.mark)) {
        bad(source, number, "malformed 'mark' event: " + line);
      }
      end_of_line(op);
    } else if (op == "empty") {
      e.op = TraceOp::kEmptyCache;
      end_of_line(op);
    } else {
      bad(source, number, "unknown event '" + op + "'");
    }
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

}  // namespace tide::allocator::telemetry

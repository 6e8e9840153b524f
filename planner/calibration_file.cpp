#include "planner/calibration_file.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <ctime>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <span>
#include <sstream>
#include <system_error>
#include <thread>
#include <utility>

#include "config/env.h"
#include "io/json.h"
#include "io/json_writer.h"
#include "io/safe_file.h"

namespace tide::planner {
namespace {

namespace json = io::json;
using io::FileError;

constexpr std::size_t kMaxFileBytes = 1 << 20;  // a calibration is a few hundred bytes

class Reader {
 public:
  explicit Reader(std::string_view origin) : origin_(origin) {}

  [[noreturn]] void fail(std::string_view where, const std::string& what) const {
    std::string message = "calibration " + std::string(origin_) + ": ";
    if (!where.empty()) message += std::string(where) + ": ";
    throw CalibrationError(message + what);
  }

  const json::Value& object(const json::Value& value, std::string_view where) const {
    if (value.kind() != json::Value::Kind::object) {
      fail(where, std::string("must be an object, not ") + json::kind_name(value.kind()));
    }
    return value;
  }

  // Rejects members outside `known`: a misspelt rate must not fall back to a default unnoticed.
  void only(const json::Value& object, std::string_view where,
            std::initializer_list<std::string_view> known) const {
    only(object, where, std::span<const std::string_view>(known.begin(), known.size()));
  }
  void only(const json::Value& object, std::string_view where,
            std::span<const std::string_view> known) const {
    for (const auto& [key, value] : object.members()) {
      bool ok = false;
      for (std::string_view k : known) ok = ok || key == k;
      if (!ok) {
        std::string message = "unknown member \"" + key + "\" (expected: ";
        bool first = true;
        for (std::string_view k : known) {
          if (!first) message += ", ";
          message += k;
          first = false;
        }
        fail(where, message + ")");
      }
    }
  }

  const json::Value* member(const json::Value& object, std::string_view prefix,
                            std::string_view key, bool required) const {
    const json::Value* value = object.find(key);
    if (value == nullptr && required) fail(path(prefix, key), "missing");
    return value;
  }

  std::string string(const json::Value& object, std::string_view prefix, std::string_view key,
                     bool required) const {
    const json::Value* value = member(object, prefix, key, required);
    if (value == nullptr) return {};
    if (value->kind() != json::Value::Kind::string) {
      fail(path(prefix, key),
           std::string("must be a string, not ") + json::kind_name(value->kind()));
    }
    return value->string();
  }

  // A whole number in [min, max]; `fallback` when optional and absent.
  double integer(const json::Value& object, std::string_view prefix, std::string_view key,
                 bool required, double min, double max, double fallback) const {
    const json::Value* value = member(object, prefix, key, required);
    if (value == nullptr) return fallback;
    if (value->kind() != json::Value::Kind::number ||
        value->number() != std::floor(value->number()) || value->number() < min ||
        value->number() > max) {
      std::ostringstream range;
      range << "must be a whole number from " << json::number(min) << " to " << json::number(max);
      fail(path(prefix, key), range.str());
    }
    return value->number();
  }

  static std::string path(std::string_view prefix, std::string_view key) {
    return prefix.empty() ? std::string(key) : std::string(prefix) + "." + std::string(key);
  }

 private:
  std::string_view origin_;
};

// A factors member (`name`: cpu_update_factors or cpu_update_contended_factors), if present:
// one number per format, each within kMinCpuUpdateFactor..kMaxCpuUpdateFactor.
void read_factors(const Reader& reader, const json::Value& root, std::string_view name,
                  std::array<double, kUpdateFormatCount>& out) {
  const json::Value* factors = reader.member(root, "", name, false);
  if (factors == nullptr) return;
  reader.object(*factors, name);
  std::array<std::string_view, kUpdateFormatCount> keys;
  for (const UpdateFormatInfo& f : kUpdateFormats) keys[static_cast<std::size_t>(f.format)] = f.key;
  reader.only(*factors, name, keys);
  for (const auto& [key, value] : factors->members()) {
    const UpdateFormatInfo* info = nullptr;
    for (const UpdateFormatInfo& f : kUpdateFormats) {
      if (key == f.key) info = &f;
    }
    if (value.kind() != json::Value::Kind::number || !plausible_cpu_update_factor(value.number())) {
      std::ostringstream range;
      range << "must be a number from " << json::number(kMinCpuUpdateFactor) << " to "
            << json::number(kMaxCpuUpdateFactor)
            << " (the format's CPU update rate over fp32 state's)";
      reader.fail(Reader::path(name, key), range.str());
    }
    out[static_cast<std::size_t>(info->format)] = value.number();
  }
}

void write_factors(std::ostringstream& out, std::string_view name,
                   const std::array<double, kUpdateFormatCount>& factors) {
  bool first = true;
  for (const UpdateFormatInfo& f : kUpdateFormats) {
    const double factor = factors[static_cast<std::size_t>(f.format)];
    if (factor == 0) continue;
    if (!plausible_cpu_update_factor(factor)) {
      throw CalibrationError("calibration: " + std::string(name) + "." + std::string(f.key) + ": " +
                             json::number(factor) + " is not a number from " +
                             json::number(kMinCpuUpdateFactor) + " to " +
                             json::number(kMaxCpuUpdateFactor));
    }
    out << (first ? ",\n  " + json::quote(name) + ": {\n" : std::string(",\n")) << "    "
        << json::quote(f.key) << ": " << json::number(factor);
    first = false;
  }
  if (!first) out << "\n  }";
}

}  // namespace

Calibration parse_calibration(std::string_view text, std::string_view origin) {
  const Reader reader(origin);
  json::Value root;
  try {
    root = json::parse(text);
  } catch (const json::ParseError& e) {
    reader.fail("", std::string("not valid JSON: ") + e.what());
  }
  reader.object(root, "the top level");
  reader.only(root, "the top level",
              {"format", "version", "measured_at", "machine", "rates", "ranks",
               "cpu_update_factors", "cpu_update_contended_factors"});
  if (reader.string(root, "", "format", true) != kCalibrationFormat) {
    reader.fail("format", "must be \"" + std::string(kCalibrationFormat) + "\"");
  }
  const json::Value* version = reader.member(root, "", "version", true);
  if (version->kind() != json::Value::Kind::number || version->number() != kCalibrationVersion) {
    reader.fail("version", "this tide reads version " + std::to_string(kCalibrationVersion) +
                               " (measure again with `tide calibrate`)");
  }

  Calibration calibration;
  calibration.measured_at = reader.string(root, "", "measured_at", false);

  const json::Value& machine = reader.object(*reader.member(root, "", "machine", true), "machine");
  reader.only(
      machine, "machine",
      {"hostname", "cpu_model", "cpu_threads", "gpu_name", "gpu_memory_bytes", "ranks_per_host"});
  MachineInfo& m = calibration.machine;
  m.hostname = reader.string(machine, "machine", "hostname", true);
  m.cpu_model = reader.string(machine, "machine", "cpu_model", false);
  m.cpu_threads =
      static_cast<int>(reader.integer(machine, "machine", "cpu_threads", true, 1, 1 << 20, 0));
  m.gpu_name = reader.string(machine, "machine", "gpu_name", false);
  m.gpu_memory_bytes = static_cast<std::uint64_t>(
      reader.integer(machine, "machine", "gpu_memory_bytes", false, 0, 9.0e15, 0));
  m.ranks_per_host =
      static_cast<int>(reader.integer(machine, "machine", "ranks_per_host", false, 1, 4096, 1));

  const json::Value& rates = reader.object(*reader.member(root, "", "rates", true), "rates");
  for (const RateInfo& info : rate_infos()) {
    const std::string where = Reader::path("rates", info.key);
    const json::Value* value = rates.find(info.key);
    if (value == nullptr && info.optional_in_file) {
      // A file from before this rate: the built-in default stands in for it.
      calibration.rates.*info.member = builtin_rates().*info.member;
      calibration.rate_missing[static_cast<std::size_t>(info.kind)] = true;
      continue;
    }
    if (value == nullptr) reader.fail(where, "missing");
    if (value->kind() != json::Value::Kind::number || !(value->number() > 0)) {
      reader.fail(where, "must be a number > 0 (" +
                             std::string(info.scale == 1.0 ? "params/s" : "bytes/s") + ")");
    }
    calibration.rates.*info.member = value->number();
  }
  for (const auto& [key, value] : rates.members()) {
    bool known = false;
    for (const RateInfo& info : rate_infos()) known = known || key == info.key;
    if (!known) reader.fail("rates", "unknown member \"" + key + "\"");
  }
  if (const json::Value* ranks = reader.member(root, "", "ranks", false)) {
    if (ranks->kind() != json::Value::Kind::array ||
        ranks->items().size() != static_cast<std::size_t>(m.ranks_per_host)) {
      reader.fail("ranks", "must be an array of machine.ranks_per_host (" +
                               std::to_string(m.ranks_per_host) + ") objects");
    }
    for (std::size_t i = 0; i < ranks->items().size(); ++i) {
      const std::string where = "ranks[" + std::to_string(i) + "]";
      const json::Value& rank = reader.object(ranks->items()[i], where);
      reader.only(rank, where, {"cpu_update_params_per_s", "memory_bytes_per_s"});
      RankRates r;
      for (auto [key, out] : {std::pair{"cpu_update_params_per_s", &r.cpu_update},
                              std::pair{"memory_bytes_per_s", &r.memory}}) {
        const json::Value* value = reader.member(rank, where, key, true);
        if (value->kind() != json::Value::Kind::number || !(value->number() > 0) ||
            !std::isfinite(value->number())) {
          reader.fail(Reader::path(where, key), "must be a number > 0");
        }
        *out = value->number();
      }
      calibration.ranks.push_back(r);
    }
  }
  read_factors(reader, root, "cpu_update_factors", calibration.cpu_update_factors.factor);
  read_factors(reader, root, "cpu_update_contended_factors",
               calibration.cpu_update_factors.contended);
  return calibration;
}

std::string format_calibration(const Calibration& c) {
  validate(c.rates, "calibration");
  if (c.machine.cpu_threads < 1 || c.machine.ranks_per_host < 1) {
    throw CalibrationError(
        "calibration: machine.cpu_threads and machine.ranks_per_host must be >= 1");
  }
  std::ostringstream out;
  out << "{\n  \"format\": " << json::quote(kCalibrationFormat)
      << ",\n  \"version\": " << kCalibrationVersion << ",\n";
  if (!c.measured_at.empty()) out << "  \"measured_at\": " << json::quote(c.measured_at) << ",\n";
  out << "  \"machine\": {\n    \"hostname\": " << json::quote(c.machine.hostname);
  if (!c.machine.cpu_model.empty()) {
    out << ",\n    \"cpu_model\": " << json::quote(c.machine.cpu_model);
  }
  out << ",\n    \"cpu_threads\": " << c.machine.cpu_threads;
  if (!c.machine.gpu_name.empty())
    out << ",\n    \"gpu_name\": " << json::quote(c.machine.gpu_name);
  if (c.machine.gpu_memory_bytes != 0) {
    out << ",\n    \"gpu_memory_bytes\": " << c.machine.gpu_memory_bytes;
  }
  out << ",\n    \"ranks_per_host\": " << c.machine.ranks_per_host << "\n  },\n  \"rates\": {\n";
  bool first = true;
  for (const RateInfo& info : rate_infos()) {
    out << (first ? "" : ",\n") << "    " << json::quote(info.key) << ": "
        << json::number(c.rates.*info.member);
    first = false;
  }
  out << "\n  }";
  if (!c.ranks.empty()) {
    if (c.ranks.size() != static_cast<std::size_t>(c.machine.ranks_per_host)) {
      throw CalibrationError("calibration: ranks must have machine.ranks_per_host entries");
    }
    out << ",\n  \"ranks\": [";
    for (std::size_t i = 0; i < c.ranks.size(); ++i) {
      const RankRates& r = c.ranks[i];
      if (!(r.cpu_update > 0) || !(r.memory > 0) || !std::isfinite(r.cpu_update) ||
          !std::isfinite(r.memory)) {
        throw CalibrationError("calibration: ranks[" + std::to_string(i) +
                               "]: rates must be finite numbers > 0");
      }
      out << (i ? ",\n" : "\n")
          << "    {\"cpu_update_params_per_s\": " << json::number(r.cpu_update)
          << ", \"memory_bytes_per_s\": " << json::number(r.memory) << "}";
    }
    out << "\n  ]";
  }
  write_factors(out, "cpu_update_factors", c.cpu_update_factors.factor);
  write_factors(out, "cpu_update_contended_factors", c.cpu_update_factors.contended);
  out << "\n}\n";
  return out.str();
}

Calibration load_calibration(const std::filesystem::path& path) {
  std::string text;
  try {
    text = io::read_regular_file(path, kMaxFileBytes);
  } catch (const FileError& e) {
    throw CalibrationError("calibration " + path.string() + ": " + e.what());
  }
  return parse_calibration(text, path.string());
}

namespace {

// A calibration file is tide's own to replace: one that names the format.
bool is_calibration(std::string_view text) {
  return text.find("\"" + std::string(kCalibrationFormat) + "\"") != std::string_view::npos;
}

}  // namespace

void save_calibration(const std::filesystem::path& path, const Calibration& calibration) {
  try {
    io::replace_file(path, format_calibration(calibration), kMaxFileBytes, &is_calibration);
  } catch (const FileError& e) {
    throw CalibrationError("calibration " + path.string() + ": " + e.what());
  }
}

void check_calibration_path(const std::filesystem::path& path) {
  try {
    io::check_replaceable(path, kMaxFileBytes, &is_calibration);
  } catch (const FileError& e) {
    throw CalibrationError("calibration " + path.string() + ": " + e.what());
  }
}

std::filesystem::path default_calibration_path() {
  if (auto file = config::env_text("TIDE_CALIBRATION_FILE")) return *file;
  if (auto cache = config::env_text("XDG_CACHE_HOME");
      cache && !cache->empty() && cache->front() == '/') {
    return std::filesystem::path(*cache) / "tide" / "calibration.json";
  }
  if (auto home = config::env_text("HOME")) {
    return std::filesystem::path(*home) / ".cache" / "tide" / "calibration.json";
  }
  throw CalibrationError(
      "no calibration file path: set TIDE_CALIBRATION_FILE (or HOME or XDG_CACHE_HOME)");
}

MachineInfo this_machine() {
  MachineInfo m;
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0) m.hostname = host;
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) {
        auto begin = line.find_first_not_of(" \t", colon + 1);
        if (begin != std::string::npos) m.cpu_model = line.substr(begin);
      }
      break;
    }
  }
  m.cpu_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return m;
}

std::string utc_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buffer;
}

}  // namespace tide::planner

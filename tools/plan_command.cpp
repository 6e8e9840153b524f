// `tide plan`: the plan tide's scheduler makes for a described workload and machine, with the
// model's prediction against all-CPU and against the fixed interleavings.
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "config/env.h"
#include "config/node.h"
#include "io/json_writer.h"
#include "planner/interleave.h"
#include "planner/iteration_model.h"
#include "planner/node_rates.h"
#include "planner/plan_format.h"
#include "planner/planner.h"
#include "planner/rate_sources.h"
#include "planner/units.h"
#include "tools/command.h"
#include "tools/plan_residency.h"

namespace tide::tools {
namespace {

using namespace tide::planner;
namespace json = io::json;

constexpr const char* kUsage = R"(usage: tide plan --params N --free-memory SIZE [options]

The scheduler's plan for one rank's update phase: which optimizer subgroups the GPU updates and
which the CPU does, with the performance model's predicted times.

workload:
  --params N               parameters of the model (e.g. 20e9, 20B)
  --ranks N                ranks (GPUs) the parameters are divided over (default 1)
  --ranks-per-node N       of them, ranks on one node, sharing its CPU update rate and host
                           memory bandwidth (default: all of --ranks, one node)
  --subgroup-params N      parameters per subgroup (default 1e8); at most 2048 subgroups per
                           rank
  --free-memory SIZE       GPU memory free in the update phase, per rank: a size (48GB, 40GiB)
                           or a percentage of --gpu-memory (60%)
  --gpu-memory SIZE        the GPU's memory (shown, and the base of a percentage)
  --held-memory SIZE       GPU memory free through the whole iteration, forward and backward
                           included, per rank (a size, or a percentage of --gpu-memory; at
                           most --free-memory): placement auto keeps the state of as many
                           subgroups resident in it as fit (TIDE_RESIDENCY), and the plan is
                           made around them where the model predicts it no slower (default:
                           none resident)
  --gradients gpu|host     where GPU subgroups' gradients are: kept on the GPU (default; memory)
                           or in pinned host memory (copied in with the state)
  --gradient-bytes N       bytes per gradient element (default 2, bf16)
  --state-dtype float32|bfloat16|q8
                           the moments' dtype: float32 (default; 12 state bytes per parameter:
                           fp32 p, m, v), bfloat16 (8: fp32 p, bf16 m, v) or q8 (6: fp32 p,
                           8-bit block-wise m, v, and 8 bytes of scales per 256); the update
                           rates are fp32 state's: the GPU's scales with the bytes an update
                           moves, the CPU's by the factor `tide calibrate` measured for the
                           format (the calibration file's cpu_update_factors), else by the
                           bytes too, except q8's (compute-bound: x0.35)
  --master-dtype float32|bfloat16
                           the master weights: float32 (default: an fp32 copy, and the
                           update writes a separate bf16 weight copy) or bfloat16 (bf16
                           weights with a bf16 compensation: the same state bytes, but a GPU
                           subgroup takes its 2 weight bytes from the model's parameters on
                           the GPU instead of copying them in, and an update writes no
                           weight copy); bfloat16 needs --state-dtype float32 or bfloat16
  --state-bytes N          optimizer state bytes per parameter, instead of --state-dtype's
  --max-buffers N          at most N GPU buffers in flight (default: as many as fit and help)

rates (per rank): built-in defaults, then the calibration file, then TIDE_RATE_* variables, then
these flags. The CPU update rates of the first two are shared out to --ranks-per-node ranks from
the ranks they were measured with (the file's ranks_per_host; built-in: 4): x measured/planned,
and so are the host memory rates.
  --calibration FILE       the calibration file (default: TIDE_CALIBRATION_FILE, else
                           $XDG_CACHE_HOME/tide/calibration.json or ~/.cache/tide/calibration.json,
                           if it exists)
  --cpu-update R           CPU update, params/s (e.g. 2.2e9)
  --cpu-update-contended R CPU update while copies run, params/s
  --h2d-gbps R             host to GPU copy alone, GB/s
  --d2h-gbps R             GPU to host copy alone, GB/s
  --h2d-duplex-gbps R      host to GPU while GPU to host also runs, GB/s
  --d2h-duplex-gbps R      GPU to host while host to GPU also runs, GB/s
  --gpu-update R           GPU update, params/s
  --host-memory-gbps R     host memory bandwidth, the CPU update alone, GB/s
  --host-memory-contended-gbps R
                           host memory bandwidth, the CPU update and copies in both directions
                           together, GB/s

the whole iteration (optional; both or neither of the first two):
  --forward-seconds S      the forward pass's GPU compute per iteration, seconds
  --backward-seconds S     the backward pass's GPU compute per iteration, seconds
  --layers N               layers the backward pass produces gradients by (default 32)
  --gradient-offload async|blocking
                           gradients copied to host memory as each layer's are ready (default;
                           tide) or all after the backward pass, waited for (ZeRO-Offload)

output:
  --json                   one JSON object instead of the table
  --max-k N                fixed interleavings to compare, K = 1..N (default 8)
)";

// Flags and their values, each given at most once, as --flag VALUE or --flag=VALUE.
class Arguments {
 public:
  Arguments(int argc, char** argv, const std::vector<std::string_view>& with_value,
            const std::vector<std::string_view>& switches) {
    for (int i = 1; i < argc; ++i) {
      std::string_view arg = argv[i];
      std::string name(arg);
      std::optional<std::string> value;
      if (const auto eq = arg.find('='); arg.starts_with("--") && eq != std::string_view::npos) {
        name = std::string(arg.substr(0, eq));
        value = std::string(arg.substr(eq + 1));
      }
      const bool takes_value = contains(with_value, name);
      if (!takes_value && !contains(switches, name)) {
        throw std::invalid_argument("unknown argument '" + std::string(arg) +
                                    "' (tide plan --help lists the options)");
      }
      if (values_.count(name) != 0) throw std::invalid_argument(name + " is given twice");
      if (!takes_value) {
        if (value) throw std::invalid_argument(name + " takes no value");
        values_[name] = "";
        continue;
      }
      if (!value) {
        if (i + 1 >= argc) throw std::invalid_argument(name + " needs a value");
        value = argv[++i];
      }
      if (value->empty()) throw std::invalid_argument(name + " needs a value, not \"\"");
      values_[name] = *value;
    }
  }

  bool has(const std::string& name) const { return values_.count(name) != 0; }
  std::optional<std::string> get(const std::string& name) const {
    auto it = values_.find(name);
    if (it == values_.end()) return std::nullopt;
    return it->second;
  }

 private:
  static bool contains(const std::vector<std::string_view>& names, const std::string& name) {
    for (std::string_view n : names) {
      if (n == name) return true;
    }
    return false;
  }
  std::map<std::string, std::string> values_;
};

constexpr std::uint64_t kMaxSubgroups = 2048;  // per rank

struct Setting {
  std::uint64_t params = 0;
  std::uint64_t ranks = 1;
  std::uint64_t ranks_per_node = 0;  // 0: not given (all of ranks)
  std::uint64_t params_per_rank = 0;
  std::uint64_t subgroup_params = 100'000'000;
  std::uint64_t gpu_memory = 0;  // 0: not given
  std::size_t max_k = 8;
};

// Each state format's CPU update factor against fp32 state's, and where it comes from: the
// calibration file, or the model (the bytes, or q8's constant) for `base`'s gradients and
// weights.
struct FormatFactor {
  const UpdateFormatInfo* info;
  double factor;
  bool calibrated;
};
std::vector<FormatFactor> format_factors(const ResolvedRates& resolved, const Footprint& base) {
  const CpuUpdateFactors measured = resolved.cpu_update_factors();
  std::vector<FormatFactor> out;
  for (const UpdateFormatInfo& info : kUpdateFormats) {
    const bool calibrated = measured.measured(info.format);
    out.push_back(
        {&info,
         calibrated ? measured[info.format] : base.in_format(info.format).model_cpu_update_scale(),
         calibrated});
  }
  return out;
}

const char* factor_source(bool calibrated) { return calibrated ? "calibration file" : "model"; }

std::string rates_json(const ResolvedRates& resolved, const Footprint& base) {
  std::string out = "{";
  for (const RateInfo& info : rate_infos()) {
    out += json::quote(info.key) + ":" + json::number(resolved.rates.*info.member) + ",";
  }
  out += "\"sources\":{";
  for (const RateInfo& info : rate_infos()) {
    out += json::quote(info.key) + ":" +
           json::quote(source_name(resolved.source[static_cast<std::size_t>(info.kind)])) +
           (&info == &rate_infos().back() ? "" : ",");
  }
  out += "},\"cpu_update_factors\":{";
  bool first = true;
  for (const FormatFactor& f : format_factors(resolved, base)) {
    out += std::string(first ? "" : ",") + json::quote(f.info->key) +
           ":{\"factor\":" + json::number(f.factor) +
           ",\"source\":" + json::quote(factor_source(f.calibrated)) + "}";
    first = false;
  }
  out += "}";
  if (resolved.calibration_path) {
    out += ",\"calibration_file\":" + json::quote(resolved.calibration_path->string());
  }
  return out + "}";
}

void print_rates(const ResolvedRates& resolved, const Footprint& base) {
  std::printf("rates (per rank)\n");
  for (const RateInfo& info : rate_infos()) {
    const RateSource source = resolved.source[static_cast<std::size_t>(info.kind)];
    std::string origin = source_name(source);
    if (source == RateSource::environment) origin += " (" + std::string(info.knob) + ")";
    if (source == RateSource::given) origin += " (" + std::string(info.flag) + ")";
    std::printf("  %-36s %18s   %s\n", std::string(info.description).c_str(),
                format_rate(info.kind, resolved.rates.*info.member).c_str(), origin.c_str());
  }
  if (resolved.calibration_path) {
    const Calibration& c = *resolved.calibration;
    std::printf("  calibration file %s: measured on %s (%d CPU threads%s%s)%s%s\n",
                resolved.calibration_path->string().c_str(), c.machine.hostname.c_str(),
                c.machine.cpu_threads, c.machine.gpu_name.empty() ? "" : ", ",
                c.machine.gpu_name.c_str(), c.measured_at.empty() ? "" : " at ",
                c.measured_at.c_str());
  }
  std::printf("  CPU update by state format, x the CPU update rates above (fp32 state's):\n");
  for (const FormatFactor& f : format_factors(resolved, base)) {
    char factor[32];
    std::snprintf(factor, sizeof factor, "x%.3g", f.factor);
    std::printf("    %-34s %18s   %s\n", std::string(f.info->description).c_str(), factor,
                f.calibrated ? "calibration file (measured)"
                             : (f.info->format == UpdateFormat::q8_moments
                                    ? "model (compute-bound: a constant)"
                                    : "model (the bytes an update moves)"));
  }
  bool any_builtin = false;
  for (RateSource s : resolved.source) any_builtin = any_builtin || s == RateSource::builtin;
  if (any_builtin) {
    std::printf(
        "  built-in defaults are for an H100-class node with 4 ranks per host, not measured "
        "here;\n  run `tide calibrate` to measure this machine\n");
  }
}

// The whole iteration under the model: forward and backward passes (planner/iteration_model.h;
// the gradients of the plan's GPU subgroups stay on the GPU when it keeps them there) and the
// plan's update phase.
struct Iteration {
  double forward_s = 0, backward_s = 0;
  std::size_t layers = 32;
  bool blocking = false;
  double predicted_forward = 0, predicted_backward = 0, predicted_update = 0;

  void predict(const Workload& workload, const Rates& rates, const Plan& plan) {
    const bool kept = workload.footprint.gradients_on_gpu && !blocking;
    const std::vector<std::uint64_t> bytes = host_gradient_bytes(
        workload.subgroup_params, layers, workload.footprint.gradient_bytes_per_param,
        kept ? plan.gpu_order : std::vector<std::size_t>{});
    std::vector<LayerTimes> times(layers);
    for (std::size_t l = 0; l < layers; ++l) {
      times[l] = {forward_s / static_cast<double>(layers), backward_s / static_cast<double>(layers),
                  bytes[l]};
    }
    predicted_forward = predict_forward(times);
    predicted_backward = predict_backward(times, rates.d2h, blocking);
    predicted_update = plan.predicted.phase_s;
  }
  double total() const { return predicted_forward + predicted_backward + predicted_update; }
  std::string json() const {
    return "{\"forward_s\":" + json::number(predicted_forward) +
           ",\"backward_s\":" + json::number(predicted_backward) +
           ",\"update_s\":" + json::number(predicted_update) +
           ",\"iteration_s\":" + json::number(total()) + ",\"layers\":" + std::to_string(layers) +
           ",\"gradient_offload\":" + json::quote(blocking ? "blocking" : "async") + "}";
  }
  std::string line() const {
    char out[320];
    std::snprintf(out, sizeof out,
                  "iteration        forward %.3f s + backward %.3f s (gradients %s, %zu layers) + "
                  "update %.3f s = %.3f s predicted\n",
                  predicted_forward, predicted_backward,
                  blocking ? "copied after the backward pass" : "offloaded as they are ready",
                  layers, predicted_update, total());
    return out;
  }
};

// Per-rank and node figures: every rank of the node runs the same plan at once, each with its
// share of the CPU update rate.
struct NodeFigures {
  std::uint64_t ranks;
  int measured_ranks;
  std::uint64_t params_per_rank;
  Rates rates;
  Plan plan;

  double per_rank() const { return static_cast<double>(params_per_rank) / plan.predicted.phase_s; }
  double all_cpu_per_rank() const {
    return static_cast<double>(params_per_rank) / plan.predicted.all_cpu_s;
  }
  std::string json() const {
    const auto n = static_cast<double>(ranks);
    return "{\"ranks_per_node\":" + std::to_string(ranks) +
           ",\"rates_measured_with_ranks\":" + std::to_string(measured_ranks) +
           ",\"cpu_update_per_rank\":" + json::number(rates.cpu_update) +
           ",\"cpu_update_node\":" + json::number(n * rates.cpu_update) +
           ",\"params_per_s_per_rank\":" + json::number(per_rank()) +
           ",\"params_per_s_node\":" + json::number(n * per_rank()) +
           ",\"all_cpu_params_per_s_node\":" + json::number(n * all_cpu_per_rank()) + "}";
  }
  std::string lines() const {
    const auto n = static_cast<double>(ranks);
    char out[512];
    std::snprintf(out, sizeof out,
                  "node             %llu rank%s at once (CPU rates measured with %d, x%.3g): CPU "
                  "update %s per rank, %s for the node\n"
                  "                 update %s per rank, %s for the node (all-CPU %s)\n",
                  static_cast<unsigned long long>(ranks), ranks == 1 ? "" : "s", measured_ranks,
                  static_cast<double>(measured_ranks) / n,
                  format_rate(RateKind::cpu_update, rates.cpu_update).c_str(),
                  format_rate(RateKind::cpu_update, n * rates.cpu_update).c_str(),
                  format_rate(RateKind::cpu_update, per_rank()).c_str(),
                  format_rate(RateKind::cpu_update, n * per_rank()).c_str(),
                  format_rate(RateKind::cpu_update, n * all_cpu_per_rank()).c_str());
    return out;
  }
};

}  // namespace

int plan_command(int argc, char** argv) {
  std::vector<std::string_view> with_value = {"--params",          "--ranks",
                                              "--subgroup-params", "--free-memory",
                                              "--gpu-memory",      "--gradients",
                                              "--held-memory",     "--gradient-bytes",
                                              "--state-bytes",     "--max-buffers",
                                              "--calibration",     "--max-k",
                                              "--forward-seconds", "--backward-seconds",
                                              "--layers",          "--gradient-offload",
                                              "--state-dtype",     "--master-dtype"};
  for (const RateInfo& info : rate_infos()) with_value.push_back(info.flag);
  with_value.push_back("--ranks-per-node");
  const Arguments args(argc, argv, with_value, {"--json", "--help", "-h"});
  if (args.has("--help") || args.has("-h")) {
    std::fputs(kUsage, stdout);
    return 0;
  }

  Setting setting;
  const auto params = args.get("--params");
  if (!params) throw std::invalid_argument("--params is required (e.g. --params 20e9)");
  setting.params = parse_count("--params", *params, 1);
  if (auto v = args.get("--ranks")) {
    setting.ranks = static_cast<std::uint64_t>(config::parse_int("--ranks", *v, 1, 1 << 20));
  }
  setting.ranks_per_node = setting.ranks;
  if (auto v = args.get("--ranks-per-node")) {
    setting.ranks_per_node = static_cast<std::uint64_t>(
        config::parse_int("--ranks-per-node", *v, 1, config::kMaxLocalRanks));
    if (setting.ranks_per_node > setting.ranks) {
      throw std::invalid_argument("--ranks-per-node " + *v + " is more than --ranks " +
                                  std::to_string(setting.ranks));
    }
  }
  if (auto v = args.get("--subgroup-params")) {
    setting.subgroup_params = parse_count("--subgroup-params", *v, 1);
  }
  if (auto v = args.get("--gpu-memory"))
    setting.gpu_memory = config::parse_bytes("--gpu-memory", *v);
  if (auto v = args.get("--max-k")) {
    setting.max_k = static_cast<std::size_t>(config::parse_int("--max-k", *v, 0, 1000));
  }
  // The slowest rank sets the phase: plan for the one with the most parameters.
  setting.params_per_rank = (setting.params + setting.ranks - 1) / setting.ranks;

  // A size, or a percentage of --gpu-memory.
  auto memory = [&](const std::string& flag, const std::string& value) -> std::uint64_t {
    if (!value.ends_with('%')) return config::parse_bytes(flag, value);
    const double percent =
        config::parse_double(flag, std::string_view(value).substr(0, value.size() - 1), 0, 100);
    if (setting.gpu_memory == 0)
      throw std::invalid_argument(flag + " " + value + " needs --gpu-memory");
    return static_cast<std::uint64_t>(static_cast<double>(setting.gpu_memory) * percent / 100.0);
  };
  Workload workload;
  const auto free_memory = args.get("--free-memory");
  if (!free_memory) {
    throw std::invalid_argument(
        "--free-memory is required: the GPU memory free in the update phase, per rank (e.g. "
        "--free-memory 48GB, or --gpu-memory 80GB --free-memory 60%)");
  }
  workload.headroom_bytes = memory("--free-memory", *free_memory);
  if (setting.gpu_memory != 0 && workload.headroom_bytes > setting.gpu_memory) {
    throw std::invalid_argument("--free-memory " + *free_memory + " is more than --gpu-memory " +
                                *args.get("--gpu-memory"));
  }
  std::optional<std::uint64_t> held_memory;
  if (auto v = args.get("--held-memory")) {
    held_memory = memory("--held-memory", *v);
    // What stays free through the whole iteration is free in its update phase too.
    if (*held_memory > workload.headroom_bytes) {
      throw std::invalid_argument("--held-memory " + *v + " is more than --free-memory " +
                                  *free_memory);
    }
  }
  if (auto v = args.get("--gradients")) {
    workload.footprint.gradients_on_gpu =
        config::parse_choice("--gradients", *v, {"gpu", "host"}) == 0;
  }
  if (auto v = args.get("--gradient-bytes")) {
    workload.footprint.gradient_bytes_per_param =
        static_cast<std::uint32_t>(config::parse_int("--gradient-bytes", *v, 0, 64));
  }
  if (auto v = args.get("--state-dtype")) {
    // fp32 master weights and two moments of 4, 2 or 1 bytes (q8: and their block scales).
    constexpr std::uint32_t kStateBytes[] = {12, 8, 6};
    const std::size_t choice =
        config::parse_choice("--state-dtype", *v, {"float32", "bfloat16", "q8"});
    workload.footprint.state_bytes_per_param = kStateBytes[choice];
    workload.footprint.quantized_moments = choice == 2;
  }
  if (auto v = args.get("--master-dtype")) {
    if (config::parse_choice("--master-dtype", *v, {"float32", "bfloat16"}) == 1) {
      if (args.get("--state-dtype") == std::optional<std::string>("q8")) {
        throw std::invalid_argument(
            "--master-dtype bfloat16 needs --state-dtype float32 or bfloat16 (no 8-bit moments)");
      }
      // bf16 weights and their compensation take the fp32 master's 4 bytes; the weights come
      // from the model's parameters on the GPU, and no weight copy is written.
      workload.footprint.weights_in_state = true;
      workload.footprint.state_bytes_on_gpu = 2;
    }
  }
  if (auto v = args.get("--state-bytes")) {
    workload.footprint.state_bytes_per_param =
        static_cast<std::uint32_t>(config::parse_int("--state-bytes", *v, 1, 64));
    workload.footprint.quantized_moments = false;  // a format of its own, memory-bound
  }
  workload.footprint.stage_low_precision_weights();
  PlannerOptions options;
  if (auto v = args.get("--max-buffers")) {
    options.max_buffers =
        static_cast<std::size_t>(config::parse_int("--max-buffers", *v, 1, 1 << 20));
  }
  // The planner's search grows faster than linearly with the subgroups: bounded so that tide
  // plan answers within a fraction of a second for any input it accepts.
  const std::uint64_t subgroups =
      (setting.params_per_rank + setting.subgroup_params - 1) / setting.subgroup_params;
  if (subgroups > kMaxSubgroups) {
    throw std::invalid_argument(
        "--params " + format_sci(static_cast<double>(setting.params)) + " in subgroups of " +
        format_sci(static_cast<double>(setting.subgroup_params)) + " makes " +
        format_sci(static_cast<double>(subgroups)) + " subgroups per rank; tide plan plans up to " +
        std::to_string(kMaxSubgroups) + ": give larger --subgroup-params or more --ranks");
  }
  for (std::uint64_t left = setting.params_per_rank; left > 0;) {
    const std::uint64_t s = std::min(left, setting.subgroup_params);
    workload.subgroup_params.push_back(s);
    left -= s;
  }

  // The whole iteration: the forward and backward passes' GPU compute, and how the gradients
  // reach host memory.
  std::optional<Iteration> iteration;
  if (args.has("--forward-seconds") != args.has("--backward-seconds")) {
    throw std::invalid_argument("--forward-seconds and --backward-seconds go together");
  }
  if (args.has("--forward-seconds")) {
    iteration.emplace();
    iteration->forward_s =
        config::parse_double("--forward-seconds", *args.get("--forward-seconds"), 0, 1e6);
    iteration->backward_s =
        config::parse_double("--backward-seconds", *args.get("--backward-seconds"), 0, 1e6);
    if (auto v = args.get("--layers")) {
      iteration->layers = static_cast<std::size_t>(config::parse_int("--layers", *v, 1, 100000));
    }
    if (auto v = args.get("--gradient-offload")) {
      iteration->blocking =
          config::parse_choice("--gradient-offload", *v, {"async", "blocking"}) == 1;
    }
    if (iteration->layers > setting.params_per_rank) {
      throw std::invalid_argument("--layers is more than the parameters per rank");
    }
  } else if (args.has("--layers") || args.has("--gradient-offload")) {
    throw std::invalid_argument(
        "--layers and --gradient-offload need --forward-seconds and --backward-seconds");
  }

  std::optional<std::filesystem::path> calibration;
  if (auto v = args.get("--calibration")) calibration = *v;
  // --ranks-per-node is bounded by kMaxLocalRanks, and defaults to --ranks only when that fits.
  if (setting.ranks_per_node > static_cast<std::uint64_t>(config::kMaxLocalRanks)) {
    throw std::invalid_argument("--ranks " + std::to_string(setting.ranks) +
                                " on one node: give --ranks-per-node (at most " +
                                std::to_string(config::kMaxLocalRanks) + ")");
  }
  const int measured_ranks = measured_ranks_per_host(resolve_rates(calibration));
  ResolvedRates resolved =
      share_for_node(resolve_rates(calibration), static_cast<int>(setting.ranks_per_node));
  for (const RateInfo& info : rate_infos()) {
    if (auto v = args.get(std::string(info.flag))) {
      resolved.rates.*info.member =
          config::parse_double(info.flag, *v, info.min_given, info.max_given) * info.scale;
      resolved.source[static_cast<std::size_t>(info.kind)] = RateSource::given;
    }
  }

  // The calibration's factor for the state format, if it measured it: it scales whatever fp32
  // CPU rate the sources above gave.
  workload.footprint.calibrate_cpu(resolved.cpu_update_factors());
  const Plan planned = plan(workload, resolved.rates, options);
  std::optional<PlanResidency> residency;
  if (held_memory) {
    residency = plan_residency(workload, resolved.rates, *held_memory, planned, options);
  }
  // The plan placement auto runs: around the resident subgroups where the model prefers them.
  const Plan best = residency && residency->chosen ? *residency->steady : planned;
  const std::size_t n = workload.subgroup_params.size();
  std::vector<std::pair<std::size_t, std::optional<Plan>>> fixed;
  for (std::size_t k = 1; k <= std::min(setting.max_k, n); ++k) {
    fixed.emplace_back(k, plan_interleaved(workload, resolved.rates, k, options));
  }
  const std::size_t rule_k =
      published_k(resolved.rates, workload.footprint, setting.subgroup_params);
  if (iteration) iteration->predict(workload, resolved.rates, best);
  const NodeFigures node{setting.ranks_per_node, measured_ranks, setting.params_per_rank,
                         resolved.rates, best};

  if (args.has("--json")) {
    std::string out = "{\"workload\":{\"params\":" + std::to_string(setting.params) +
                      ",\"ranks\":" + std::to_string(setting.ranks) +
                      ",\"params_per_rank\":" + std::to_string(setting.params_per_rank) +
                      ",\"subgroup_params\":" + std::to_string(setting.subgroup_params) +
                      ",\"subgroups\":" + std::to_string(n) +
                      ",\"headroom_bytes\":" + std::to_string(workload.headroom_bytes);
    if (setting.gpu_memory != 0)
      out += ",\"gpu_memory_bytes\":" + std::to_string(setting.gpu_memory);
    if (held_memory) out += ",\"held_bytes\":" + std::to_string(*held_memory);
    out +=
        ",\"state_bytes_per_param\":" + std::to_string(workload.footprint.state_bytes_per_param) +
        ",\"h2d_bytes_per_param\":" + std::to_string(workload.footprint.h2d_bytes_per_param()) +
        ",\"d2h_bytes_per_param\":" + std::to_string(workload.footprint.d2h_bytes_per_param()) +
        ",\"master\":" + json::quote(workload.footprint.weights_in_state ? "bfloat16" : "float32") +
        ",\"gradient_bytes_per_param\":" +
        std::to_string(workload.footprint.gradient_bytes_per_param) +
        ",\"gradients\":" + json::quote(workload.footprint.gradients_on_gpu ? "gpu" : "host") +
        ",\"cpu_update_scale\":" + json::number(workload.footprint.cpu_update_scale()) +
        ",\"cpu_update_scale_source\":" +
        json::quote(factor_source(workload.footprint.cpu_update_calibrated())) +
        ",\"cpu_update_contended_scale\":" +
        json::number(workload.footprint.cpu_update_contended_scale()) +
        ",\"gpu_update_scale\":" + json::number(workload.footprint.gpu_update_scale()) + "}";
    out += ",\"rates\":" + rates_json(resolved, workload.footprint);
    out += ",\"plan\":" + plan_json(best);
    if (residency) out += ",\"residency\":" + residency->json();
    out += ",\"fixed_k\":[";
    for (std::size_t i = 0; i < fixed.size(); ++i) {
      const auto& [k, p] = fixed[i];
      out += std::string(i ? "," : "") + "{\"k\":" + std::to_string(k) +
             ",\"fits\":" + (p ? "true" : "false");
      if (p) {
        out += ",\"gpu_subgroups\":" + std::to_string(p->gpu_subgroups()) +
               ",\"buffers\":" + std::to_string(p->buffers) +
               ",\"phase_s\":" + json::number(p->predicted.phase_s);
      }
      out += "}";
    }
    out += "],\"published_k\":" + std::to_string(rule_k);
    if (iteration) out += ",\"iteration\":" + iteration->json();
    out += ",\"node\":" + node.json();
    out += "}\n";
    std::fputs(out.c_str(), stdout);
    return 0;
  }

  std::printf(
      "workload         %s parameters over %llu rank%s: %s per rank, %zu subgroup%s of "
      "%s\n",
      format_sci(static_cast<double>(setting.params)).c_str(),
      static_cast<unsigned long long>(setting.ranks), setting.ranks == 1 ? "" : "s",
      format_sci(static_cast<double>(setting.params_per_rank)).c_str(), n, n == 1 ? "" : "s",
      format_sci(static_cast<double>(setting.subgroup_params)).c_str());
  std::printf("headroom         %s per rank free in the update phase%s%s%s\n",
              format_gb(static_cast<double>(workload.headroom_bytes)).c_str(),
              setting.gpu_memory ? " (of " : "",
              setting.gpu_memory ? format_gb(static_cast<double>(setting.gpu_memory)).c_str() : "",
              setting.gpu_memory ? ")" : "");
  if (held_memory) {
    std::printf("held             %s per rank free through the whole iteration (resident state)\n",
                format_gb(static_cast<double>(*held_memory)).c_str());
  }
  if (workload.footprint.state_bytes_on_gpu != 0) {
    std::printf(
        "per parameter    %u state bytes (bf16 master weights and compensation, moments): "
        "%u copied in (the weights from the model on the GPU), %u out; %u gradient bytes %s\n",
        workload.footprint.state_bytes_per_param,
        workload.footprint.state_bytes_per_param - workload.footprint.state_bytes_on_gpu,
        workload.footprint.state_bytes_per_param, workload.footprint.gradient_bytes_per_param,
        workload.footprint.gradients_on_gpu ? "kept on the GPU" : "copied in from host");
  } else {
    std::printf("per parameter    %.4g state bytes each way%s; %u gradient bytes %s\n",
                workload.footprint.state_copy_bytes_per_param(),
                workload.footprint.quantized_moments ? " (6 and the block scales)" : "",
                workload.footprint.gradient_bytes_per_param,
                workload.footprint.gradients_on_gpu ? "kept on the GPU" : "copied in from host");
  }
  const double cpu_scale = workload.footprint.cpu_update_scale();
  const double gpu_scale = workload.footprint.gpu_update_scale();
  if (cpu_scale != 1.0 || gpu_scale != 1.0) {
    std::printf(
        "update rates     x%.3g CPU (%s), x%.3g GPU (the bytes an update moves) for this state "
        "format, against fp32 state's\n",
        cpu_scale,
        workload.footprint.cpu_update_calibrated()
            ? "measured: the calibration file's"
            : (workload.footprint.quantized_moments ? "model: the 8-bit CPU kernels are "
                                                      "compute-bound, a constant"
                                                    : "model: the bytes an update moves"),
        gpu_scale);
    const double contended_scale = workload.footprint.cpu_update_contended_scale();
    if (contended_scale != cpu_scale) {
      std::printf("                 x%.3g CPU while copying (measured: the calibration file's)\n",
                  contended_scale);
    }
  }
  std::printf("\n");
  print_rates(resolved, workload.footprint);
  std::printf("\n%s", plan_table(best).c_str());
  if (residency) std::printf("%s", residency->lines().c_str());
  if (iteration) std::printf("%s", iteration->line().c_str());
  std::printf("%s", node.lines().c_str());
  std::printf("\none GPU subgroup every K (same model; published rule for these rates: K = %zu)\n",
              rule_k);
  std::printf("     K  GPU subgroups  buffers  predicted s\n");
  for (const auto& [k, p] : fixed) {
    if (p) {
      std::printf("  %4zu  %13zu  %7zu  %11.3f\n", k, p->gpu_subgroups(), p->buffers,
                  p->predicted.phase_s);
    } else {
      std::printf("  %4zu  %13s  %7s  %11s\n", k, "-", "-", "no fit");
    }
  }
  return 0;
}

}  // namespace tide::tools

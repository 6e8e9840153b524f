#include "config/node.h"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>

#include "config/env.h"

namespace tide::config {
namespace {

constexpr int kMaxCpu = 65535;

int parse_cpu(std::string_view text, std::string_view list) {
  int value = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || value < 0 || value > kMaxCpu) {
    throw std::invalid_argument("not a cpulist: \"" + std::string(list) + "\"");
  }
  return value;
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  if (cpus.empty()) {
    const int n = static_cast<int>(std::max(std::thread::hardware_concurrency(), 1u));
    for (int c = 0; c < n; ++c) cpus.push_back(c);
  }
  return cpus;
}

// The first 4 KiB of a sysfs file: a cpulist of 65536 CPUs in ranges fits many times over.
std::string read_small(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string text(4096, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace

LocalRanks local_ranks() {
  const auto rank_text = env_text("LOCAL_RANK");
  // DeepSpeed's launcher says LOCAL_SIZE where torchrun says LOCAL_WORLD_SIZE.
  auto size_text = env_text("LOCAL_WORLD_SIZE");
  const char* size_name = "LOCAL_WORLD_SIZE";
  const auto deepspeed_size = env_text("LOCAL_SIZE");
  if (!size_text && deepspeed_size) {
    size_text = deepspeed_size;
    size_name = "LOCAL_SIZE";
  } else if (size_text && deepspeed_size && *size_text != *deepspeed_size) {
    throw EnvError("LOCAL_SIZE", *deepspeed_size,
                   "the value of LOCAL_WORLD_SIZE (" + *size_text + "), or to be unset");
  }
  if (!rank_text && !size_text) return {};
  const std::string size_accepts = "an integer from 1 to " + std::to_string(kMaxLocalRanks) +
                                   ", set with LOCAL_RANK (LOCAL_SIZE: DeepSpeed's name for it)";
  if (!size_text) throw EnvError("LOCAL_WORLD_SIZE", "", size_accepts);
  if (!rank_text) {
    throw EnvError("LOCAL_RANK", "",
                   std::string("an integer from 0 to ") + size_name + " - 1, set with it");
  }
  LocalRanks r;
  try {
    r.size = static_cast<int>(parse_int(size_name, *size_text, 1, kMaxLocalRanks));
  } catch (const EnvError&) {
    throw EnvError(size_name, *size_text, size_accepts);
  }
  const std::string rank_accepts = std::string("an integer from 0 to ") + size_name + " - 1 (" +
                                   std::to_string(r.size - 1) + ")";
  try {
    r.rank = static_cast<int>(parse_int("LOCAL_RANK", *rank_text, 0, r.size - 1));
  } catch (const EnvError&) {
    throw EnvError("LOCAL_RANK", *rank_text, rank_accepts);
  }
  return r;
}

std::size_t Topology::cpu_count() const {
  std::size_t n = 0;
  for (const NumaNode& node : nodes) n += node.cpus.size();
  return n;
}

std::vector<int> parse_cpu_list(std::string_view text) {
  std::vector<int> cpus;
  std::string_view rest = text;
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (comma != std::string_view::npos && rest.empty()) {
      throw std::invalid_argument("not a cpulist: \"" + std::string(text) + "\"");
    }
    const std::size_t dash = item.find('-');
    const int first = parse_cpu(item.substr(0, dash), text);
    const int last =
        dash == std::string_view::npos ? first : parse_cpu(item.substr(dash + 1), text);
    if (last < first || (!cpus.empty() && first <= cpus.back())) {
      throw std::invalid_argument("not a cpulist (ascending, no repeats): \"" + std::string(text) +
                                  "\"");
    }
    for (int c = first; c <= last; ++c) cpus.push_back(c);
  }
  return cpus;
}

Topology read_topology(const std::filesystem::path& node_dir, const std::vector<int>& allowed) {
  std::map<int, std::vector<int>> by_node;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(node_dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with("node") || name.size() > 8) continue;
    int id = -1;
    const auto [p, err] = std::from_chars(name.data() + 4, name.data() + name.size(), id);
    if (err != std::errc{} || p != name.data() + name.size() || id < 0) continue;
    try {
      std::vector<int> cpus = parse_cpu_list(read_small(it->path() / "cpulist"));
      std::erase_if(cpus,
                    [&](int c) { return !std::binary_search(allowed.begin(), allowed.end(), c); });
      if (!cpus.empty()) by_node[id] = std::move(cpus);
    } catch (const std::invalid_argument&) {
      // A node sysfs describes oddly is left out; the CPUs it held go to node 0's fallback below.
    }
  }
  Topology t;
  std::size_t covered = 0;
  for (auto& [id, cpus] : by_node) {
    covered += cpus.size();
    t.nodes.push_back({id, std::move(cpus)});
  }
  // Without a usable sysfs, or when it does not account for every allowed CPU, one node.
  if (t.nodes.empty() || covered != allowed.size()) t.nodes = {{0, allowed}};
  return t;
}

Topology this_topology() {
  std::vector<int> allowed = allowed_cpus();
  return read_topology("/sys/devices/system/node", allowed);
}

CoreShare core_share(const Topology& topology, LocalRanks ranks,
                     std::span<const int> gpu_numa_nodes) {
  if (topology.nodes.empty() || topology.cpu_count() == 0) {
    throw std::invalid_argument("core_share: a topology without CPUs");
  }
  if (ranks.size < 1 || ranks.rank < 0 || ranks.rank >= ranks.size) {
    throw std::invalid_argument("core_share: local rank out of range");
  }
  const std::size_t nodes = topology.nodes.size();
  if (ranks.size == 1) {
    // Alone, a rank keeps every core, whichever nodes they are on.
    CoreShare all;
    for (const NumaNode& n : topology.nodes)
      all.cpus.insert(all.cpus.end(), n.cpus.begin(), n.cpus.end());
    std::sort(all.cpus.begin(), all.cpus.end());
    all.numa_node = nodes == 1 ? topology.nodes[0].id : -1;
    return all;
  }
  // node_of[r]: the index into topology.nodes of local rank r's node.
  std::vector<std::size_t> node_of(static_cast<std::size_t>(ranks.size));
  bool by_gpu = gpu_numa_nodes.size() == node_of.size();
  for (std::size_t r = 0; by_gpu && r < node_of.size(); ++r) {
    const auto it = std::find_if(topology.nodes.begin(), topology.nodes.end(),
                                 [&](const NumaNode& n) { return n.id == gpu_numa_nodes[r]; });
    by_gpu = it != topology.nodes.end();
    if (by_gpu) node_of[r] = static_cast<std::size_t>(it - topology.nodes.begin());
  }
  if (!by_gpu) {
    // Rank r takes the node holding the middle of its slice of all cores, in order.
    const auto total = static_cast<double>(topology.cpu_count());
    for (std::size_t r = 0; r < node_of.size(); ++r) {
      const double middle = (static_cast<double>(r) + 0.5) * total / ranks.size;
      double start = 0;
      node_of[r] = nodes - 1;
      for (std::size_t n = 0; n < nodes; ++n) {
        start += static_cast<double>(topology.nodes[n].cpus.size());
        if (middle < start) {
          node_of[r] = n;
          break;
        }
      }
    }
  }
  const std::size_t mine = node_of[static_cast<std::size_t>(ranks.rank)];
  const std::vector<int>& cpus = topology.nodes[mine].cpus;
  std::size_t index = 0, count = 0;  // this rank's position among its node's ranks, and theirs
  for (std::size_t r = 0; r < node_of.size(); ++r) {
    if (node_of[r] != mine) continue;
    if (static_cast<int>(r) < ranks.rank) ++index;
    ++count;
  }
  CoreShare share;
  share.numa_node = topology.nodes[mine].id;
  if (count > cpus.size()) {
    share.cpus = {cpus[index % cpus.size()]};
    share.shared = true;
    return share;
  }
  const std::size_t base = cpus.size() / count, extra = cpus.size() % count;
  const std::size_t first = index * base + std::min(index, extra);
  const std::size_t n = base + (index < extra ? 1 : 0);
  share.cpus.assign(cpus.begin() + static_cast<std::ptrdiff_t>(first),
                    cpus.begin() + static_cast<std::ptrdiff_t>(first + n));
  return share;
}

int pci_numa_node(const std::filesystem::path& pci_devices, std::string_view bus_id) {
  if (bus_id.empty() || bus_id.size() > 32) return -1;
  std::string name(bus_id);
  for (char& c : name) {
    if (c >= 'A' && c <= 'F') c = static_cast<char>(c - 'A' + 'a');
    const bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
    if (!hex && c != ':' && c != '.') return -1;
  }
  // CUDA may write an 8-digit domain ("00000000:3b:00.0"); sysfs names it with 4.
  if (name.size() > 12 && name.find(':') == 8 && name.starts_with("0000")) name.erase(0, 4);
  std::error_code ec;
  if (!std::filesystem::is_regular_file(pci_devices / name / "numa_node", ec)) return -1;
  const std::string text = read_small(pci_devices / name / "numa_node");
  int node = -1;
  const auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), node);
  if (err != std::errc{} || end != text.data() + text.size() || node < 0 || node > 1023) return -1;
  return node;
}

}  // namespace tide::config

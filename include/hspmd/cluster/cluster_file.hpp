#pragma once
// Cluster files: JSON describing the devices (one per rank) and links of a job.
// The format, with every field and limit, is documented in docs/cluster-file.md.
//
//     {
//       "name": "emulated-2",
//       "links": { "intra_node": { "bandwidth": 1e10, "latency": 1e-6 } },
//       "devices": [
//         { "name": "cpu0", "kind": "cpu", "speed": 2e10, "memory": "4 GiB" },
//         { "name": "cpu1", "kind": "cpu", "speed": 1e10, "memory": "4 GiB", "slowdown": 2 }
//       ]
//     }
//
// Every malformed file is rejected with one line "FILE: field PATH: reason (expected ...)".

#include <hspmd/cluster/cluster.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/core/hash.hpp>
#include <hspmd/io/json_input.hpp>

#include <nlohmann/json.hpp>

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>

namespace hspmd {

/// Plausibility limits of cluster-file values; larger values are rejected as absurd.
namespace cluster_limits {
inline constexpr double max_speed = 1e18;                ///< flop/s (an exaflop per device)
inline constexpr double min_speed = 1e6;                 ///< flop/s (slower is a typo)
inline constexpr double min_bandwidth = 1e5;             ///< bytes/s (100 kB/s)
inline constexpr double max_memory = 1125899906842624.0; ///< bytes (1 PiB)
inline constexpr double max_bandwidth = 1e13;            ///< bytes/s (10 TB/s)
inline constexpr double max_latency = 10.0;              ///< seconds
inline constexpr double max_slowdown = 1000.0;           ///< emulated slowdown factor
inline constexpr double max_node = 1e6;                  ///< node ids are 0 .. 1e6
inline constexpr double max_count = 4096.0;              ///< devices per "count" entry
inline constexpr std::size_t max_devices = 65536;        ///< devices per cluster
} // namespace cluster_limits

namespace detail {
using namespace hspmd::io; // the strict JSON readers

inline constexpr std::string_view cluster_file_expected =
    "a JSON object with \"devices\" and \"links\"; see docs/cluster-file.md";
inline constexpr std::string_view name_chars =
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-";

/// Memory: a whole number of bytes, or a string "<number> <unit>" with unit B, KB, MB, GB, TB
/// (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024): "16 GiB", "80GB", "1.5 TiB".
[[nodiscard]] inline std::uint64_t read_memory(const json_source& src, const nlohmann::json& j,
                                               const std::string& path) {
  constexpr std::string_view meaning =
      "bytes > 0 as a whole number, or a string such as \"16 GiB\" or \"80 GB\"";
  const number_rule rule{0.0, true, cluster_limits::max_memory, true, meaning, "1 PiB"};
  if (!j.is_string())
    return static_cast<std::uint64_t>(read_number(src, j, path, rule));

  const auto& s = j.get_ref<const std::string&>();
  double value = 0.0;
  const char* first = s.data();
  const char* last = s.data() + s.size();
  auto [end, ec] = std::from_chars(first, last, value);
  if (ec != std::errc{} || end == first)
    src.fail(path, "\"" + printable(s) + "\" does not start with a number", std::string(meaning));
  std::string_view unit(end, static_cast<std::size_t>(last - end));
  while (!unit.empty() && unit.front() == ' ')
    unit.remove_prefix(1);
  static const std::map<std::string_view, double> units = {
      {"B", 1.0},         {"KB", 1e3},           {"MB", 1e6},
      {"GB", 1e9},        {"TB", 1e12},          {"KiB", 1024.0},
      {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  const auto it = units.find(unit);
  if (it == units.end())
    src.fail(path, "unknown unit \"" + printable(unit) + "\" in \"" + printable(s) + "\"",
             "one of B, KB, MB, GB, TB, KiB, MiB, GiB, TiB");
  // Bytes are whole: "1.5 GiB" is exact, "0.3 KB" rounds to 300.
  return static_cast<std::uint64_t>(
      read_number(src, nlohmann::json(std::round(value * it->second)), path, rule));
}

[[nodiscard]] inline link_spec read_link(const json_source& src, const nlohmann::json& j,
                                         const std::string& path) {
  expect_object(src, j, path, "{\"bandwidth\": bytes/s, \"latency\": seconds}");
  reject_unknown_keys(src, j, path, {"bandwidth", "latency"});
  constexpr std::string_view bw = "bytes/s > 0, e.g. 1.3e9 for 10.4 Gbit/s";
  constexpr std::string_view lat = "seconds >= 0, e.g. 2e-5";
  link_spec l;
  l.bandwidth = read_number(
      src, require_key(src, j, path, "bandwidth", bw), json_child(path, "bandwidth"),
      {0.0, true, cluster_limits::max_bandwidth, false, bw, {}, cluster_limits::min_bandwidth});
  l.latency =
      read_number(src, require_key(src, j, path, "latency", lat), json_child(path, "latency"),
                  {0.0, false, cluster_limits::max_latency, false, lat});
  return l;
}

// {"alpha": a, "beta": b}, or a cost curve [{"up_to": bytes, "alpha": a, "beta": b}, ...,
// {"alpha": a, "beta": b}] with ascending limits and an unlimited last piece.
[[nodiscard]] inline cost_curve read_cost_curve(const json_source& src, const nlohmann::json& j,
                                                const std::string& path) {
  constexpr std::string_view expected =
      "{\"alpha\": seconds, \"beta\": seconds per byte}, or an array of such pieces, each "
      "but the last with \"up_to\": bytes";
  const auto piece = [&](const nlohmann::json& p, const std::string& at, bool first, bool last) {
    expect_object(src, p, at, expected);
    if (last)
      reject_unknown_keys(src, p, at, {"alpha", "beta"});
    else
      reject_unknown_keys(src, p, at, {"up_to", "alpha", "beta"});
    cost_piece c;
    if (!last)
      c.up_to_bytes = read_number(src, require_key(src, p, at, "up_to", expected),
                                  json_child(at, "up_to"), {0.0, true, 1e18, false, "bytes > 0"});
    // A piece after the first starts above x = 0 and may have a negative alpha (checked below).
    c.cost.alpha =
        read_number(src, require_key(src, p, at, "alpha", expected), json_child(at, "alpha"),
                    {first ? 0.0 : -cluster_limits::max_latency, false, cluster_limits::max_latency,
                     false, "seconds; >= 0 for the first piece"});
    c.cost.beta =
        read_number(src, require_key(src, p, at, "beta", expected), json_child(at, "beta"),
                    {0.0, false, 1.0 / cluster_limits::min_bandwidth, false,
                     "seconds per byte >= 0, e.g. 2e-10 for 5 GB/s"});
    return c;
  };
  if (!j.is_array())
    return {piece(j, path, true, true)};
  if (j.empty())
    src.fail(path, "is empty", std::string(expected));
  cost_curve curve;
  for (std::size_t i = 0; i < j.size(); ++i) {
    curve.push_back(piece(j[i], json_child(path, i), i == 0, i + 1 == j.size()));
    if (i > 0 && !(curve[i].up_to_bytes > curve[i - 1].up_to_bytes))
      src.fail(json_child(json_child(path, i), "up_to"), "is not larger than the piece before",
               "ascending \"up_to\" limits");
    const double from = i == 0 ? 0.0 : curve[i - 1].up_to_bytes;
    if (curve[i].cost.alpha + curve[i].cost.beta * from < 0.0)
      src.fail(json_child(json_child(path, i), "alpha"),
               "gives a negative time where the piece starts",
               "alpha + beta * (the previous piece's up_to) >= 0");
  }
  return curve;
}

// "collectives": {"all_gather_v": {"padded": {alpha, beta}, ...}, "all_reduce": {alpha, beta}}
inline void read_collective_costs(const json_source& src, const nlohmann::json& j, cluster& c) {
  constexpr std::string_view expected =
      "an object keyed by collective (all_gather_v, reduce_scatter_v, all_reduce, broadcast, "
      "all_to_all_v)";
  expect_object(src, j, "collectives", expected);
  reject_unknown_keys(
      src, j, "collectives",
      {"all_gather_v", "reduce_scatter_v", "all_reduce", "broadcast", "all_to_all_v"});
  for (collective op : {collective::all_gather_v, collective::reduce_scatter_v,
                        collective::all_reduce, collective::broadcast, collective::all_to_all_v}) {
    const std::string key(name(op));
    const auto it = j.find(key);
    if (it == j.end())
      continue;
    const std::string path = json_child("collectives", key);
    if (!has_algorithms(op)) {
      c.collective_costs.push_back({op, uneven_algorithm::native, read_cost_curve(src, *it, path)});
      continue;
    }
    expect_object(src, *it, path, "an object keyed by algorithm (padded, grouped, native)");
    reject_unknown_keys(src, *it, path, {"padded", "grouped", "native"});
    for (uneven_algorithm alg : concrete_algorithms)
      if (const auto a = it->find(std::string(name(alg))); a != it->end())
        c.collective_costs.push_back(
            {op, alg, read_cost_curve(src, *a, json_child(path, name(alg)))});
  }
}

[[nodiscard]] inline nlohmann::json curve_to_json(const cost_curve& curve) {
  const auto piece = [](const cost_piece& p) {
    nlohmann::json j = {{"alpha", p.cost.alpha}, {"beta", p.cost.beta}};
    if (std::isfinite(p.up_to_bytes))
      j["up_to"] = p.up_to_bytes;
    return j;
  };
  if (curve.size() == 1)
    return piece(curve[0]);
  nlohmann::json a = nlohmann::json::array();
  for (const auto& p : curve)
    a.push_back(piece(p));
  return a;
}

} // namespace detail

/// Parses and validates a cluster file's text. `source` names the file in error messages.
/// Throws `config_error` with one line "SOURCE: field PATH: reason (expected ...)".
[[nodiscard]] inline cluster parse_cluster(std::string_view text,
                                           const std::string& source = "<cluster>") {
  using io::json_child;
  const io::json_source src(source);
  const nlohmann::json doc =
      io::parse_json_strict(text, src, std::string(detail::cluster_file_expected));
  io::expect_object(src, doc, "", detail::cluster_file_expected);
  io::reject_unknown_keys(
      src, doc, "",
      {"version", "name", "description", "links", "devices", "collectives", "overlap"});

  cluster c;
  c.source = source;
  if (const auto it = doc.find("version"); it != doc.end() && !(it->is_number() && *it == 1))
    src.fail("version", "unsupported version " + io::printable(it->dump()),
             "1, the only version this hspmd reads");
  c.name =
      doc.contains("name")
          ? io::read_string(src, doc["name"], "name",
                            "a short name of letters, digits, '.', '_' or '-'", detail::name_chars)
          : std::filesystem::path(source).stem().string();
  if (doc.contains("description"))
    c.description = io::read_string(src, doc["description"], "description", "free text", {}, 1000);

  // Devices. An entry with "count": N stands for N identical devices named NAME.0 .. NAME.N-1.
  constexpr std::string_view devices_expected =
      "an array of device objects {name, kind, speed, bf16_speed, peak, blas, rates, memory, "
      "node, slowdown, count}";
  const auto& devs = io::expect_array(
      src, io::require_key(src, doc, "", "devices", devices_expected), "devices", devices_expected);
  if (devs.empty())
    src.fail("devices", "is empty", "at least one device (one per rank)");
  std::map<std::string, std::string> first_path_of_name;
  for (std::size_t i = 0; i < devs.size(); ++i) {
    const std::string path = json_child("devices", i);
    const auto& d = io::expect_object(src, devs[i], path, devices_expected);
    io::reject_unknown_keys(src, d, path,
                            {"name", "kind", "speed", "bf16_speed", "peak", "blas", "rates",
                             "memory", "node", "slowdown", "count"});
    device_spec dev;
    constexpr std::string_view name_expected =
        "a unique name of letters, digits, '.', '_' or '-', at most 64 characters";
    dev.name = io::read_string(src, io::require_key(src, d, path, "name", name_expected),
                               json_child(path, "name"), name_expected, detail::name_chars);
    constexpr std::string_view kind_expected = "the device model, e.g. \"V100\" or \"cpu\"";
    dev.kind = io::read_string(src, io::require_key(src, d, path, "kind", kind_expected),
                               json_child(path, "kind"), kind_expected);
    constexpr std::string_view speed_expected = "flop/s > 0, e.g. 1.4e13 for a V100";
    dev.speed = io::read_number(src, io::require_key(src, d, path, "speed", speed_expected),
                                json_child(path, "speed"),
                                {0.0,
                                 true,
                                 cluster_limits::max_speed,
                                 false,
                                 speed_expected,
                                 {},
                                 cluster_limits::min_speed});
    if (d.contains("bf16_speed"))
      dev.bf16_speed = io::read_number(
          src, d["bf16_speed"], json_child(path, "bf16_speed"),
          {0.0,
           true,
           cluster_limits::max_speed,
           false,
           "flop/s > 0 of GEMMs with bf16/f16 operands, e.g. 9.9e14 for an H100; leave it out "
           "for a device without a faster 16-bit path",
           {},
           cluster_limits::min_speed});
    if (d.contains("peak"))
      dev.peak = io::read_number(src, d["peak"], json_child(path, "peak"),
                                 {0.0,
                                  true,
                                  cluster_limits::max_speed,
                                  false,
                                  "peak flop/s > 0 that MFU is reported against, e.g. 9.9e14 for "
                                  "an H100 in bf16",
                                  {},
                                  cluster_limits::min_speed});
    if (d.contains("blas"))
      dev.blas = io::read_string(src, d["blas"], json_child(path, "blas"),
                                 "free text naming the BLAS and its kernels", {}, 200);
    if (d.contains("rates")) {
      constexpr std::string_view rates_expected =
          "{\"gemm\", \"elementwise\", \"softmax\", \"optimizer\"}: measured flop/s of each "
          "class, all four (hspmd-profile writes them)";
      const std::string rpath = json_child(path, "rates");
      const auto& r = io::expect_object(src, d["rates"], rpath, rates_expected);
      static_assert(op_class_count == 4);
      io::reject_unknown_keys(src, r, rpath, {"gemm", "elementwise", "softmax", "optimizer"});
      for (std::size_t k = 0; k < op_class_count; ++k) {
        const std::string key(op_class_names[k]);
        dev.rates[k] =
            io::read_number(src, io::require_key(src, r, rpath, key.c_str(), rates_expected),
                            json_child(rpath, key),
                            {0.0,
                             true,
                             cluster_limits::max_speed,
                             false,
                             "flop/s > 0 of this class of ops, FLOPs as the cost model counts them",
                             {},
                             cluster_limits::min_speed});
      }
    }
    dev.memory = detail::read_memory(
        src, io::require_key(src, d, path, "memory", "bytes, or a string such as \"16 GiB\""),
        json_child(path, "memory"));
    if (d.contains("node"))
      dev.node = static_cast<std::int64_t>(
          io::read_number(src, d["node"], json_child(path, "node"),
                          {0.0, false, cluster_limits::max_node, true,
                           "a whole number >= 0; devices on one node share a node id"}));
    if (d.contains("slowdown"))
      dev.slowdown =
          io::read_number(src, d["slowdown"], json_child(path, "slowdown"),
                          {1.0, false, cluster_limits::max_slowdown, false,
                           "a factor >= 1 by which an emulated device's compute is stretched"});
    std::size_t count = 1;
    if (d.contains("count"))
      count =
          static_cast<std::size_t>(io::read_number(src, d["count"], json_child(path, "count"),
                                                   {1.0, false, cluster_limits::max_count, true,
                                                    "a whole number of identical devices >= 1"}));
    if (c.devices.size() + count > cluster_limits::max_devices)
      src.fail(path,
               "makes the cluster larger than " + std::to_string(cluster_limits::max_devices) +
                   " devices",
               "a smaller cluster");

    // The expanded names must read back (canonical form): at most 64 characters each.
    if (d.contains("count") && dev.name.size() + 1 + std::to_string(count - 1).size() > 64)
      src.fail(json_child(path, "name"),
               "with count " + std::to_string(count) + " the expanded names (\"" + dev.name + "." +
                   std::to_string(count - 1) + "\") are longer than 64 characters",
               std::string(name_expected) + ", the suffix .N of \"count\" included");
    for (std::size_t k = 0; k < count; ++k) {
      device_spec copy = dev;
      if (d.contains("count"))
        copy.name += "." + std::to_string(k);
      const auto [it, inserted] = first_path_of_name.emplace(copy.name, path);
      if (!inserted)
        src.fail(json_child(path, "name"),
                 "duplicate device name \"" + copy.name + "\" (also at " + it->second + ")",
                 "unique device names");
      c.devices.push_back(std::move(copy));
    }
  }

  // Class rates price every device's ops or none: a device without them would be compared at
  // its whole-step speed with the others' per-class rates.
  for (std::size_t i = 1; i < c.devices.size(); ++i)
    if (c.devices[i].has_rates() != c.devices[0].has_rates())
      src.fail("devices",
               "device " + c.devices[i].name + (c.devices[i].has_rates() ? " has" : " has no") +
                   " class rates and device " + c.devices[0].name +
                   (c.devices[0].has_rates() ? " has" : " has none"),
               "give \"rates\" for every device (hspmd-profile --merge measures them) or for "
               "none");

  // Links. The inter-node link is required only when devices span several nodes.
  constexpr std::string_view links_expected =
      "{\"intra_node\": {...}, \"inter_node\": {...}} with bandwidth and latency each";
  const auto& links = io::expect_object(src, io::require_key(src, doc, "", "links", links_expected),
                                        "links", links_expected);
  io::reject_unknown_keys(src, links, "links", {"intra_node", "inter_node"});
  c.intra_node = detail::read_link(
      src, io::require_key(src, links, "links", "intra_node", links_expected), "links.intra_node");
  if (links.contains("inter_node"))
    c.inter_node = detail::read_link(src, links["inter_node"], "links.inter_node");
  if (const auto nodes = c.nodes(); nodes.size() > 1 && !c.inter_node)
    src.fail("links.inter_node",
             "missing, but the devices span " + std::to_string(nodes.size()) + " nodes",
             "{\"bandwidth\": bytes/s, \"latency\": seconds} for links between nodes");
  if (const auto it = doc.find("collectives"); it != doc.end())
    detail::read_collective_costs(src, *it, c);
  if (doc.contains("overlap"))
    c.overlap = io::read_number(
        src, doc["overlap"], "overlap",
        {0.0, false, 1.0, false,
         "a fraction in [0, 1]: how much of a gradient all-reduce hides behind the backward"});
  return c;
}

/// Reads, parses and validates the cluster file `file`.
[[nodiscard]] inline cluster load_cluster(const std::filesystem::path& file) {
  return parse_cluster(io::read_text_file(file), file.string());
}

/// The canonical JSON form: devices expanded (no "count"), memory in bytes, every field
/// present. `parse_cluster(to_json(c).dump())` gives back `c`.
[[nodiscard]] inline nlohmann::json to_json(const cluster& c) {
  nlohmann::json j;
  j["version"] = 1;
  j["name"] = c.name;
  if (!c.description.empty())
    j["description"] = c.description;
  auto link = [](const link_spec& l) {
    return nlohmann::json{{"bandwidth", l.bandwidth}, {"latency", l.latency}};
  };
  j["links"]["intra_node"] = link(c.intra_node);
  if (c.inter_node)
    j["links"]["inter_node"] = link(*c.inter_node);
  j["devices"] = nlohmann::json::array();
  for (const auto& d : c.devices) {
    j["devices"].push_back({{"name", d.name},
                            {"kind", d.kind},
                            {"speed", d.speed},
                            {"memory", d.memory},
                            {"node", d.node},
                            {"slowdown", d.slowdown}});
    if (d.bf16_speed > 0.0)
      j["devices"].back()["bf16_speed"] = d.bf16_speed;
    if (d.peak > 0.0)
      j["devices"].back()["peak"] = d.peak;
    if (!d.blas.empty())
      j["devices"].back()["blas"] = d.blas;
    if (d.has_rates())
      for (std::size_t k = 0; k < op_class_count; ++k)
        j["devices"].back()["rates"][std::string(op_class_names[k])] = d.rates[k];
  }
  if (c.overlap != 0.0)
    j["overlap"] = c.overlap;
  for (const auto& e : c.collective_costs) {
    if (has_algorithms(e.op))
      j["collectives"][std::string(name(e.op))][std::string(name(e.algorithm))] =
          detail::curve_to_json(e.curve);
    else
      j["collectives"][std::string(name(e.op))] = detail::curve_to_json(e.curve);
  }
  return j;
}

/// A cost model as a cluster file's "collectives" section (every collective and algorithm the
/// file format knows), e.g. to save what `calibrate_collectives` measured.
[[nodiscard]] inline nlohmann::json collectives_to_json(const collective_cost_model& m) {
  nlohmann::json j = nlohmann::json::object();
  for (collective op : {collective::all_gather_v, collective::reduce_scatter_v,
                        collective::all_reduce, collective::broadcast, collective::all_to_all_v}) {
    if (!has_algorithms(op)) {
      j[std::string(name(op))] = detail::curve_to_json(m.curve(op, uneven_algorithm::native));
      continue;
    }
    for (uneven_algorithm alg : concrete_algorithms)
      j[std::string(name(op))][std::string(name(alg))] = detail::curve_to_json(m.curve(op, alg));
  }
  return j;
}

/// `c` checked by the cluster reader's rules, for a cluster built in code rather than read
/// from a file: throws `config_error` naming `source` and the field (e.g. a speed of 1e-300).
[[nodiscard]] inline cluster validated(const cluster& c, std::string_view source) {
  return parse_cluster(to_json(c).dump(), std::string(source));
}

/// A hash of the canonical form: equal on every rank that parsed the same cluster, whatever
/// the file's formatting or key order. Ranks compare it before they train.
[[nodiscard]] inline std::uint64_t fingerprint(const cluster& c) {
  return fnv1a64(to_json(c).dump());
}

} // namespace hspmd

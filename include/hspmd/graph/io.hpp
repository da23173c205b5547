#pragma once
// Printing and JSON for graphs.
//
//   id  op          name                   shape            fwd GFLOP  bwd GFLOP
//    3  linear      layers.0.fc1           (batch=32, 256)      0.0021     0.0042
//
// JSON: {"version": 1, "dtype": "f32", "loss": 12, "nodes": [{"op": "linear", "name": ...,
// "inputs": [..], "shape": [..], "batch_dim": 0, "attrs": {...}, "init": {...}}, ...]}.
// `from_json` re-infers every shape and rejects a file whose shapes disagree, so a graph file
// cannot smuggle in an inconsistent program.

#include <hspmd/core/dtype.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/graph/ops.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <ostream>
#include <string>

namespace hspmd::graph {

/// Writes one line per node: id, op, name, shape, forward and backward GFLOP; then the totals.
inline void print(std::ostream& os, const graph& g) {
  char line[256];
  std::snprintf(line, sizeof line, "%5s  %-15s %-30s %-22s %12s %12s\n", "id", "op", "name",
                "shape", "fwd GFLOP", "bwd GFLOP");
  os << line;
  for (node_id i = 0; i < g.size(); ++i) {
    const node& n = g[i];
    const node_cost c = cost_of(g, i);
    std::snprintf(line, sizeof line, "%5u  %-15s %-30s %-22s %12.6f %12.6f%s\n", i,
                  std::string(name(n.kind)).c_str(), n.name.c_str(), n.out.to_string().c_str(),
                  c.forward_flops / 1e9, c.backward_flops / 1e9, g.loss() == i ? "  <- loss" : "");
    os << line;
    if (n.pin)
      os << "       pinned " << n.pin->to_string() << "\n";
  }
  const node_cost t = total_cost(g);
  std::snprintf(line, sizeof line, "%5s  %-15s %-30s %-22s %12.6f %12.6f\n", "", "total", "", "",
                t.forward_flops / 1e9, t.backward_flops / 1e9);
  os << line;
}

/// The graph as JSON (see the file comment).
[[nodiscard]] inline nlohmann::json to_json(const graph& g) {
  nlohmann::json nodes = nlohmann::json::array();
  for (const node& n : g.nodes()) {
    nlohmann::json j = {{"op", name(n.kind)},
                        {"name", n.name},
                        {"inputs", n.inputs},
                        {"shape", n.out.dims},
                        {"dtype", name(n.type)}};
    if (n.out.batch_dim)
      j["batch_dim"] = *n.out.batch_dim;
    if (n.attrs != attributes{})
      j["attrs"] = {{"scalar", n.attrs.scalar}, {"dims", n.attrs.dims}, {"flag", n.attrs.flag}};
    if (n.pin)
      j["pin"] = n.pin->to_string();
    if (n.kind == op::parameter)
      j["init"] = {{"kind", n.init.how == initializer::kind::normal ? "normal" : "constant"},
                   {"value", n.init.value}};
    nodes.push_back(std::move(j));
  }
  nlohmann::json j = {{"version", 1}, {"nodes", nodes}};
  if (g.loss())
    j["loss"] = *g.loss();
  return j;
}

/// Reads a graph written by `to_json`; throws `config_error` naming `source` and the field, or
/// `shape_error` when a recorded shape disagrees with the op's rule.
[[nodiscard]] inline graph from_json(const nlohmann::json& j, const std::string& source = "graph") {
  const auto fail = [&](const std::string& field, const std::string& why) -> void {
    throw config_error(source + ": field " + field, why, "a graph written by hspmd");
  };
  try {
    if (!j.is_object() || j.value("version", 0) != 1 || !j.contains("nodes"))
      fail("<root>", "not a version-1 graph");
    graph g;
    const auto& nodes = j.at("nodes");
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      const auto& jn = nodes[i];
      const std::string at = "nodes[" + std::to_string(i) + "]";
      node n;
      const auto k = parse_op(jn.at("op").get<std::string>());
      if (!k)
        fail(at + ".op", "unknown op \"" + jn.at("op").get<std::string>() + "\"");
      n.kind = *k;
      n.name = jn.at("name").get<std::string>();
      n.inputs = jn.at("inputs").get<std::vector<node_id>>();
      n.out.dims = jn.at("shape").get<std::vector<std::size_t>>();
      if (jn.contains("batch_dim"))
        n.out.batch_dim = jn.at("batch_dim").get<std::size_t>();
      const auto t = parse_dtype(jn.at("dtype").get<std::string>());
      if (!t)
        fail(at + ".dtype", "unknown dtype");
      n.type = *t;
      if (jn.contains("attrs")) {
        n.attrs.scalar = jn.at("attrs").at("scalar").get<double>();
        n.attrs.dims = jn.at("attrs").at("dims").get<std::vector<std::size_t>>();
        n.attrs.flag = jn.at("attrs").at("flag").get<bool>();
      }
      if (jn.contains("pin"))
        n.pin =
            placement::parse(jn.at("pin").get<std::string>(), source + ": field " + at + ".pin");
      if (jn.contains("init")) {
        n.init.how = jn.at("init").at("kind").get<std::string>() == "normal"
                         ? initializer::kind::normal
                         : initializer::kind::constant;
        n.init.value = jn.at("init").at("value").get<double>();
      }
      for (node_id in : n.inputs)
        if (in >= g.size())
          fail(at + ".inputs", "input " + std::to_string(in) + " is not an earlier node");
      const hspmd::shape inferred = infer_shape(g, n);
      if (inferred != n.out)
        throw shape_error(source + ": " + at,
                          "recorded shape " + n.out.to_string() + " but the op gives " +
                              inferred.to_string(),
                          "regenerate the graph file");
      g.add(std::move(n));
    }
    if (j.contains("loss"))
      g.set_loss(j.at("loss").get<node_id>());
    return g;
  } catch (const nlohmann::json::exception& e) {
    throw config_error(source, std::string("malformed graph JSON: ") + e.what(),
                       "a graph written by hspmd");
  }
}

} // namespace hspmd::graph

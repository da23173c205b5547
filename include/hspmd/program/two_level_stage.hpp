#pragma once
// A pipeline stage's two-level program: where a stage's group spans whole nodes, the stage may
// run a two-level plan (synth/hierarchical.hpp) over its graph instead of one program over the
// whole group --
//
//   inside a node   a one-level program of the node's own (parameters split or replicated
//                   among the node's devices, gathered over the node's fast link);
//   across nodes    the micro-batch's rows shared out by the nodes' speeds and memory, every
//                   parameter replicated node to node, its gradient all-reduced across the nodes
//                   once a step (after the stage's last micro-batch).
//
// A one-level program over a group of several nodes whose parameters do not fit replicated
// shards them over the whole group and gathers them across the slow inter-node links every
// micro-batch (Llama-70B at 64 stages on 1024 devices: two nodes a group); the two-level one
// gathers inside the node only and crosses the nodes once a step.
//
// What the record keeps is priced when it is planned (`plan_two_level_stage`), where the
// stage's graph at each node's rows is at hand: the micro-batch's passes (the slowest node),
// the once-a-step sync (the slowest node's exposed in-node sync + the cross-node all-reduce),
// and each device's memory with the stage's micro-batches in flight.
//
// Planned, priced, simulated and written as JSON; the pipeline executor does not run a
// two-level stage yet (exec/pipeline_checks.hpp refuses such a plan, naming the stage).

#include <hspmd/cluster/cluster.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/graph/stages.hpp>
#include <hspmd/synth/hierarchical.hpp>
#include <hspmd/synth/plan.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace hspmd::program {

/// See the file comment.
struct two_level_stage {
  /// Over the stage's group: `plan.nodes` counts devices within the group.
  synth::hierarchical_plan plan;
  std::size_t in_flight = 1;       ///< micro-batches the stage holds at once
  std::vector<double> activations; ///< per device of the group: one micro-batch's kept values
  std::vector<double> peak;        ///< per device: the plan's memory with `in_flight` of them
  double passes = 0.0;             ///< one micro-batch forward + backward, the slowest node (s)
  double sync = 0.0;               ///< once a step (s)

  /// The node (of `plan.nodes`) holding device `x` of the group, and x's position in it.
  [[nodiscard]] std::pair<std::size_t, std::size_t> node_of(std::size_t x) const {
    for (std::size_t k = 0; k < plan.nodes.size(); ++k)
      for (std::size_t i = 0; i < plan.nodes[k].size(); ++i)
        if (plan.nodes[k][i] == x)
          return {k, i};
    throw config_error("two-level stage", "device " + std::to_string(x) + " is in no node");
  }
  /// The share of a micro-batch's rows that device `x`'s node trains on.
  [[nodiscard]] double node_share(std::size_t x) const {
    return static_cast<double>(plan.node_batch[node_of(x).first]) / static_cast<double>(plan.batch);
  }
  /// Device `x`'s share of a micro-batch's rows: its node's rows over the micro-batch's, times
  /// its own share inside the node (0 on a node that sits out).
  [[nodiscard]] double row_share(std::size_t x) const {
    const auto [k, i] = node_of(x);
    if (!plan.active(k))
      return 0.0;
    const synth::ratio_table& r = plan.node_plan(k).ratios;
    const double inside =
        r.empty() || r[0].size() <= i ? 1.0 / static_cast<double>(plan.nodes[k].size()) : r[0][i];
    return static_cast<double>(plan.node_batch[k]) / static_cast<double>(plan.batch) * inside;
  }
  /// The node program of the first node that trains (where a value's placement is read).
  [[nodiscard]] const synth::plan& first_program() const {
    for (std::size_t k = 0; k < plan.nodes.size(); ++k)
      if (plan.active(k))
        return plan.node_plan(k);
    throw config_error("two-level stage", "no node trains");
  }
};

/// A stage's graph traced for a micro-batch of `rows` rows.
using stage_graph_at = std::function<graph::graph(std::size_t rows)>;

/// One micro-batch's kept activations and the peak with `held` micro-batches in flight, per
/// device, of stage plan `sp` of stage graph `g` on `sub` (its group, or a node of it).
struct stage_memory_use {
  std::vector<double> activations, peak;
};
[[nodiscard]] inline stage_memory_use stage_memory(const synth::plan& sp, const graph::graph& g,
                                                   const cluster& sub, std::size_t held) {
  const std::size_t n = sub.size();
  const synth::cost_model m(g, sub, synth::segment_map(g, sp.segments));
  stage_memory_use out;
  out.activations.assign(n, 0.0);
  synth::visit_memory(
      sp, m, [&](graph::node_id t, placement, const synth::linear_cost& bytes, std::size_t block) {
        if (block == synth::cost_model::none && m.depends_on_data(t))
          for (std::size_t r = 0; r < n; ++r)
            out.activations[r] += synth::value_at(bytes, sp.ratios, r);
      });
  // the plan's memory with `held` copies of what it keeps of the data
  synth::cost_model held_m(g, sub, synth::segment_map(g, sp.segments));
  held_m.set_activation_copies(static_cast<double>(held));
  synth::plan with_held = sp;
  synth::evaluate(with_held, held_m, sp.ratios);
  out.peak.assign(n, 0.0);
  for (std::size_t r = 0; r < n; ++r)
    out.peak[r] = r < with_held.memory.size() ? with_held.memory[r]
                                              : static_cast<double>(held) * out.activations[r];
  return out;
}

/// Whether a two-level program can apply to a group: two whole nodes or more, every node with
/// as many of the group's devices, and a link between nodes.
[[nodiscard]] inline bool spans_whole_nodes(const cluster& group) {
  if (!group.inter_node)
    return false;
  std::map<std::int64_t, std::size_t> per_node;
  for (const device_spec& d : group.devices)
    ++per_node[d.node];
  if (per_node.size() < 2)
    return false;
  return std::ranges::all_of(per_node,
                             [&](const auto& e) { return e.second == per_node.begin()->second; });
}

/// The devices of node `k` of `t`'s plan as a cluster of their own (from the stage's `group`).
[[nodiscard]] inline cluster node_of_group(const two_level_stage& t, const cluster& group,
                                           std::size_t k) {
  return synth::detail::node_cluster(group, t.plan.nodes[k]);
}

/// Nodes of `t` with the same key run the same program on the same rows on alike devices:
/// priced and simulated once (a stage's group has up to hundreds of nodes, a few variants).
[[nodiscard]] inline std::string alike_node_key(const two_level_stage& t, const cluster& group,
                                                std::size_t k) {
  std::string key =
      std::to_string(t.plan.node_variant[k]) + "|" + std::to_string(t.plan.node_batch[k]);
  for (std::size_t d : t.plan.nodes[k]) {
    const device_spec& s = group.devices[d];
    key += "|" + s.kind + "/" + std::to_string(s.speed) + "/" + std::to_string(s.bf16_speed) + "/" +
           std::to_string(s.memory) + "/" + std::to_string(s.slowdown);
    for (double r : s.rates)
      key += "/" + std::to_string(r);
  }
  return key;
}

/// Prices `t`'s plan (see the file comment) holding `held` micro-batches at once: its memory
/// per device, its passes and its once-a-step sync. `at`: the stage's graph at a row count.
template <class GraphAt>
void price_two_level_stage(two_level_stage& t, GraphAt&& at, const cluster& group,
                           std::size_t held) {
  t.in_flight = held;
  t.activations.assign(group.size(), 0.0);
  t.peak.assign(group.size(), 0.0);
  t.passes = 0.0;
  double node_sync = 0.0;
  struct priced_node {
    stage_memory_use use;
    double passes = 0.0, sync = 0.0;
  };
  std::map<std::string, priced_node> alike;
  for (std::size_t k = 0; k < t.plan.nodes.size(); ++k) {
    if (!t.plan.active(k))
      continue;
    auto [it, fresh] = alike.try_emplace(alike_node_key(t, group, k));
    priced_node& pn = it->second;
    if (fresh) {
      const synth::plan& v = t.plan.node_plan(k);
      const graph::graph& g = at(t.plan.node_batch[k]);
      const cluster node = node_of_group(t, group, k);
      pn.use = stage_memory(v, g, node, held);
      // (priced again without the received values' loads: the boundary sends are priced
      // apart)
      const synth::cost_model m(g, node, synth::segment_map(g, v.segments));
      synth::plan q = v;
      synth::evaluate(q, m, v.ratios);
      pn.sync = std::min(q.step_time, synth::exposed_gradient_sync(q, m));
      pn.passes = q.step_time - pn.sync;
    }
    for (std::size_t i = 0; i < t.plan.nodes[k].size(); ++i) {
      t.activations[t.plan.nodes[k][i]] = pn.use.activations[i];
      t.peak[t.plan.nodes[k][i]] = pn.use.peak[i];
    }
    t.passes = std::max(t.passes, pn.passes);
    node_sync = std::max(node_sync, pn.sync);
  }
  t.sync = node_sync + t.plan.cross_time;
}

/// Whether every device of `group` holds what `t` keeps at its peak (memory 0: unknown, fits).
[[nodiscard]] inline bool fits_memory(const two_level_stage& t, const cluster& group) {
  for (std::size_t d = 0; d < group.size() && d < t.peak.size(); ++d)
    if (group.devices[d].memory != 0 && t.peak[d] > static_cast<double>(group.devices[d].memory))
      return false;
  return true;
}

/// The budget of a two-level stage's node program searches, in states expanded. At 5,000
/// (before budget-cut searches completed by repeating their blocks' programs) Llama-7B's pick
/// on 4096 devices simulated 3.20 s a step instead of 2.27 s; with that completion 10,000
/// gives the 20,000 budget's picks on the bench clusters within 2 % (docs/benchmarks.md).
inline constexpr std::size_t two_level_node_expansions = 10'000;

/// Plans a two-level program for a stage (`at`: its graph at a row count) of `rows` rows a
/// micro-batch over `group` (which `spans_whole_nodes`), holding `held` micro-batches at once,
/// with the one-level options `so` inside each node; prices it (see the file comment).
/// `node_program` (may be empty): how node programs are synthesized (hierarchical_options's);
/// `node_expansions`: their searches' budget in states expanded. Throws `plan_error` where no node
/// program fits (synthesize_hierarchical's message).
[[nodiscard]] inline two_level_stage
plan_two_level_stage(const stage_graph_at& at, std::size_t rows, const cluster& group,
                     const synth::synth_options& so, std::size_t held, const std::string& model,
                     const decltype(synth::hierarchical_options::node_program)& node_program = {},
                     std::size_t node_expansions = two_level_node_expansions) {
  synth::graphs_by_rows graph_at(at);
  synth::hierarchical_options ho;
  ho.inner = so;
  ho.node_program = node_program;
  ho.node_search_expansions = node_expansions;
  // (one node program search, on the class with the most rows: the same picks on the bench
  // clusters, Llama-7B on 1024 devices planned in 5.3 s instead of 6.2 s)
  ho.class_searches = 1;
  // (and at its rows rounded down to a power of two: Llama-7B on 1024 devices 5.4 -> 4.9 s,
  // the same pick)
  ho.power_of_two_rows = true;
  ho.inner.activation_copies = static_cast<double>(held);
  two_level_stage t;
  t.plan = synth::synthesize_hierarchical([&](std::size_t r) { return graph_at(r); }, rows, group,
                                          ho, model);
  price_two_level_stage(t, graph_at, group, held);
  return t;
}

/// The record as JSON (its node programs as synth::to_json writes them).
[[nodiscard]] inline nlohmann::json to_json(const two_level_stage& t, bool with_stats = true) {
  nlohmann::json variants = nlohmann::json::array();
  for (const synth::plan& v : t.plan.variants)
    variants.push_back(synth::to_json(v, with_stats));
  nlohmann::json node_variant = nlohmann::json::array();
  for (std::size_t v : t.plan.node_variant)
    node_variant.push_back(v == synth::hierarchical_plan::none ? nlohmann::json(nullptr)
                                                               : nlohmann::json(v));
  nlohmann::json j = {{"strategy", t.plan.strategy},
                      {"batch", t.plan.batch},
                      {"nodes", t.plan.nodes},
                      {"node_batch", t.plan.node_batch},
                      {"node_variant", node_variant},
                      {"variants", variants},
                      {"in_flight", t.in_flight},
                      {"inner_time", t.plan.inner_time},
                      {"cross_time", t.plan.cross_time},
                      {"passes", t.passes},
                      {"sync", t.sync},
                      {"memory", t.plan.memory},
                      {"activations", t.activations},
                      {"peak", t.peak}};
  return {{"two_level", j}};
}

/// Reads what `to_json` wrote for a stage (`at`: its graph at a row count) over a group of
/// `devices` devices; throws `config_error` naming `source`, the field and the fix.
[[nodiscard]] inline two_level_stage two_level_from_json(const nlohmann::json& outer,
                                                         const stage_graph_at& at,
                                                         std::size_t devices,
                                                         const std::string& source) {
  const auto fail = [&](const std::string& field, const std::string& why) {
    throw config_error(source + ": field \"two_level." + field + "\"", why,
                       "write the plan again with hspmd-plan --json");
  };
  const nlohmann::json& j = outer.at("two_level");
  two_level_stage t;
  try {
    t.plan.strategy = j.at("strategy").get<std::string>();
    t.plan.batch = j.at("batch").get<std::size_t>();
    t.plan.nodes = j.at("nodes").get<std::vector<std::vector<std::size_t>>>();
    t.plan.node_batch = j.at("node_batch").get<std::vector<std::size_t>>();
    for (const auto& v : j.at("node_variant"))
      t.plan.node_variant.push_back(v.is_null() ? synth::hierarchical_plan::none
                                                : v.get<std::size_t>());
    t.in_flight = j.at("in_flight").get<std::size_t>();
    t.plan.inner_time = j.at("inner_time").get<double>();
    t.plan.cross_time = j.at("cross_time").get<double>();
    t.plan.step_time = t.plan.inner_time + t.plan.cross_time;
    t.passes = j.at("passes").get<double>();
    t.sync = j.at("sync").get<double>();
    t.plan.memory = j.at("memory").get<std::vector<double>>();
    t.activations = j.at("activations").get<std::vector<double>>();
    t.peak = j.at("peak").get<std::vector<double>>();
  } catch (const nlohmann::json::exception& e) {
    fail("*", std::string("is not a two-level stage record (") + e.what() + ")");
  }
  std::size_t held = 0;
  for (const auto& n : t.plan.nodes)
    held += n.size();
  if (held != devices || t.plan.node_batch.size() != t.plan.nodes.size() ||
      t.plan.node_variant.size() != t.plan.nodes.size() || t.peak.size() != devices ||
      t.activations.size() != devices || t.plan.memory.size() != devices)
    fail("nodes", "does not cover the group's " + std::to_string(devices) +
                      " devices once, one entry per node");
  const nlohmann::json& variants = j.at("variants");
  for (std::size_t v = 0; v < variants.size(); ++v) {
    std::size_t rows = 0; // the rows of the first node that runs it: its graph
    for (std::size_t k = 0; k < t.plan.nodes.size() && rows == 0; ++k)
      if (t.plan.node_variant[k] == v)
        rows = t.plan.node_batch[k];
    if (rows == 0)
      fail("variants", "variant " + std::to_string(v) + " is run by no node");
    t.plan.variants.push_back(synth::plan_from_json(
        variants[v], at(rows), source + " two-level node program " + std::to_string(v)));
  }
  for (std::size_t k = 0; k < t.plan.nodes.size(); ++k)
    if (t.plan.node_variant[k] != synth::hierarchical_plan::none &&
        t.plan.node_variant[k] >= t.plan.variants.size())
      fail("node_variant", "names node program " + std::to_string(t.plan.node_variant[k]) + " of " +
                               std::to_string(t.plan.variants.size()));
  return t;
}

} // namespace hspmd::program

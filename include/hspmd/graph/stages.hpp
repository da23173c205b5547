#pragma once
// Pipeline stages of a model: contiguous cuts of its graph at block boundaries, and each stage
// as a graph of its own. The cuts are balanced against the stage devices' speeds (a faster
// group takes more layers -- what no peer does for mixed clusters); a stage's graph reads the
// values an earlier stage computed as inputs ("recv:" + the value's name) and names the values
// a later stage reads, so the pipeline's executor sends them forward and their gradients back.
//
//     const auto cuts = graph::balanced_stages(g, std::vector<double>{2e12, 1e12});
//     const graph::stage_graph s1 = graph::extract_stage(g, cuts, 1);
//     s1.received;   // its inputs that stage 0 sends: (stage node, whole-graph node)
//     s1.sent;       // its values a later stage reads
//
// A stage starts at a block's first node (blocks: graph::block_ranges); what comes before the
// first block (embeddings) is stage 0's, what follows the last (the head, the loss) the last
// stage's. A parameter read by two stages (tied weights) is refused: each stage updates its own.
//
// A stage before the last has no loss of its own; it gets one that makes any executor run its
// backward from the gradients the next stage sends back: for each value x it sends, an input
// "grad:" + x's name holding d(loss)/dx, and the loss sum over x of sum(x * grad:x), whose
// gradient with respect to x is exactly grad:x (1 times it, no rounding).

#include <hspmd/core/error.hpp>
#include <hspmd/graph/blocks.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/graph/ops.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hspmd::graph {

/// The stages whose first blocks are `first_blocks` (ascending, the first 0): stage s runs from
/// block first_blocks[s]'s first node (node 0 for stage 0) to the node before the next stage's.
/// Throws `config_error` naming the bound when a block index is out of order or range.
[[nodiscard]] inline std::vector<node_range>
stages_at_blocks(const graph& g, std::span<const std::size_t> first_blocks,
                 std::string_view prefix = "layers.") {
  const std::vector<node_range> blocks = block_ranges(g, prefix);
  const std::string where = "pipeline stages";
  if (first_blocks.empty() || first_blocks.front() != 0)
    throw config_error(where, "the first stage must start at block 0");
  for (std::size_t s = 1; s < first_blocks.size(); ++s)
    if (first_blocks[s] <= first_blocks[s - 1] || first_blocks[s] >= blocks.size())
      throw config_error(where,
                         "stage " + std::to_string(s) + " starts at block " +
                             std::to_string(first_blocks[s]) + ", not after stage " +
                             std::to_string(s - 1) + "'s (block " +
                             std::to_string(first_blocks[s - 1]) + ") within the model's " +
                             std::to_string(blocks.size()) + " blocks named " + std::string(prefix),
                         "give each stage at least one block");
  std::vector<node_range> stages;
  for (std::size_t s = 0; s < first_blocks.size(); ++s) {
    const node_id first = s == 0 ? 0 : blocks[first_blocks[s]].first;
    const node_id last = s + 1 == first_blocks.size() ? static_cast<node_id>(g.size() - 1)
                                                      : blocks[first_blocks[s + 1]].first - 1;
    stages.emplace_back(first, last);
  }
  return stages;
}

/// The cut of `g` into `speeds.size()` stages at block boundaries that minimizes the slowest
/// stage's time, a stage's time being its nodes' forward and backward FLOPs over its speed
/// (`speeds[s]`, any unit; a device group's summed speed, say). Each stage gets at least one
/// block. Throws `config_error` when the model has fewer blocks than stages.
[[nodiscard]] inline std::vector<node_range> balanced_stages(const graph& g,
                                                             std::span<const double> speeds,
                                                             std::string_view prefix = "layers.") {
  const std::vector<node_range> blocks = block_ranges(g, prefix);
  const std::size_t n = speeds.size(), b = blocks.size();
  if (n == 0)
    throw config_error("pipeline stages", "no stages asked for");
  if (b < n)
    throw config_error("pipeline stages",
                       std::to_string(n) + " stages for a model of " + std::to_string(b) +
                           " blocks named " + std::string(prefix),
                       "ask for at most " + std::to_string(b) + " stages");
  for (std::size_t s = 0; s < n; ++s)
    if (!(speeds[s] > 0.0))
      throw config_error("pipeline stages",
                         "stage " + std::to_string(s) + "'s speed must be positive");
  // prefix[i]: the FLOPs of nodes [0, i)
  std::vector<double> prefix_flops(g.size() + 1, 0.0);
  for (node_id i = 0; i < g.size(); ++i) {
    const node_cost c = cost_of(g, i);
    prefix_flops[i + 1] = prefix_flops[i] + c.forward_flops + c.backward_flops;
  }
  // where a stage starting at block k starts (node), and where the stages end
  const auto start = [&](std::size_t k) -> node_id { return k == 0 ? 0 : blocks[k].first; };
  const auto flops = [&](std::size_t from, std::size_t to) { // blocks [from, to)
    const node_id a = start(from);
    const std::size_t z = to == b ? g.size() : start(to);
    return prefix_flops[z] - prefix_flops[a];
  };
  constexpr double inf = std::numeric_limits<double>::infinity();
  // best[s][k]: the slowest time of stages 0..s-1 covering blocks [0, k); from[s][k] its cut
  std::vector<std::vector<double>> best(n + 1, std::vector<double>(b + 1, inf));
  std::vector<std::vector<std::size_t>> from(n + 1, std::vector<std::size_t>(b + 1, 0));
  best[0][0] = 0.0;
  for (std::size_t s = 1; s <= n; ++s)
    for (std::size_t k = s; k + (n - s) <= b; ++k)
      for (std::size_t i = s - 1; i < k; ++i) {
        if (best[s - 1][i] == inf)
          continue;
        const double t = std::max(best[s - 1][i], flops(i, k) / speeds[s - 1]);
        if (t < best[s][k]) {
          best[s][k] = t;
          from[s][k] = i;
        }
      }
  std::vector<std::size_t> first_blocks(n);
  for (std::size_t s = n, k = b; s > 0; --s) {
    first_blocks[s - 1] = from[s][k];
    k = from[s][k];
  }
  return stages_at_blocks(g, first_blocks, prefix);
}

/// One stage as a graph of its own (see the file comment).
struct stage_graph {
  graph g;
  /// per stage node, the whole graph's node it stands for (the seeded loss's nodes: the sent
  /// value they seed)
  std::vector<node_id> global;
  /// Its inputs holding an earlier stage's value: (stage node, the whole graph's node), in order.
  std::vector<std::pair<node_id, node_id>> received;
  /// Its nodes a later stage reads, in order (the values it sends).
  std::vector<node_id> sent;
  /// Before the last stage: per sent value, the input that takes its gradient back ("grad:").
  std::vector<node_id> gradient_inputs;
};

/// Stage `s` of `g` cut at `stages` (contiguous ranges covering every node, from
/// `stages_at_blocks` or `balanced_stages`). Data inputs it reads are its own inputs of the same
/// name; an earlier stage's value it reads is an input named "recv:" + that value's name, added
/// just before its first reader. Throws `config_error` naming the parameter read by two stages.
[[nodiscard]] inline stage_graph extract_stage(const graph& g, std::span<const node_range> stages,
                                               std::size_t s) {
  const std::string where = "pipeline stage " + std::to_string(s);
  if (s >= stages.size())
    throw config_error(where, "the pipeline has " + std::to_string(stages.size()) + " stages");
  for (std::size_t k = 0; k < stages.size(); ++k)
    if (stages[k].first > stages[k].second ||
        stages[k].first != (k == 0 ? 0 : stages[k - 1].second + 1) ||
        (k + 1 == stages.size() && stages[k].second + 1 != g.size()))
      throw config_error("pipeline stages",
                         "stage " + std::to_string(k) + " does not continue where stage " +
                             (k == 0 ? std::string("-") : std::to_string(k - 1)) +
                             " ends, or the last does not end at the graph's end");
  const auto stage_of = [&](node_id i) {
    for (std::size_t k = 0; k < stages.size(); ++k)
      if (i <= stages[k].second)
        return k;
    return stages.size();
  };
  // a parameter read outside its own stage is shared
  for (node_id i = 0; i < g.size(); ++i)
    for (node_id in : g[i].inputs)
      if (g[in].kind == op::parameter && stage_of(in) != stage_of(i))
        throw config_error("pipeline stages",
                           "parameter " + g[in].name + " is read by stage " +
                               std::to_string(stage_of(in)) + " and stage " +
                               std::to_string(stage_of(i)) + " (" + g[i].name + ")",
                           "each stage updates its own parameters: untie the shared weight, "
                           "or cut the model elsewhere");
  const auto [first, last] = stages[s];
  // each node's first and last reader (none: nobody reads it)
  constexpr node_id none = std::numeric_limits<node_id>::max();
  std::vector<node_id> first_reader(g.size(), none), last_reader(g.size(), none);
  for (node_id j = 0; j < g.size(); ++j)
    for (node_id in : g[j].inputs) {
      first_reader[in] = std::min(first_reader[in], j);
      last_reader[in] = last_reader[in] == none ? j : std::max(last_reader[in], j);
    }
  stage_graph out;
  std::vector<std::optional<node_id>> local(g.size());
  for (node_id i = first; i <= last; ++i) {
    if (g[i].kind == op::input && first_reader[i] > last)
      continue; // data: kept where read (a later stage makes its own)
    node n = g[i];
    for (node_id& in : n.inputs) {
      if (!local[in]) { // an input from before the stage: data, or an earlier stage's value
        node r;
        r.kind = op::input;
        r.out = g[in].out;
        r.type = g[in].type;
        r.name = g[in].kind == op::input ? g[in].name : "recv:" + g[in].name;
        local[in] = out.g.add(r);
        out.global.push_back(in);
        if (g[in].kind != op::input)
          out.received.emplace_back(*local[in], in);
      }
      in = *local[in];
    }
    local[i] = out.g.add(std::move(n));
    out.global.push_back(i);
  }
  for (node_id i = first; i <= last; ++i)
    if (g[i].kind != op::input && last_reader[i] != none && last_reader[i] > last)
      out.sent.push_back(*local[i]);
  if (const auto l = g.loss(); l && *l >= first && *l <= last) {
    out.g.set_loss(*local[*l]);
    return out;
  }
  // the seeded loss (see the file comment)
  std::optional<node_id> total;
  for (node_id x : out.sent) {
    // (copies: adding nodes moves the graph's nodes)
    const auto type = out.g[x].type;
    node gx;
    gx.kind = op::input;
    gx.name = "grad:" + g[out.global[x]].name;
    gx.out = out.g[x].out;
    gx.type = type;
    const node_id gi = out.g.add(gx);
    out.global.push_back(out.global[x]);
    out.gradient_inputs.push_back(gi);
    const auto derived = [&](op kind, std::vector<node_id> inputs, std::string name) {
      node n;
      n.kind = kind;
      n.name = "pipeline.seed." + std::move(name);
      n.inputs = std::move(inputs);
      n.type = type;
      n.out = infer_shape(out.g, n);
      const node_id id = out.g.add(std::move(n));
      out.global.push_back(out.global[x]);
      return id;
    };
    const std::string tag = std::to_string(out.gradient_inputs.size() - 1);
    const node_id product = derived(op::mul, {x, gi}, "mul" + tag);
    const node_id sum = derived(op::sum, {product}, "sum" + tag);
    total = total ? derived(op::add, {*total, sum}, "add" + tag) : sum;
  }
  if (total)
    out.g.set_loss(*total);
  return out;
}

} // namespace hspmd::graph

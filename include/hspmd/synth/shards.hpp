#pragma once
// The integer lengths lowering cuts (program/lower.hpp): a split divides a dimension into
// contiguous ranges by largest remainder of the segment's ratios (core/partition.hpp).
// Dimensions that a plan's rules split together are divided alike, also across a reshape
// ((B, S, H) split along B and (B*S, H) along B*S: B*S in units of S), so linked dimensions form
// classes, each divided in units of the gcd of its members' sizes. The planner uses the same
// lengths to count memory at whole shards (plan.hpp `whole_shard_memory`).

#include <hspmd/core/error.hpp>
#include <hspmd/core/partition.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/synth/plan.hpp>

#include <algorithm>
#include <cstddef>
#include <map>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace hspmd::synth {

namespace detail {

// Classes of (tensor, dimension) that must be divided alike, with their unit counts.
class split_classes {
public:
  explicit split_classes(const graph::graph& g) {
    offset_.resize(g.size() + 1, 0);
    for (graph::node_id i = 0; i < g.size(); ++i)
      offset_[i + 1] = offset_[i] + std::max<std::size_t>(g[i].out.rank(), 1);
    parent_.resize(offset_.back());
    std::iota(parent_.begin(), parent_.end(), 0);
    units_.resize(offset_.back(), 1);
    for (graph::node_id i = 0; i < g.size(); ++i)
      for (std::size_t d = 0; d < g[i].out.rank(); ++d)
        units_[offset_[i] + d] = g[i].out.dims[d];
  }
  void unite(graph::node_id a, std::size_t da, graph::node_id b, std::size_t db) {
    std::size_t x = find(key(a, da));
    std::size_t y = find(key(b, db));
    if (x == y)
      return;
    if (y < x)
      std::swap(x, y);
    parent_[y] = x;
    units_[x] = std::gcd(units_[x], units_[y]);
  }
  [[nodiscard]] std::size_t units(graph::node_id t, std::size_t d) const {
    return units_[find(key(t, d))];
  }

private:
  [[nodiscard]] std::size_t key(graph::node_id t, std::size_t d) const { return offset_.at(t) + d; }
  [[nodiscard]] std::size_t find(std::size_t k) const {
    while (parent_[k] != k)
      k = parent_[k];
    return k;
  }
  std::vector<std::size_t> offset_;
  std::vector<std::size_t> parent_;
  std::vector<std::size_t> units_;
};

// Token-parallel MoE routing is group-local (each rank routes its own tokens into its share of
// the capacity, as GShard's groups): a layer's dispatch and combine must then both run token
// parallel, or both route globally, and the combine's buffers must divide the capacity exactly
// as the dispatch's did. Pairs each combine with the dispatch that shares its probabilities.
inline void pair_moe_routing(split_classes& c, const graph::graph& g, const plan& p) {
  std::map<graph::node_id, const plan_step*> step_of;
  for (const plan_step& s : p.steps)
    step_of[s.node] = &s;
  const auto token_parallel = [](const plan_step& s) { return moe_token_parallel(s.rule); };
  for (const plan_step& s : p.steps) {
    if (g[s.node].kind != graph::op::moe_combine)
      continue;
    const graph::node_id probs = g[s.node].inputs[1];
    const plan_step* dispatch = nullptr;
    if (const auto d = moe_dispatch_of(g, s.node))
      if (const auto it = step_of.find(*d); it != step_of.end())
        dispatch = it->second;
    if (dispatch == nullptr) {
      if (token_parallel(s))
        throw plan_error("lowering",
                         "step " + s.name + " combines token parallel, but no dispatch routes " +
                             g[probs].name,
                         "run this combine replicated, hidden or expert parallel");
      continue;
    }
    if (token_parallel(s) != token_parallel(*dispatch))
      throw plan_error("lowering",
                       "step " + s.name + (token_parallel(s) ? " routes" : " does not route") +
                           " token parallel (per-rank capacity) but its dispatch " +
                           dispatch->name + (token_parallel(s) ? " does not" : " does"),
                       "run both steps of the MoE layer token parallel, or neither");
    if (token_parallel(s))
      c.unite(g[s.node].inputs[0], 1, dispatch->node, 1);
  }
}

// Links the dimensions one step's rule splits together.
inline void link_step(split_classes& c, const graph::graph& g, const plan_step& s) {
  const graph::node& n = g[s.node];
  const graph::rule& r = s.rule;
  if (r.kind != graph::rule::family::split)
    return;
  if (n.kind == graph::op::moe_dispatch || n.kind == graph::op::moe_combine) {
    // Token parallel: tokens and probabilities together; buffers divided on their own.
    // Hidden parallel: tokens' and buffers' hidden dimensions together.
    const auto in0 = r.in[0];
    const auto in1 = r.in[1];
    if (n.kind == graph::op::moe_dispatch && in1.is_split())
      c.unite(n.inputs[0], in0.dim(), n.inputs[1], in1.dim());
    else if (n.kind == graph::op::moe_dispatch)
      c.unite(n.inputs[0], in0.dim(), s.node, r.out.dim());
    else if (in1.is_split())
      c.unite(n.inputs[1], in1.dim(), s.node, r.out.dim());
    else
      c.unite(n.inputs[0], in0.dim(), s.node, r.out.dim());
    return;
  }
  std::optional<std::pair<graph::node_id, std::size_t>> first;
  const auto join = [&](graph::node_id t, placement p) {
    if (!p.is_split())
      return;
    if (first)
      c.unite(first->first, first->second, t, p.dim());
    else
      first = std::pair{t, p.dim()};
  };
  for (std::size_t k = 0; k < r.arity; ++k)
    join(n.inputs[k], r.in[k]);
  join(s.node, r.out);
}

} // namespace detail

/// The classes of plan `p` on graph `g`: every (tensor, dimension)'s unit count, and the
/// lengths each device gets. Throws `plan_error` where the plan's MoE routing cannot be cut.
class shard_classes {
public:
  shard_classes(const graph::graph& g, const plan& p) : g_(&g), classes_(g) {
    for (const plan_step& s : p.steps)
      detail::link_step(classes_, g, s);
    detail::pair_moe_routing(classes_, g, p);
  }
  [[nodiscard]] std::size_t units(graph::node_id t, std::size_t d) const {
    return classes_.units(t, d);
  }
  /// Every device's length along dimension d of tensor t at `ratios` (the segment's vector).
  [[nodiscard]] std::vector<std::size_t> lengths(graph::node_id t, std::size_t d,
                                                 std::span<const double> ratios) const {
    const std::size_t size = (*g_)[t].out.dims.at(d);
    const std::size_t units = classes_.units(t, d);
    auto l = shard_lengths(units, ratios);
    for (auto& x : l)
      x *= size / units;
    return l;
  }

private:
  const graph::graph* g_;
  detail::split_classes classes_;
};

/// Bytes each device keeps for plan `p` at `ratios`, at the whole lengths lowering cuts: the
/// memory model's own accounting (`evaluate` in plan.hpp), with each split tensor's share at its
/// integer length instead of its ratio. With fewer units than devices (sequences of a small
/// batch over many devices) the two differ: a device with 0.03 of a ratio holds a whole row or
/// none.
[[nodiscard]] inline std::vector<double> whole_shard_memory(const plan& p, const cost_model& m,
                                                            const ratio_table& ratios) {
  const graph::graph& g = m.graph();
  const shard_classes classes(g, p);
  const std::size_t n = m.devices();
  std::vector<double> mem(n, gathered_parameter_peak(p.steps, m));
  std::vector<std::vector<double>> blocks; // recomputation blocks' values, while they run
  std::map<std::pair<std::size_t, std::size_t>, std::vector<std::size_t>> cuts;
  const auto add = [&](graph::node_id t, placement where, const linear_cost& c, std::size_t block) {
    std::vector<double>* to = &mem;
    if (block != cost_model::none) {
      if (block >= blocks.size())
        blocks.resize(block + 1);
      blocks[block].resize(n, 0.0);
      to = &blocks[block];
    }
    if (!where.is_split()) {
      for (std::size_t d = 0; d < n; ++d)
        (*to)[d] += value_at(c, ratios, d);
      return;
    }
    const std::size_t dim = where.dim();
    // (shard_classes::lengths, the cut of each unit count and segment made once: tensors of a
    // model share a few, and cutting sorts the devices)
    const std::size_t seg = m.segments().of(t, dim);
    const std::size_t units = classes.units(t, dim);
    auto cut = cuts.find({units, seg});
    if (cut == cuts.end())
      cut = cuts.emplace(std::pair{units, seg}, shard_lengths(units, ratios.at(seg))).first;
    const std::vector<std::size_t>& len = cut->second;
    const std::size_t per_unit = g[t].out.dims[dim] / units;
    const auto extent = static_cast<double>(g[t].out.dims[dim]);
    double per_whole = 0.0; // the bytes of the whole tensor the terms scale
    for (const auto& term : c.terms)
      per_whole += term.second;
    for (std::size_t d = 0; d < n; ++d)
      (*to)[d] += c.constant + per_whole * static_cast<double>(len[d] * per_unit) / extent;
  };
  visit_memory(p, m, add);
  for (std::size_t d = 0; d < n; ++d) {
    double most = 0.0;
    for (const auto& b : blocks)
      most = b.empty() ? most : std::max(most, b[d]);
    mem[d] += most;
  }
  return mem;
}

} // namespace hspmd::synth

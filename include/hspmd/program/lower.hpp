#pragma once
// Lowering: a plan and a rank become that rank's program. Every version of a tensor the plan
// holds (a tensor at one placement) becomes one node of a *local graph* with the rank's piece
// as its shape; ops keep their kind and read the versions their rule names; every transfer
// (load, slice, collective) becomes a node too, filled by the distributed executor.
//
// Integer lengths (synth/shards.hpp): a split divides a dimension into contiguous ranges by
// largest remainder of the segment's ratios (zero-length ranges are legal); dimensions a plan's
// rules split together form classes divided in whole units alike, so ranges line up exactly and
// every rank agrees.
//
//     const auto prog = program::lower(g, plan, rank);   // prog.local: the rank's graph

#include <hspmd/core/error.hpp>
#include <hspmd/core/partition.hpp>
#include <hspmd/core/placement.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/graph/rules.hpp>
#include <hspmd/program/layout.hpp>
#include <hspmd/synth/cost.hpp>
#include <hspmd/synth/plan.hpp>
#include <hspmd/synth/shards.hpp>

#include <cstddef>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hspmd::program {

/// A transfer of the plan, on this rank: it makes local node `target` from local node `source`
/// (a load has no source).
struct lowered_transfer {
  synth::transfer what;
  std::optional<graph::node_id> source;
  graph::node_id target = 0;
};

/// One rank's program.
struct local_program {
  graph::graph local;                 ///< the rank's graph (ids are local)
  std::vector<node_layout> layouts;   ///< per local node
  std::vector<graph::node_id> global; ///< per local node: the tensor (global node) it holds
  std::vector<placement> where;       ///< per local node: the placement of that version
  std::vector<std::vector<std::size_t>> lengths; ///< per local node: every rank's split lengths
  std::vector<std::optional<std::size_t>> transfer_of; ///< per local node: its transfer, if any
  std::vector<lowered_transfer> transfers;
  std::size_t rank = 0;
  std::size_t ranks = 1;

  /// The local node of `tensor` at placement `p`, if the plan holds that version.
  [[nodiscard]] std::optional<graph::node_id> version(graph::node_id tensor, placement p) const {
    const auto it = versions_.find({tensor, graph::code_of(p)});
    if (it == versions_.end())
      return std::nullopt;
    return it->second;
  }

  std::map<std::pair<graph::node_id, std::uint8_t>, graph::node_id> versions_;
};

namespace detail {

[[nodiscard]] inline std::string where_text(const graph::node& n, placement p) {
  return n.name + "@" + p.to_string();
}

} // namespace detail

/// Rank `rank`'s program for plan `p` of graph `g`. Throws `plan_error` when the plan does not
/// fit the graph or uses a rule the executor cannot run yet.
[[nodiscard]] inline local_program lower(const graph::graph& g, const synth::plan& p,
                                         std::size_t rank) {
  const std::size_t ranks = p.device_names.size();
  if (rank >= ranks)
    throw plan_error("lowering",
                     "rank " + std::to_string(rank) + " but the plan has " + std::to_string(ranks) +
                         " devices",
                     "run with as many ranks as the cluster has devices");
  if (!g.loss())
    throw plan_error("lowering", "the graph has no loss", "mark one with tracer::set_loss");
  const synth::segment_map segs(g, p.segments);
  const synth::shard_classes classes(g, p);

  local_program out;
  out.rank = rank;
  out.ranks = ranks;
  // Lengths of every rank along dimension d of tensor t.
  const auto lengths_of = [&](graph::node_id t, std::size_t d) {
    const std::size_t seg = segs.of(t, d);
    if (seg >= p.ratios.size())
      throw plan_error("lowering", "no ratios for segment " + std::to_string(seg),
                       "give the plan one ratio vector per segment");
    return classes.lengths(t, d, p.ratios[seg]);
  };
  const auto layout_of = [&](graph::node_id t, placement where) {
    node_layout l;
    l.global = g[t].out.dims;
    if (where.is_split()) {
      if (where.dim() >= l.global.size())
        throw plan_error("lowering",
                         "tensor " + g[t].name + " split along dimension " +
                             std::to_string(where.dim()) + " of a rank-" +
                             std::to_string(l.global.size()) + " tensor",
                         "regenerate the plan for this graph");
      const auto all = lengths_of(t, where.dim());
      l.split = where.dim();
      l.length = all[rank];
      l.offset = std::accumulate(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(rank),
                                 std::size_t{0});
    }
    l.owner = rank == 0;
    return l;
  };
  const auto add = [&](graph::node n, graph::node_id tensor, placement where,
                       std::optional<std::size_t> transfer) {
    node_layout l = layout_of(tensor, where);
    n.out.dims = l.local_dims();
    const graph::node_id id = out.local.add(std::move(n));
    out.layouts.push_back(std::move(l));
    out.global.push_back(tensor);
    out.where.push_back(where);
    out.lengths.push_back(where.is_split() ? lengths_of(tensor, where.dim())
                                           : std::vector<std::size_t>{});
    out.transfer_of.push_back(transfer);
    out.versions_[{tensor, graph::code_of(where)}] = id;
    return id;
  };
  const auto need = [&](graph::node_id t, placement where, const std::string& step) {
    const auto v = out.version(t, where);
    if (!v)
      throw plan_error("lowering",
                       "step " + step + " reads " + detail::where_text(g[t], where) +
                           ", which no earlier step or transfer makes",
                       "regenerate the plan (synth::synthesize) for this graph");
    return *v;
  };
  const auto do_transfer = [&](const synth::transfer& t, const std::string& step) {
    if (t.tensor >= g.size())
      throw plan_error("lowering", "step " + step + " moves node " + std::to_string(t.tensor),
                       "regenerate the plan for this graph");
    if (out.version(t.tensor, t.to))
      return; // already there
    lowered_transfer lt;
    lt.what = t;
    graph::node n;
    const graph::node& src = g[t.tensor];
    if (t.kind == synth::transfer_kind::load) {
      if (src.kind != graph::op::input && src.kind != graph::op::parameter)
        throw plan_error("lowering", "step " + step + " loads " + src.name + ", a computed tensor",
                         "regenerate the plan for this graph");
      if (t.to.is_partial())
        throw plan_error("lowering", "step " + step + " loads " + src.name + " as partial",
                         "load inputs and parameters replicated or split");
      n = src;
      n.pin.reset();
    } else {
      lt.source = need(t.tensor, t.from, step);
      n.kind = graph::op::input; // a placeholder the distributed executor fills
      n.name = detail::where_text(src, t.to);
      n.type = src.type;
      n.out = src.out;
    }
    lt.target = add(std::move(n), t.tensor, t.to, out.transfers.size());
    out.transfers.push_back(lt);
  };

  for (const synth::plan_step& s : p.steps) {
    if (s.node >= g.size() || g[s.node].name != s.name)
      throw plan_error("lowering", "step " + s.name + " does not name a node of this graph",
                       "regenerate the plan for this graph");
    const graph::node& n = g[s.node];
    const graph::rule& r = s.rule;
    for (const synth::transfer& t : s.transfers)
      if (t.tensor != s.node)
        do_transfer(t, s.name);
    graph::node ln = n;
    ln.pin.reset();
    if (r.arity != n.inputs.size())
      throw plan_error(
          "lowering", "step " + s.name + " has a rule for " + std::to_string(r.arity) + " operands",
          "regenerate the plan for this graph");
    for (std::size_t k = 0; k < n.inputs.size(); ++k)
      ln.inputs[k] = need(n.inputs[k], r.in[k], s.name);
    const graph::node_id id = add(std::move(ln), s.node, r.out, std::nullopt);
    node_layout& l = out.layouts[id];
    l.skip_bias = r.bias_once && !l.owner;
    l.vocab_parallel = r.vocab_parallel;
    graph::node& made = out.local[id];
    if (made.kind == graph::op::reshape || made.kind == graph::op::broadcast)
      made.attrs.dims = made.out.dims;
    for (const synth::transfer& t : s.transfers)
      if (t.tensor == s.node)
        do_transfer(t, s.name);
  }
  const graph::node_id loss = *g.loss();
  const auto lv = out.version(loss, partial{});
  if (!lv)
    throw plan_error("lowering", "the plan never makes the loss " + g[loss].name + " partial",
                     "regenerate the plan (synth::synthesize) for this graph");
  out.local.set_loss(*lv);
  return out;
}

} // namespace hspmd::program

#pragma once
// What activation recomputation runs again: inside each segment of a rank's graph (a model's
// block, graph::block_ranges), the values that only nodes of the segment read are not kept for
// the backward; the backward makes them again just before the segment's backward. A pure
// function of the graph, so the executor (which places their memory, exec/executor.hpp) and the
// step program (which orders the replay, program/step.hpp) cannot disagree about it.
//
//     const auto segs = program::recompute_segments(g, graph::block_ranges(g, "layers."), facts);
//     segs[0].internal;   // the nodes the backward runs again, in forward order

#include <hspmd/core/dtype.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/graph/blocks.hpp>
#include <hspmd/graph/ir.hpp>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace hspmd::program {

/// One recomputation segment: its node range and the nodes the backward runs again.
struct recompute_segment {
  graph::node_id first = 0, last = 0;
  std::vector<graph::node_id> internal; ///< recomputed in the backward, in forward order
};

/// What besides the graph's edges decides which values are kept.
struct recompute_facts {
  /// Input nodes a driver fills again when it replays a segment (values moved from another
  /// rank): recomputed like the others. Empty: every input is kept.
  std::vector<bool> refilled;
  /// (from, to): `to` reads `from`'s value outside the graph's edges (a transfer).
  std::vector<std::pair<graph::node_id, graph::node_id>> extra_users;
  std::vector<graph::node_id> keep; ///< values read after the backward (a driver's own use)
  std::vector<bool> shared;         ///< values placed in a shared buffer of their own (FSDP copies)
  std::vector<bool> swapped; ///< graph::swapped_values of the graph (which permutes are views)
};

/// Nodes of `g` whose value is a view of node `id`'s (reshapes of it, and of those).
[[nodiscard]] inline std::vector<graph::node_id> views_of(const graph::graph& g, graph::node_id id,
                                                          const std::vector<bool>& swapped) {
  std::vector<graph::node_id> out;
  std::vector<bool> of(g.size(), false);
  of[id] = true;
  for (graph::node_id i = id + 1; i < g.size(); ++i)
    if (graph::is_view(g, i, swapped) && of[g[i].inputs[0]]) {
      of[i] = true;
      out.push_back(i);
    }
  return out;
}

/// The segments `ranges` (disjoint node ranges in increasing order) with the nodes each runs
/// again: parameters, integer values, views, kept inputs, the loss, values read outside their
/// segment (through views too), `keep` and `shared` values stay. Throws `plan_error` on ranges
/// that are empty, past the graph or out of order.
[[nodiscard]] inline std::vector<recompute_segment>
recompute_segments(const graph::graph& g,
                   const std::vector<std::pair<graph::node_id, graph::node_id>>& ranges,
                   const recompute_facts& f) {
  constexpr std::size_t none = static_cast<std::size_t>(-1);
  const std::size_t n = g.size();
  std::vector<std::size_t> segment_of(n, none);
  std::vector<recompute_segment> out;
  for (const auto& [first, last] : ranges) {
    if (first > last || last >= n || (!out.empty() && first <= out.back().last))
      throw plan_error("recomputation",
                       "segment [" + std::to_string(first) + ", " + std::to_string(last) +
                           "] is empty, past the graph's " + std::to_string(n) +
                           " nodes or not after the one before",
                       "give disjoint node ranges in increasing order");
    out.push_back({first, last, {}});
    for (graph::node_id i = first; i <= last; ++i)
      segment_of[i] = out.size() - 1;
  }
  const auto view = [&](graph::node_id i) { return graph::is_view(g, i, f.swapped); };
  // A value read (directly or through its views) by a node outside its segment is kept.
  std::vector<graph::node_id> owner(n); // a view's buffer is its source's
  for (graph::node_id i = 0; i < n; ++i)
    owner[i] = view(i) ? owner[g[i].inputs[0]] : i;
  std::vector<bool> kept(n, false);
  for (graph::node_id i = 0; i < n; ++i)
    for (graph::node_id in : g[i].inputs)
      if (segment_of[owner[in]] != segment_of[i])
        kept[owner[in]] = true;
  for (const auto& [from, to] : f.extra_users)
    if (segment_of[owner[from]] != segment_of[to])
      kept[owner[from]] = true;
  for (graph::node_id id : f.keep)
    kept[owner[id]] = true;
  if (g.loss())
    kept[owner[*g.loss()]] = true;
  for (recompute_segment& sg : out)
    for (graph::node_id i = sg.first; i <= sg.last; ++i) {
      const graph::node& node = g[i];
      if (kept[i] || (!f.shared.empty() && f.shared[i]) || view(i) || node.type == dtype::i64 ||
          node.kind == graph::op::parameter ||
          (node.kind == graph::op::input && (f.refilled.empty() || !f.refilled.at(i))))
        continue;
      sg.internal.push_back(i);
    }
  return out;
}

} // namespace hspmd::program

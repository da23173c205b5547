#pragma once
// Planning the memory of intermediate gradients over the reverse sweep.
//
// A node's gradient is live from the backward of its last user (the first to add into it, in
// reverse order) to its own backward; nodes whose lives do not overlap share memory (best fit
// over the reverse sweep). Parameters, the loss, integer nodes, nodes without users and nodes
// the caller keeps get buffers of their own, so their gradients survive the backward.
// A view's input whose gradient is the view's own gradient reinterpreted (`aliases`: a reshape,
// the input's last user, storing it whole; the input's other users add into it after) takes the
// view's memory: its life continues the view's, and the view's backward (a copy) need not run.
//
//     auto plan = exec::plan_gradient_memory(g, sizes, keep, extra_users);
//     plan.pooled[i];         // node i's gradient lies in the shared pool at plan.offset[i]
//     plan.zero_before[i];    // the shared buffers that come into use at node i's backward
//     plan.alias_of[i];       // node i's gradient is this view's gradient, in its memory

#include <hspmd/core/dtype.hpp>
#include <hspmd/graph/ir.hpp>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

namespace hspmd::exec {

/// Where each node's gradient lives (see the file comment).
struct gradient_memory_plan {
  std::vector<bool> pooled;        ///< the gradient lies in the shared pool
  std::vector<std::size_t> offset; ///< ... at this element offset
  std::size_t pool_elements = 0;   ///< the pool's size
  /// Shared buffers that come into use at node i's backward (zero them first).
  std::vector<std::vector<graph::node_id>> zero_before;
  /// Node i's gradient is this node's (a view's) gradient, the same memory (from `aliases`).
  std::vector<std::optional<graph::node_id>> alias_of;
};

/// Plans the gradients of `g` whose element counts are `sizes` (0: no gradient). `extra_users`
/// (from, to): to's backward adds into from's gradient outside the graph's edges (a transfer's
/// dual). `aliases` (input, view): the input's gradient may be the view's, in its memory (the
/// caller vouches that the view stores that gradient whole, as its first writer); taken where
/// the view is the input's last user and both lie in the pool with the same size.
[[nodiscard]] inline gradient_memory_plan
plan_gradient_memory(const graph::graph& g, const std::vector<std::size_t>& sizes,
                     const std::vector<graph::node_id>& keep = {},
                     const std::vector<std::pair<graph::node_id, graph::node_id>>& extra_users = {},
                     const std::vector<std::pair<graph::node_id, graph::node_id>>& aliases = {}) {
  const std::size_t n = g.size();
  std::vector<std::optional<graph::node_id>> last_user(n);
  const auto use = [&](graph::node_id from, graph::node_id to) {
    if (!last_user[from] || *last_user[from] < to)
      last_user[from] = to;
  };
  for (graph::node_id j = 0; j < n; ++j)
    for (graph::node_id in : g[j].inputs)
      use(in, j);
  for (const auto& [from, to] : extra_users)
    use(from, to);
  std::vector<bool> own(n, false);
  for (graph::node_id i = 0; i < n; ++i)
    own[i] = g[i].kind == graph::op::parameter || g[i].type == dtype::i64 || i == *g.loss() ||
             !last_user[i] || sizes[i] == 0;
  for (graph::node_id k : keep)
    own.at(k) = true;
  // Reverse sweep: take a slot when the last user's backward starts, free it after the node's
  // own backward.
  struct slot {
    std::size_t capacity = 0;
    bool busy = false;
  };
  std::vector<slot> slots;
  std::vector<std::size_t> slot_of(n, 0);
  gradient_memory_plan plan;
  plan.zero_before.resize(n);
  plan.alias_of.resize(n);
  std::vector<std::optional<graph::node_id>> continued_by(n); // view -> its aliased input
  for (const auto& [input, view] : aliases)
    if (!own.at(input) && !own.at(view) && sizes[input] == sizes[view] &&
        last_user[input] == view && !continued_by[view]) {
      plan.alias_of[input] = view;
      continued_by[view] = input;
    }
  for (graph::node_id i = 0; i < n; ++i)
    if (!own[i] && !plan.alias_of[i])
      plan.zero_before[*last_user[i]].push_back(i);
  for (graph::node_id c = static_cast<graph::node_id>(n); c-- > 0;) {
    if (continued_by[c]) // the input that continues c's gradient: c's slot
      slot_of[*continued_by[c]] = slot_of[c];
    for (graph::node_id j : plan.zero_before[c]) {
      const std::size_t need = sizes[j];
      // The smallest free slot that fits; else the largest free one, grown; else a new one.
      std::optional<std::size_t> best;
      for (std::size_t k = 0; k < slots.size(); ++k)
        if (!slots[k].busy && slots[k].capacity >= need &&
            (!best || slots[k].capacity < slots[*best].capacity))
          best = k;
      for (std::size_t k = 0; k < slots.size() && !best; ++k)
        if (!slots[k].busy)
          best = k;
      for (std::size_t k = 0; k < slots.size(); ++k)
        if (!slots[k].busy && slots[*best].capacity < need &&
            slots[k].capacity > slots[*best].capacity)
          best = k;
      if (!best) {
        slots.push_back({});
        best = slots.size() - 1;
      }
      slots[*best].capacity = std::max(slots[*best].capacity, need);
      slots[*best].busy = true;
      slot_of[j] = *best;
    }
    if (!own[c] && !continued_by[c])
      slots[slot_of[c]].busy = false;
  }
  std::vector<std::size_t> start(slots.size() + 1, 0);
  for (std::size_t k = 0; k < slots.size(); ++k)
    start[k + 1] = start[k] + slots[k].capacity;
  plan.pool_elements = start.back();
  plan.pooled.assign(n, false);
  plan.offset.assign(n, 0);
  for (graph::node_id i = 0; i < n; ++i) {
    plan.pooled[i] = !own[i];
    if (!own[i])
      plan.offset[i] = start[slot_of[i]];
  }
  return plan;
}

} // namespace hspmd::exec

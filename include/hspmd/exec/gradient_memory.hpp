#pragma once
// Planning the executor's shared memory: intermediate gradients over the reverse sweep, working
// copies by their lives, recomputed values by segment, and which gradients need no zeroing.
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
#include <hspmd/program/recompute.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
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

/// Offsets in one buffer (elements) and its size: `first_fit_values` and `segment_placement`.
struct shared_placement {
  std::vector<std::size_t> offset;
  std::size_t total = 0;
};

/// Working copies in one shared buffer where their lives do not overlap: `lives` holds (node,
/// the last node whose forward or backward reads its value); first fit in node order, each
/// value at a multiple of `align` elements. `offset[k]` is entry k's.
[[nodiscard]] inline shared_placement
first_fit_values(const graph::graph& g,
                 const std::vector<std::pair<graph::node_id, graph::node_id>>& lives,
                 std::size_t align) {
  struct placed {
    std::size_t offset, size;
    graph::node_id last;
  };
  std::vector<placed> done;
  shared_placement out;
  out.offset.assign(lives.size(), 0);
  std::vector<std::size_t> order(lives.size());
  for (std::size_t k = 0; k < order.size(); ++k)
    order[k] = k;
  std::ranges::sort(order, {}, [&](std::size_t k) { return lives[k].first; });
  for (std::size_t k : order) {
    const auto [id, last] = lives[k];
    const std::size_t size = (g[id].out.size() + align - 1) / align * align;
    std::vector<std::pair<std::size_t, std::size_t>> busy; // [offset, end) live at `id`
    for (const placed& p : done)
      if (p.last >= id)
        busy.emplace_back(p.offset, p.offset + p.size);
    std::ranges::sort(busy);
    std::size_t at = 0;
    for (const auto& [lo, hi] : busy) {
      if (lo >= at + size)
        break;
      at = std::max(at, hi);
    }
    out.offset[k] = at;
    done.push_back({at, size, last});
    out.total = std::max(out.total, at + size);
  }
  return out;
}

/// The recomputed values of every segment in one buffer the segments take turns in: a
/// segment's values one after another from 0 (each at a multiple of `align` elements), the
/// buffer the largest segment's. `offset[node]` (0 for nodes of no segment).
[[nodiscard]] inline shared_placement
segment_placement(const graph::graph& g, const std::vector<program::recompute_segment>& segments,
                  std::size_t align) {
  shared_placement out;
  out.offset.assign(g.size(), 0);
  for (const program::recompute_segment& sg : segments) {
    std::size_t at = 0;
    for (graph::node_id i : sg.internal) {
      out.offset[i] = at;
      at += (g[i].out.size() + align - 1) / align * align;
    }
    out.total = std::max(out.total, at);
  }
  return out;
}

/// Which backward writes each gradient first in the reverse sweep, and whether it stores it
/// whole (`first_writes_of`).
struct first_writes {
  std::vector<std::uint32_t> assign; ///< node i's backward stores input k's gradient (bit k)
  std::vector<bool> stored_whole;    ///< node j's gradient is stored by its first writer
};

/// The first writer of each gradient (its user of the largest id) stores it whole instead of
/// adding into a zeroed buffer where: the user's kernel says so for that input (`assigns(op)`,
/// kernels/registry.hpp `kernel_assigns`), reads the node through one input only, nothing outside
/// the graph's edges adds into the gradient (`extra_users`: a transfer's dual), and the node is
/// not the loss. `stored_by_dual`: nodes whose dual is their only writer and stores. Such
/// gradients are not zeroed before the backward: a memory pass fewer per activation and
/// parameter (the zeroing was ~5 % of a BERT-small step on the host).
template <class Assigns>
[[nodiscard]] first_writes
first_writes_of(const graph::graph& g,
                const std::vector<std::pair<graph::node_id, graph::node_id>>& extra_users,
                const std::vector<graph::node_id>& stored_by_dual, Assigns assigns) {
  const std::size_t n = g.size();
  std::vector<std::optional<graph::node_id>> first(n);
  for (graph::node_id j = 0; j < n; ++j)
    for (graph::node_id in : g[j].inputs)
      if (!first[in] || *first[in] < j)
        first[in] = j;
  std::vector<std::size_t> external(n, 0);
  for (const auto& [from, to] : extra_users)
    ++external.at(from);
  first_writes out;
  out.assign.assign(n, 0U);
  out.stored_whole.assign(n, false);
  for (graph::node_id i = 0; i < n; ++i) {
    const graph::node& node = g[i];
    if (node.type == dtype::i64) // (no backward runs)
      continue;
    const std::uint32_t can = assigns(node.kind);
    for (std::size_t k = 0; k < node.inputs.size() && k < 32; ++k) {
      const graph::node_id j = node.inputs[k];
      if (((can >> k) & 1U) == 0 || external[j] != 0 || first[j] != i || g[j].type == dtype::i64 ||
          j == *g.loss() || std::ranges::count(node.inputs, j) != 1)
        continue; // (the loss's gradient holds the backward's seed)
      out.assign[i] |= 1U << k;
      out.stored_whole[j] = true;
    }
  }
  for (graph::node_id j : stored_by_dual) // its dual is its only writer
    if (j < n && !first[j] && external[j] == 1 && j != *g.loss() && g[j].type != dtype::i64)
      out.stored_whole[j] = true;
  return out;
}

} // namespace hspmd::exec

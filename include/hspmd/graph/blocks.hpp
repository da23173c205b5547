#pragma once
// A model's blocks (its repeated layers) as node ranges, and which values activation
// recomputation does not keep: the one rule that the executor (exec::executor::recompute) runs
// and the planner (synth/cost.hpp) prices.
//
// A block is named by its parameters: "layers.3.attn.wq" belongs to block "layers.3". Its range
// runs from its first parameter (created at its first use) to the last node that reads one of
// its parameters, or a rank's moved copy of one ("layers.3.attn.wq@..." in a lowered graph);
// blocks whose ranges overlap (shared weights) are merged. In a lowered graph, copies moved in
// just before the first parameter that only the block reads belong to it too (the planner counts
// a copy for a block's op in the block). Under recomputation a value computed
// inside a block and read only by nodes of the same block (through views too) is not kept for
// the backward: it is computed again when the backward reaches the block.

#include <hspmd/graph/ir.hpp>
#include <hspmd/graph/ops.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hspmd::graph {

/// An inclusive range of node ids.
using node_range = std::pair<node_id, node_id>;

/// The blocks of `g` whose parameters are named `prefix` + block + "." + ..., in node order (see
/// the file comment); empty when no parameter has the prefix.
[[nodiscard]] inline std::vector<node_range> block_ranges(const graph& g,
                                                          std::string_view prefix = "layers.") {
  constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
  std::vector<std::string> blocks; // in first-use order
  std::vector<node_range> range;
  std::vector<std::size_t> block_of(g.size(), none);
  for (node_id i = 0; i < g.size(); ++i) {
    const std::string& name = g[i].name;
    if (g[i].kind != op::parameter || !name.starts_with(prefix))
      continue;
    const std::string block = name.substr(0, name.find('.', prefix.size()));
    auto it = std::find(blocks.begin(), blocks.end(), block);
    if (it == blocks.end()) {
      blocks.push_back(block);
      range.emplace_back(i, i);
      it = blocks.end() - 1;
    }
    block_of[i] = static_cast<std::size_t>(it - blocks.begin());
  }
  for (node_id i = 0; i < g.size(); ++i) {
    const std::string& name = g[i].name;
    const std::size_t at = name.find('@');
    if (at == std::string::npos || !name.starts_with(prefix))
      continue;
    if (const auto p = g.find(std::string_view(name).substr(0, at)); p && block_of[*p] != none) {
      block_of[i] = block_of[*p];
      auto& r = range[block_of[i]];
      r = {std::min(r.first, i), std::max(r.second, i)};
    }
  }
  for (node_id i = 0; i < g.size(); ++i)
    for (node_id in : g[i].inputs)
      if (block_of[in] != none)
        range[block_of[in]].second = std::max(range[block_of[in]].second, i);
  std::ranges::sort(range);
  std::vector<node_range> out;
  for (const auto& r : range) {
    if (!out.empty() && r.first <= out.back().second)
      out.back().second = std::max(out.back().second, r.second);
    else
      out.push_back(r);
  }
  // In a rank's program, the copies moved in for a block's first op ("x@..." inputs) may come
  // just before the block's first parameter: those only the block reads belong to it.
  std::vector<node_id> last_reader(g.size(), 0);
  std::vector<bool> read(g.size(), false);
  for (node_id i = 0; i < g.size(); ++i)
    for (node_id in : g[i].inputs) {
      last_reader[in] = std::max(last_reader[in], i);
      read[in] = true;
    }
  for (std::size_t k = 0; k < out.size(); ++k) {
    auto& [first, last] = out[k];
    const node_id floor = k == 0 ? 0 : out[k - 1].second + 1;
    while (first > floor && g[first - 1].kind == op::input &&
           g[first - 1].name.find('@') != std::string::npos && read[first - 1] &&
           last_reader[first - 1] <= last)
      --first;
  }
  return out;
}

/// Whether node `n` of `g` is a view of its input (a reshape that reads its input's elements
/// where they lie: same type, no more elements).
[[nodiscard]] inline bool is_view(const graph& g, const node& n) {
  return view(n.kind) == view_kind::reshaped && n.inputs.size() == 1 &&
         g[n.inputs[0]].type == n.type && g[n.inputs[0]].out.size() >= n.out.size();
}

/// Per node of `g`: whether its value lies with dimensions 1 and 2 exchanged, so that a permute
/// {0, 2, 1, 3} next to a batched matmul is not a copy (exec::executor reads and writes such
/// values by strides): a permute of a rank-4 value that only batched matmuls read (it lies in
/// its input's order), or a rank-4 batched matmul that only such a permute reads (it lies in
/// the permute's order; the permute is then a view of it).
[[nodiscard]] inline std::vector<bool> swapped_values(const graph& g) {
  const std::size_t n = g.size();
  std::vector<std::size_t> users(n, 0);
  std::vector<bool> only_bmm(n, true);
  std::vector<node_id> last_user(n, 0);
  for (node_id i = 0; i < n; ++i)
    for (node_id in : g[i].inputs) {
      ++users[in];
      last_user[in] = i;
      if (g[i].kind != op::batched_matmul || g[i].out.rank() != 4)
        only_bmm[in] = false;
    }
  const auto loss = g.loss();
  const auto swap = [&](node_id i) {
    const node& p = g[i];
    return view(p.kind) == view_kind::strided && p.inputs.size() == 1 && p.out.rank() == 4 &&
           p.type != dtype::i64 && g[p.inputs[0]].type == p.type && (!loss || *loss != i) &&
           p.attrs.dims == std::vector<std::size_t>{0, 2, 1, 3};
  };
  std::vector<bool> out(n, false);
  for (node_id i = 0; i < n; ++i)
    out[i] = swap(i) && users[i] > 0 && only_bmm[i];
  for (node_id i = 0; i < n; ++i) // a product read only by a permute that is not swapped itself
    if (g[i].kind == op::batched_matmul && g[i].out.rank() == 4 && users[i] == 1 &&
        (!loss || *loss != i) && swap(last_user[i]) && !out[last_user[i]] &&
        g[last_user[i]].inputs[0] == i)
      out[i] = true;
  return out;
}
/// Whether node `i` of `g` is a view given `swapped_values(g)`: a reshape (`is_view`), a
/// swapped permute, or a permute of a swapped product.
[[nodiscard]] inline bool is_view(const graph& g, node_id i, const std::vector<bool>& swapped) {
  const node& x = g[i];
  return is_view(g, x) || (view(x.kind) == view_kind::strided && !swapped.empty() &&
                           (swapped[i] || (x.inputs.size() == 1 && swapped[x.inputs[0]])));
}

/// Where each node lies among `ranges` (disjoint, in order) and which values recomputation does
/// not keep.
struct block_layout {
  static constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
  std::vector<node_range> ranges;
  std::vector<std::size_t> block_of; ///< per node: the range holding it, or `none`
  /// Per node: its value is computed again in the backward instead of kept (see the file
  /// comment; parameters, inputs, views, integer values and the loss are kept).
  std::vector<bool> recomputed;
  /// Per node: the block all of its readers (through views too) lie in (a working copy of it
  /// made for them lives only there), or `none`.
  std::vector<std::size_t> readers_in;
};

/// The layout of `ranges` over `g` (from `block_ranges`); `extra_readers` (from, to): node to
/// reads from's value outside the graph's edges.
[[nodiscard]] inline block_layout
layout_blocks(const graph& g, std::vector<node_range> ranges,
              const std::vector<std::pair<node_id, node_id>>& extra_readers = {}) {
  constexpr std::size_t none = block_layout::none;
  const std::size_t n = g.size();
  block_layout b;
  b.ranges = std::move(ranges);
  b.block_of.assign(n, none);
  for (std::size_t k = 0; k < b.ranges.size(); ++k)
    for (node_id i = b.ranges[k].first; i <= b.ranges[k].second && i < n; ++i)
      b.block_of[i] = k;
  const std::vector<bool> swapped = swapped_values(g);
  const auto view = [&](node_id i) { return is_view(g, i, swapped); };
  std::vector<node_id> owner(n); // a view's value is its source's
  for (node_id i = 0; i < n; ++i)
    owner[i] = view(i) ? owner[g[i].inputs[0]] : i;
  std::vector<bool> kept(n, false);
  b.readers_in.assign(n, none);
  std::vector<bool> read(n, false);
  const auto note_reader = [&](node_id t, std::size_t at) {
    if (!read[t]) {
      read[t] = true;
      b.readers_in[t] = at;
    } else if (b.readers_in[t] != at) {
      b.readers_in[t] = none;
    }
  };
  // A reader of a view reads its source's buffer too (a working copy's view is the copy's).
  const auto reads = [&](node_id from, node_id to) {
    if (b.block_of[owner[from]] != b.block_of[to])
      kept[owner[from]] = true;
    note_reader(from, b.block_of[to]);
    for (node_id v = from; v != owner[v];) {
      v = g[v].inputs[0];
      note_reader(v, b.block_of[to]);
    }
  };
  for (node_id i = 0; i < n; ++i)
    for (node_id in : g[i].inputs)
      reads(in, i);
  for (const auto& [from, to] : extra_readers)
    reads(from, to);
  if (const auto loss = g.loss())
    kept[owner[*loss]] = true;
  b.recomputed.assign(n, false);
  for (node_id i = 0; i < n; ++i) {
    const node& x = g[i];
    b.recomputed[i] = b.block_of[i] != none && !kept[i] && !view(i) && x.type != dtype::i64 &&
                      x.kind != op::parameter && x.kind != op::input;
  }
  return b;
}

} // namespace hspmd::graph

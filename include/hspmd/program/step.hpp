#pragma once
// The step program: one rank's training step as one ordered list of instructions. Lowering
// (program/lower.hpp) makes the rank's graph; `build` orders its work: every op's forward and
// every transfer in graph order, the loss's all-reduce, then in reverse the backward with the
// recomputed blocks' replays, the FSDP copies gathered again, the gradient buckets posted as the
// backward completes them, SFB's gradients and the wait for the buckets, then the gradient
// norm and the optimizer. The distributed executor (exec/distributed.hpp) runs the list and
// names each instruction it traces after it; the simulator (sim/step.hpp) prices the very same
// list, device by device. A new schedule is a new program, not new executor code.
//
//     const program::local_program lp = program::lower(g, plan, rank);
//     const program::step_program sp = program::build(lp, g, {.bucket_bytes = 4 << 20});
//     for (const program::instruction& i : sp.code)
//       std::cout << program::name(i, lp, g) << "\n";   // "forward fc1", "all_gather w2", ...
//
// One-level SPMD plans give every rank the same list (lengths differ, the order does not).

#include <hspmd/graph/blocks.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/program/lower.hpp>
#include <hspmd/program/recompute.hpp>
#include <hspmd/synth/transfer.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hspmd::program {

/// What an instruction does.
enum class code : std::uint8_t {
  forward,   ///< local op `node`'s forward
  move,      ///< transfer making local node `node` (a collective or a local cut)
  loss,      ///< all-reduce of the loss (ends the forward)
  replay,    ///< `node`'s forward again in the backward (a recomputed op, or its transfer)
  regather,  ///< FSDP copy `node` gathered again before a reader's backward or replay
  backward,  ///< local op `node`'s backward
  move_back, ///< the dual of the transfer making `node` (its gradient moved back)
  post,      ///< starts the all-reduce of gradient bucket `bucket` (non-blocking)
  sfb,       ///< parameter `node`'s gradient by sufficient-factor broadcasting
  wait,      ///< waits for every bucket and unpacks the sums
  norm,      ///< all-reduce of the gradient's squared norm
  update,    ///< the optimizer on the rank's shards
};
inline constexpr std::size_t code_count = 12;

[[nodiscard]] constexpr std::string_view name(code c) noexcept {
  constexpr std::array<std::string_view, code_count> names = {
      "forward",   "move", "loss", "replay", "regather", "backward",
      "move_back", "post", "sfb",  "wait",   "norm",     "update"};
  return names.at(static_cast<std::size_t>(c));
}

/// One instruction of a step program.
struct instruction {
  code op = code::forward;
  graph::node_id node = 0; ///< the local node it concerns (forward ... move_back, sfb)
  std::size_t bucket = 0;  ///< the gradient bucket (post)
  friend bool operator==(const instruction&, const instruction&) = default;
};

/// The parts of a step the driver calls one by one.
enum class section : std::uint8_t { forward, backward, optimizer };

/// Replicated parameters' gradients all-reduced together.
struct gradient_bucket {
  std::vector<graph::node_id> params; ///< local parameter versions, packed in this order
  std::size_t elements = 0;
  graph::node_id ready_at = 0; ///< every gradient is final once this node's backward ran
};

/// How to build a program.
struct step_options {
  std::size_t bucket_bytes = 4 << 20;   ///< bytes of gradients per bucket (`--bucket-mb`)
  std::size_t element_bytes = 4;        ///< bytes of one gradient element
  bool recompute = false;               ///< activation recomputation over the model's blocks
  std::string block_prefix = "layers."; ///< parameters naming a block (graph::block_ranges)
};

/// One rank's step.
struct step_program {
  std::vector<instruction> code;
  std::array<std::size_t, 4> begins{}; ///< where each section starts (and the end)
  std::vector<gradient_bucket> buckets;
  std::vector<graph::node_id> sfb; ///< parameters whose gradient SFB makes (not a bucket)
  /// FSDP working copies: (copy, its last reader in the forward), in graph order.
  std::vector<std::pair<graph::node_id, graph::node_id>> gathered;
  std::vector<recompute_segment> segments; ///< with recomputation, its segments
  recompute_facts recompute;               ///< what decided them (for the executor's memory)

  [[nodiscard]] std::span<const instruction> part(section s) const {
    const auto k = static_cast<std::size_t>(s);
    return std::span<const instruction>(code).subspan(begins[k], begins[k + 1] - begins[k]);
  }
  /// Index in `code` of the first instruction of section `s`.
  [[nodiscard]] std::size_t begin(section s) const { return begins[static_cast<std::size_t>(s)]; }
};

/// The only node of `g` reading `w`, if exactly one does.
[[nodiscard]] inline std::optional<graph::node_id> sole_user(const graph::graph& g,
                                                             graph::node_id w) {
  std::optional<graph::node_id> user;
  for (graph::node_id i = 0; i < g.size(); ++i)
    for (graph::node_id in : g[i].inputs)
      if (in == w) {
        if (user)
          return std::nullopt;
        user = i;
      }
  return user;
}

/// SFB for replicated weight `w` (a local node) read by exactly one matmul / linear with a
/// row-split input: the input rows and the output gradient are all-gathered and each rank
/// computes the whole weight gradient. False when the weight has another use (its all-reduce
/// then covers every contribution).
[[nodiscard]] inline bool sfb_applies(const local_program& lp, graph::node_id w) {
  const std::optional<graph::node_id> user = sole_user(lp.local, w);
  if (!user)
    return false;
  const graph::node& op = lp.local[*user];
  if ((op.kind != graph::op::linear && op.kind != graph::op::matmul) || op.inputs[1] != w)
    return false;
  const node_layout& lx = lp.layouts[op.inputs[0]];
  return lx.split && *lx.split + 1 < lx.global.size();
}
/// The op reading SFB weight `w` (see `sfb_applies`).
[[nodiscard]] inline graph::node_id sfb_user(const local_program& lp, graph::node_id w) {
  return *sole_user(lp.local, w);
}

/// Whether local node `i` is made by a transfer other than a load (a `move`).
[[nodiscard]] inline bool is_moved(const local_program& lp, graph::node_id i) {
  const auto t = lp.transfer_of[i];
  return t && lp.transfers[*t].what.kind != synth::transfer_kind::load;
}
/// Whether local node `i` is a load (an input or a parameter: nothing to run).
[[nodiscard]] inline bool is_load(const local_program& lp, graph::node_id i) {
  const auto t = lp.transfer_of[i];
  return t && lp.transfers[*t].what.kind == synth::transfer_kind::load;
}

/// The step program of rank program `lp` (a lowering of a plan of global graph `g`).
[[nodiscard]] inline step_program build(const local_program& lp, const graph::graph& g,
                                        const step_options& o = {}) {
  const graph::graph& l = lp.local;
  const auto n = static_cast<graph::node_id>(l.size());
  step_program sp;
  const std::vector<bool> swapped = graph::swapped_values(l);

  // FSDP: a parameter kept in shards and all-gathered for use is a working copy, read from the
  // gather to its last reader (views' readers and versions moved from it included); the
  // backward gathers it again before that reader's backward.
  std::vector<bool> gathered(n, false);
  for (graph::node_id i = 0; i < n; ++i) {
    const auto t = lp.transfer_of[i];
    if (!t || lp.transfers[*t].what.kind != synth::transfer_kind::all_gather ||
        g[lp.global[i]].kind != graph::op::parameter || l[i].type == dtype::i64)
      continue;
    std::vector<bool> reads(n, false);
    reads[i] = true;
    for (graph::node_id v : views_of(l, i, swapped))
      reads[v] = true;
    graph::node_id last = i;
    for (graph::node_id j = i + 1; j < n; ++j) {
      for (graph::node_id in : l[j].inputs)
        if (reads[in])
          last = j;
      const auto tj = lp.transfer_of[j];
      if (tj && lp.transfers[*tj].source && reads[*lp.transfers[*tj].source])
        last = j;
    }
    sp.gathered.emplace_back(i, last);
    gathered[i] = true;
  }

  // Replicated parameters' gradients: by SFB where the plan chose it and it applies, else
  // all-reduced in buckets formed in the order the backward completes them (a gradient is final
  // after the backward of the first node, in graph order, that reads the parameter).
  if (lp.ranks > 1) {
    std::vector<graph::node_id> first_use(n, n);
    for (graph::node_id i = 0; i < n; ++i) {
      for (graph::node_id in : l[i].inputs)
        first_use[in] = std::min(first_use[in], i);
      if (const auto t = lp.transfer_of[i]; t && lp.transfers[*t].source)
        first_use[*lp.transfers[*t].source] = std::min(first_use[*lp.transfers[*t].source], i);
    }
    std::vector<graph::node_id> params;
    for (const lowered_transfer& t : lp.transfers) {
      if (t.what.kind != synth::transfer_kind::load ||
          g[t.what.tensor].kind != graph::op::parameter || !t.what.to.is_replicated())
        continue;
      if (t.what.sfb && sfb_applies(lp, t.target))
        sp.sfb.push_back(t.target);
      else
        params.push_back(t.target);
    }
    std::ranges::stable_sort(params, std::ranges::greater{},
                             [&](graph::node_id p) { return first_use[p]; });
    const std::size_t per_bucket =
        std::max<std::size_t>(1, o.bucket_bytes / std::max<std::size_t>(o.element_bytes, 1));
    for (graph::node_id p : params) {
      const std::size_t elements = l[p].type == dtype::i64 ? 0 : l[p].out.size();
      if (sp.buckets.empty() ||
          (sp.buckets.back().elements > 0 && sp.buckets.back().elements + elements > per_bucket))
        sp.buckets.emplace_back();
      gradient_bucket& b = sp.buckets.back();
      const graph::node_id ready = first_use[p] == n ? n - 1 : first_use[p];
      b.ready_at = b.params.empty() ? ready : std::min(b.ready_at, ready);
      b.params.push_back(p);
      b.elements += elements;
    }
  }

  // Recomputation: per segment, what its replay runs in node order: its inner nodes, and the
  // FSDP copies they read gathered again where the forward gathered them (a copy gathered
  // before the segment goes first).
  struct replay_item {
    graph::node_id node;
    bool gather;
  };
  std::vector<std::vector<replay_item>> replay_at(n);
  if (o.recompute) {
    recompute_facts& f = sp.recompute;
    f.refilled.assign(n, false);
    for (graph::node_id i = 0; i < n; ++i)
      f.refilled[i] = is_moved(lp, i); // a replay runs the transfer again
    for (const lowered_transfer& t : lp.transfers)
      if (t.source)
        f.extra_users.emplace_back(*t.source, t.target);
    for (graph::node_id w : sp.sfb) // SFB reads its layer's input after the backward
      f.keep.push_back(l[sfb_user(lp, w)].inputs[0]);
    f.shared = gathered;
    f.swapped = swapped;
    sp.segments = recompute_segments(l, graph::block_ranges(l, o.block_prefix), f);
    for (const recompute_segment& sg : sp.segments) {
      std::vector<bool> read(n, false);
      const auto note = [&](graph::node_id src) {
        while (!gathered[src] && l[src].kind == graph::op::reshape && !l[src].inputs.empty())
          src = l[src].inputs[0]; // a view's value is its source's
        read[src] = read[src] || gathered[src];
      };
      for (graph::node_id j : sg.internal) {
        for (graph::node_id in : l[j].inputs)
          note(in);
        if (const auto t = lp.transfer_of[j]; t && lp.transfers[*t].source)
          note(*lp.transfers[*t].source); // a version moved from a copy
      }
      std::vector<replay_item>& items = replay_at[sg.last];
      for (graph::node_id k = 0; k < sg.first; ++k)
        if (read[k])
          items.push_back({k, true});
      std::size_t next = 0;
      for (graph::node_id k = sg.first; k <= sg.last; ++k) {
        if (read[k])
          items.push_back({k, true});
        if (next < sg.internal.size() && sg.internal[next] == k) {
          items.push_back({k, false});
          ++next;
        }
      }
    }
  }
  std::vector<std::vector<graph::node_id>> regather_at(n);
  for (const auto& [copy, last] : sp.gathered)
    regather_at[last].push_back(copy);

  // ---- the list
  std::vector<instruction>& c = sp.code;
  sp.begins[0] = 0;
  for (graph::node_id i = 0; i < n; ++i)
    if (!is_load(lp, i))
      c.push_back({is_moved(lp, i) ? code::move : code::forward, i, 0});
  c.push_back({code::loss, 0, 0});
  sp.begins[1] = c.size();
  std::size_t next = 0;
  for (graph::node_id i = n; i-- > 0;) {
    for (const replay_item& r : replay_at[i])
      c.push_back({r.gather ? code::regather : code::replay, r.node, 0});
    for (graph::node_id k : regather_at[i])
      c.push_back({code::regather, k, 0});
    if (!is_load(lp, i))
      c.push_back({is_moved(lp, i) ? code::move_back : code::backward, i, 0});
    for (; next < sp.buckets.size() && sp.buckets[next].ready_at >= i; ++next)
      c.push_back({code::post, 0, next});
  }
  for (; next < sp.buckets.size(); ++next)
    c.push_back({code::post, 0, next});
  for (graph::node_id w : sp.sfb)
    c.push_back({code::sfb, w, 0});
  if (!sp.buckets.empty())
    c.push_back({code::wait, 0, 0});
  sp.begins[2] = c.size();
  c.push_back({code::norm, 0, 0});
  c.push_back({code::update, 0, 0});
  sp.begins[3] = c.size();
  return sp;
}

/// The transfer making local node `i` (for move, move_back, regather and a replayed move).
[[nodiscard]] inline const synth::transfer& transfer_at(const local_program& lp, graph::node_id i) {
  return lp.transfers.at(lp.transfer_of.at(i).value()).what;
}

/// The name of instruction `i` in traces, simulated and run alike: "forward fc1", "backward
/// fc1", "all_gather w2" (a move: its kind and tensor), "reduce_scatter w2" (the move's dual),
/// "replay fc1", "regather w2", "post bucket 0", "sfb w3", "wait for gradients",
/// "all_reduce loss", "all_reduce gradient norm", "optimizer".
[[nodiscard]] inline std::string name(const instruction& i, const local_program& lp,
                                      const graph::graph& g) {
  const auto tensor = [&] { return g[lp.global.at(i.node)].name; };
  const auto moved = [&](bool back) {
    const synth::transfer& t = transfer_at(lp, i.node);
    return std::string(synth::name(back ? synth::dual(t.kind) : t.kind)) + " " + tensor();
  };
  switch (i.op) {
  case code::forward:
    return "forward " + tensor();
  case code::move:
    return moved(false);
  case code::loss:
    return "all_reduce loss";
  case code::replay:
    return "replay " + (is_moved(lp, i.node) ? moved(false) : tensor());
  case code::regather:
    return "regather " + tensor();
  case code::backward:
    return "backward " + tensor();
  case code::move_back:
    return moved(true);
  case code::post:
    return "post bucket " + std::to_string(i.bucket);
  case code::sfb:
    return "sfb " + tensor();
  case code::wait:
    return "wait for gradients";
  case code::norm:
    return "all_reduce gradient norm";
  case code::update:
    return "optimizer";
  }
  return "?";
}

} // namespace hspmd::program

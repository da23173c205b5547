#pragma once
// How a pipeline's boundary values move between groups (exec/pipeline.hpp): box to box, rank to
// rank. Each rank of the producing group holds its box of a value -- its stage plan's version
// of it: a piece, or the whole on every replica -- and each rank of a reading group needs the
// box its own plan loads (the bounding box of the versions the input is loaded into there).
// A needing rank takes the intersection with every distinct held box from one holder of that
// box (the replicas of a box share the sending by the reader's index in its group), so a group
// that splits the value along the batch receives its piece only, and a piece goes straight
// from the rank that computed it to the rank that reads it. Gradients go back reversed: each
// reading rank adds its versions' gradients (pieces, and replicas' partial sums) into its box
// and sends the part each producing rank loads of the gradient; the producer adds up what
// arrives. Where a producing plan keeps only partial sums of a value, its group adds them
// first (exec/whole_tensors.hpp) and every rank then holds the whole.
//
// Every rank knows every box without communicating: each stage's plan is lowered here for its
// group's first rank, and a lowering names the box of every rank of the group.
//
// Sends are non-blocking (a blocking one can wait on a receive that its peer posts after its
// own send); receives block where the value is needed.

#include <hspmd/exec/pipeline_boundaries.hpp>
#include <hspmd/exec/reshard.hpp>
#include <hspmd/graph/stages.hpp>
#include <hspmd/program/lower.hpp>
#include <hspmd/program/pipeline_plan.hpp>

#include <algorithm>
#include <cstddef>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace hspmd::exec {

/// Per rank of a stage's group (by its index in the group): a box.
using group_boxes = std::vector<box>;

/// The smallest box holding both (an empty one adds nothing).
[[nodiscard]] inline box bounding(const box& a, const box& b) {
  if (a.empty())
    return b;
  if (b.empty())
    return a;
  box out = a;
  for (std::size_t d = 0; d < a.offset.size(); ++d) {
    out.offset[d] = std::min(a.offset[d], b.offset[d]);
    out.length[d] = std::max(a.offset[d] + a.length[d], b.offset[d] + b.length[d]) - out.offset[d];
  }
  return out;
}

/// Per rank of `prog`'s group: the bounding box of the versions that input `input` of `g` (the
/// graph `prog` was lowered from) is loaded into; an empty box where none is.
[[nodiscard]] inline group_boxes loaded_boxes(const program::local_program& prog,
                                              const graph::graph& g, graph::node_id input) {
  const std::vector<std::size_t>& dims = g[input].out.dims;
  group_boxes out(prog.ranks, box{std::vector<std::size_t>(dims.size(), 0),
                                  std::vector<std::size_t>(dims.size(), 0)});
  for (const program::lowered_transfer& t : prog.transfers)
    if (t.what.kind == synth::transfer_kind::load && t.what.tensor == input) {
      const group_boxes b = boxes_of(prog, t.target);
      for (std::size_t r = 0; r < out.size(); ++r)
        out[r] = bounding(out[r], b[r]);
    }
  return out;
}

/// Every boundary value's boxes on every rank (see the file comment).
struct boundary_layouts {
  struct sent_value {
    std::vector<std::size_t> dims;         ///< the whole value's
    std::optional<graph::node_id> version; ///< the local version read; none: partial sums only
    group_boxes held;                      ///< per producing rank
    group_boxes gradient_needed;           ///< per producing rank: the box of the gradient it loads
  };
  std::vector<std::vector<sent_value>> sent; ///< per stage, per value it sends
  /// (reading stage, whole-graph node): per rank of the reading group, the box it loads.
  std::map<std::pair<std::size_t, graph::node_id>, group_boxes> needed;

  boundary_layouts() = default;
  boundary_layouts(const graph::graph& g, std::span<const graph::node_range> cuts,
                   const program::pipeline_plan& plan)
      : sent(cuts.size()) {
    for (std::size_t k = 0; k < cuts.size(); ++k) {
      const graph::stage_graph sg = graph::extract_stage(g, cuts, k);
      const program::local_program prog = program::lower(sg.g, plan.stages.at(k), 0);
      for (std::size_t q = 0; q < sg.sent.size(); ++q) {
        sent_value v;
        v.dims = sg.g[sg.sent[q]].out.dims;
        for (graph::node_id i = 0; i < prog.local.size() && !v.version; ++i)
          if (prog.global[i] == sg.sent[q] && !prog.where[i].is_partial())
            v.version = i;
        v.held =
            v.version ? boxes_of(prog, *v.version) : group_boxes(prog.ranks, box::whole(v.dims));
        if (q < sg.gradient_inputs.size())
          v.gradient_needed = loaded_boxes(prog, sg.g, sg.gradient_inputs[q]);
        sent[k].push_back(std::move(v));
      }
      for (const auto& [local, global] : sg.received)
        needed[{k, global}] = loaded_boxes(prog, sg.g, local);
    }
  }
};

/// The point-to-point traffic of one rank's boundary values (see the file comment).
template <class T, class Comm>
class boundary_transfers {
public:
  boundary_transfers() = default;
  boundary_transfers(Comm& world, const program::pipeline_plan& plan, boundary_layouts l)
      : world_(&world), plan_(&plan), l_(std::move(l)) {
    const auto me = static_cast<std::size_t>(world.rank());
    index_ = me - plan.first_rank(plan.group_of(me));
  }

  /// Forward: sends this rank's part of stage k's value q (whole-graph node `global`; `piece`:
  /// the rank's held box of it, row-major) to the ranks of stage `reader` that need it.
  void send_value(std::span<const T> piece, std::size_t k, std::size_t q, graph::node_id global,
                  std::size_t reader, int tag) {
    const group_boxes& held = l_.sent.at(k).at(q).held;
    const box& mine = held.at(index_);
    const std::vector<std::size_t> holders = holders_of(held, mine);
    const group_boxes& need = l_.needed.at({reader, global});
    for (std::size_t c = 0; c < need.size(); ++c) {
      const box part = intersect(mine, need[c]);
      if (!part.empty() && holders[c % holders.size()] == index_)
        send(piece, mine, part, rank_of(reader, c), tag);
    }
  }
  /// Forward: receives into `whole` (the value's size) the box this rank of stage `reader`
  /// needs of stage k's value q; elements outside it are left as they are.
  void receive_value(std::span<T> whole, std::size_t k, std::size_t q, graph::node_id global,
                     std::size_t reader, int tag) {
    const group_boxes& held = l_.sent.at(k).at(q).held;
    const box& need = l_.needed.at({reader, global}).at(index_);
    const box all = box::whole(l_.sent[k][q].dims);
    for (std::size_t j = 0; j < held.size(); ++j) {
      if (std::find(held.begin(), held.begin() + static_cast<std::ptrdiff_t>(j), held[j]) !=
          held.begin() + static_cast<std::ptrdiff_t>(j))
        continue; // (a replica of a box already taken)
      const box part = intersect(held[j], need);
      if (part.empty())
        continue;
      const std::vector<std::size_t> holders = holders_of(held, held[j]);
      receive(whole, all, part, rank_of(k, holders[index_ % holders.size()]), tag, false);
    }
  }
  /// Backward: sends from `whole` (this rank of stage `reader`'s gradient contributions to
  /// stage k's value q, inside its needed box) what each producing rank loads of it.
  void send_gradient(std::span<const T> whole, std::size_t k, std::size_t q, graph::node_id global,
                     std::size_t reader, int tag) {
    const boundary_layouts::sent_value& v = l_.sent.at(k).at(q);
    const box& mine = l_.needed.at({reader, global}).at(index_);
    const box all = box::whole(v.dims);
    for (std::size_t j = 0; j < v.gradient_needed.size(); ++j) {
      const box part = intersect(mine, v.gradient_needed[j]);
      if (!part.empty())
        send(whole, all, part, rank_of(k, j), tag);
    }
  }
  /// Backward: adds into `whole` (this rank of stage k; the gradient of its value q) what the
  /// ranks of stage `reader` send of it.
  void receive_gradient(std::span<T> whole, std::size_t k, std::size_t q, graph::node_id global,
                        std::size_t reader, int tag) {
    const boundary_layouts::sent_value& v = l_.sent.at(k).at(q);
    const box& mine = v.gradient_needed.at(index_);
    const box all = box::whole(v.dims);
    const group_boxes& need = l_.needed.at({reader, global});
    for (std::size_t c = 0; c < need.size(); ++c) {
      const box part = intersect(need[c], mine);
      if (!part.empty())
        receive(whole, all, part, rank_of(reader, c), tag, true);
    }
  }

  /// Stage k's value q: the local version this rank reads it from (none: partial sums only).
  [[nodiscard]] std::optional<graph::node_id> version(std::size_t k, std::size_t q) const {
    return l_.sent.at(k).at(q).version;
  }
  /// This rank's box of stage k's value q.
  [[nodiscard]] const box& held(std::size_t k, std::size_t q) const {
    return l_.sent.at(k).at(q).held.at(index_);
  }
  /// Elements this rank has received so far (values and gradients).
  [[nodiscard]] std::size_t elements_received() const noexcept { return received_; }

  /// Drives the sends in flight; forgets the finished ones.
  void progress() {
    while (!sends_.empty() && world_->test(sends_.front().request))
      sends_.pop_front();
  }
  /// Waits for every send in flight.
  void finish() {
    for (pending& p : sends_)
      world_->wait(p.request);
    sends_.clear();
  }

private:
  struct pending {
    typename Comm::request request;
    std::vector<T> data;
  };
  static std::vector<std::size_t> holders_of(const group_boxes& held, const box& b) {
    std::vector<std::size_t> out;
    for (std::size_t j = 0; j < held.size(); ++j)
      if (held[j] == b)
        out.push_back(j);
    return out;
  }
  [[nodiscard]] int rank_of(std::size_t stage, std::size_t index) const {
    return static_cast<int>(plan_->first_rank(stage % plan_->devices()) + index);
  }
  void send(std::span<const T> from, const box& in, const box& part, int to, int tag) {
    sends_.push_back({{}, std::vector<T>(part.size())});
    pending& p = sends_.back();
    copy_box(from.data(), in, p.data.data(), part, part);
    p.request = world_->start_send(std::span<const T>(p.data), to, tag);
  }
  void receive(std::span<T> into, const box& out, const box& part, int from, int tag, bool add) {
    scratch_.resize(part.size());
    world_->recv(std::span<T>(scratch_), from, tag);
    copy_box(scratch_.data(), part, into.data(), out, part, add);
    received_ += part.size();
  }

  Comm* world_ = nullptr;
  const program::pipeline_plan* plan_ = nullptr;
  boundary_layouts l_;
  std::size_t index_ = 0;
  std::deque<pending> sends_;
  std::vector<T> scratch_;
  std::size_t received_ = 0;
};

} // namespace hspmd::exec

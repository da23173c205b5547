#pragma once
// The executor's memory plans (exec/executor.hpp runs the nodes over this memory; where values
// and gradients live: exec/executor_storage.hpp): intermediate gradients whose lives do not
// overlap share one pool, working copies are placed by their lives, recomputed values take
// turns in the segments' buffer, and a few values keep their own order or buffer for a driver
// (the plans themselves: exec/gradient_memory.hpp, program/recompute.hpp). Each is set before
// the executor first runs.

#include <hspmd/core/error.hpp>
#include <hspmd/exec/executor_storage.hpp>
#include <hspmd/exec/gradient_memory.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/program/layout.hpp>
#include <hspmd/program/recompute.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace hspmd::exec {

/// Which part of a node's backward runs (a split backward, `executor_memory::split_backward`):
/// all of it, the gradients of its activation inputs, or those of its weight-side inputs.
enum class backward_part : std::uint8_t { whole, inputs, weights };

/// The memory of an executor of element type T on backend B (see the file comment).
template <std::floating_point T, backend B = host_backend>
class executor_memory : public executor_storage<T, B> {
  using storage = executor_storage<T, B>;

public:
  /// Activation recomputation: inside each segment [first, last] of node ids (disjoint, in
  /// order; a model's blocks, see `scope_segments`), the values that only nodes of the segment
  /// read are not kept for the backward: all segments' such values share one buffer of the
  /// largest segment's size, and the backward runs a segment's forward again just before the
  /// segment's backward (dropout masks are drawn from the step, the node and the element, so
  /// they come out the same). Parameters, inputs, the loss, values read outside their segment
  /// (through views too) and values placed by `share_value_buffers` are kept. Costs one more
  /// forward of the segments per step; gradients are bit-identical. Call before the executor
  /// first runs; returns the shared buffer's bytes.
  ///
  /// `refilled` (one flag per node, or empty): input nodes that the driver fills again when it
  /// replays a segment (exec/distributed.hpp: values moved from another rank); they are
  /// recomputed like the others. Other inputs are kept. `extra_users` (from, to): to reads
  /// from's value outside the graph's edges (a transfer); `keep`: values read after the backward
  /// (a driver's own use). A recomputed value read from outside the executor (`value`) after the
  /// forward holds whatever segment ran last.
  std::size_t
  recompute(const std::vector<std::pair<graph::node_id, graph::node_id>>& segments,
            const std::vector<bool>& refilled = {},
            const std::vector<std::pair<graph::node_id, graph::node_id>>& extra_users = {},
            const std::vector<graph::node_id>& keep = {}) {
    if (!segment_of_.empty())
      throw plan_error("executor", "recomputation segments are already set", "call recompute once");
    if (!weight_side_.empty())
      throw config_error("executor", "recomputation with a split backward",
                         "recompute or split the backward, not both");
    const std::size_t n = g_.size();
    program::recompute_facts facts;
    facts.refilled = refilled;
    facts.extra_users = extra_users;
    facts.keep = keep;
    facts.shared = shared_;
    facts.swapped = s_.swapped;
    segments_ = program::recompute_segments(g_, segments, facts);
    segment_of_.assign(n, none_segment);
    for (std::size_t k = 0; k < segments_.size(); ++k)
      for (graph::node_id i = segments_[k].first; i <= segments_[k].last; ++i)
        segment_of_[i] = k;
    const shared_placement at = segment_placement(g_, segments_, 16); // as share_value_buffers
    recompute_pool_ = this->template allocate_for<T>(
        segments_.empty() ? 0 : segments_.front().first, at.total, "recomputed values");
    for (const segment& sg : segments_)
      for (graph::node_id i : sg.internal) {
        s_.value_views[i] = std::span<T>(recompute_pool_.data() + at.offset[i], g_[i].out.size());
        s_.values[i] = backend_.template allocate<T>(0); // (frees it, if the executor ran)
        placed_[i] = true;
      }
    point_views();
    return at.total * sizeof(T);
  }
  /// The recomputation segments (after `recompute`): range and the nodes run again.
  using segment = program::recompute_segment;
  [[nodiscard]] const std::vector<segment>& recompute_segments() const noexcept {
    return segments_;
  }
  /// The recomputation segment whose last node is `i`, or nullptr.
  [[nodiscard]] const segment* segment_ending_at(graph::node_id i) const {
    if (segment_of_.empty() || segment_of_[i] == none_segment)
      return nullptr;
    const segment& sg = segments_[segment_of_[i]];
    return sg.last == i ? &sg : nullptr;
  }
  /// Shares the memory of intermediate gradients whose lives do not overlap
  /// (exec/gradient_memory.hpp). Parameters, the loss, nodes without users and `keep` keep
  /// buffers of their own, so their gradients survive the backward; every other node's gradient
  /// is valid only during the backward. `extra_users` (from, to): to's backward adds into from's
  /// gradient outside the graph's edges (a transfer's dual). `stored_by_dual`: nodes whose
  /// gradient their dual can store whole instead of adding; where that dual is the only writer
  /// (the node has no user in the graph and one extra user), the gradient is not zeroed and
  /// `gradient_stored_whole` says so: the driver then stores. Returns the bytes of gradient
  /// storage after.
  std::size_t reuse_gradient_buffers(
      const std::vector<graph::node_id>& keep = {},
      const std::vector<std::pair<graph::node_id, graph::node_id>>& extra_users = {},
      const std::vector<graph::node_id>& stored_by_dual = {}) {
    if (pool_.size() != 0 || std::ranges::any_of(pooled_, [](bool p) { return p; }))
      throw plan_error("executor", "gradient buffers are already shared",
                       "call reuse_gradient_buffers once, before the first backward");
    std::vector<std::size_t> sizes(g_.size());
    for (graph::node_id i = 0; i < g_.size(); ++i)
      sizes[i] = gradient_size(i);
    extra_users_ = extra_users;
    stored_by_dual_ = stored_by_dual;
    plan_first_writes();
    // A reshape that stores its input's gradient whole (its last user) hands it its own
    // gradient's memory: the two are the same elements in the same order.
    std::vector<std::pair<graph::node_id, graph::node_id>> aliases;
    for (graph::node_id i = 0; i < g_.size(); ++i)
      if (is_view(i) && (s_.assign[i] & 1U) != 0U)
        aliases.emplace_back(g_[i].inputs[0], i);
    const auto plan = plan_gradient_memory(g_, sizes, keep, extra_users, aliases);
    try {
      pool_ = backend_.template allocate<T>(plan.pool_elements);
    } catch (const device_error& e) {
      throw device_error(e.device(), "allocate",
                         e.reason() + " for the shared gradient buffers (" +
                             std::to_string(plan.pool_elements) + " elements)",
                         e.fix());
    }
    std::size_t bytes = pool_.size() * sizeof(T);
    for (graph::node_id i = 0; i < g_.size(); ++i) {
      pooled_[i] = plan.pooled[i];
      zero_before_[i] = plan.zero_before[i];
      if (plan.alias_of[i])
        gradient_in_place_[*plan.alias_of[i]] = true;
      if (!pooled_[i]) {
        bytes += gradient_size(i) * sizeof(T);
        continue;
      }
      s_.grads[i] = std::span<T>(pool_.data() + plan.offset[i], gradient_size(i));
      own_grad_[i] = backend_.template allocate<T>(0); // (frees it, if the executor ran)
    }
    return bytes;
  }
  /// Gives node `id`'s gradient a buffer of its own, so that it survives the backward (a
  /// pipeline stage's input, whose gradient goes back to the previous stage afterwards, see
  /// exec/pipeline.hpp). After `reuse_gradient_buffers`, before the executor first runs.
  void keep_gradient(graph::node_id id) {
    if (materialized_)
      throw plan_error("executor", "keep_gradient after the executor ran",
                       "keep the gradient before the first forward");
    if (!pooled_.at(id))
      return;
    own_grad_[id] = this->template allocate_for<T>(id, gradient_size(id), "gradient");
    const std::span<T> own(own_grad_[id].data(), own_grad_[id].size());
    // the views whose gradient it continues (in place), and views of those
    std::vector<bool> alias(g_.size(), false);
    alias[id] = true;
    for (graph::node_id v = id + 1; v < g_.size(); ++v)
      if (gradient_in_place_[v] && !g_[v].inputs.empty() && alias[g_[v].inputs[0]] &&
          s_.grads[v].data() == s_.grads[id].data()) {
        alias[v] = true;
        s_.grads[v] = std::span<T>(own.data(), s_.grads[v].size());
      }
    s_.grads[id] = own;
    pooled_[id] = false;
  }
  /// Nodes whose values are read outside the graph's edges (a transfer's source, a driver's
  /// own use): they keep their elements in their own order, not as a strided view (see
  /// `is_view`). Before the executor first runs.
  void keep_element_order(const std::vector<graph::node_id>& nodes) {
    for (graph::node_id id : nodes)
      if (this->swapped(id)) {
        if (materialized_)
          throw plan_error("executor", "keep_element_order after the executor ran",
                           "call it before the first forward");
        s_.swapped[id] = false;
        s_.value_views[id] = {}; // its own buffer, allocated with the others
        for (graph::node_id j = id + 1; j < g_.size(); ++j) // a permute viewing it: its own too
          if (g_[j].kind == graph::op::permute && g_[j].inputs.size() == 1 && g_[j].inputs[0] == id)
            s_.value_views[j] = {};
      }
  }
  /// Places the values of working copies in one shared buffer where their lives do not overlap:
  /// `lives` holds (node, the last node whose forward or backward reads its value, views'
  /// readers included). A driver that makes such a value again before the backward of its last
  /// reader (exec/distributed.hpp: FSDP-gathered parameters) needs the buffer only while the
  /// copy is in use, forward and backward. First fit in node order; the views of those nodes
  /// follow. Call once, before the first forward. Returns the shared buffer's bytes.
  std::size_t
  share_value_buffers(const std::vector<std::pair<graph::node_id, graph::node_id>>& lives) {
    if (value_pool_.size() != 0)
      throw plan_error("executor", "value buffers are already shared",
                       "call share_value_buffers once");
    if (!segment_of_.empty())
      throw plan_error("executor", "share_value_buffers after recompute",
                       "share the working copies first, then set the recomputation segments");
    // Every copy starts on a 64-byte line.
    const shared_placement at = first_fit_values(g_, lives, 16);
    value_pool_ = this->template allocate_for<T>(lives.empty() ? 0 : lives.front().first, at.total,
                                                 "shared value");
    for (std::size_t k = 0; k < lives.size(); ++k) {
      const graph::node_id id = lives[k].first;
      s_.value_views[id] = std::span<T>(value_pool_.data() + at.offset[k], g_[id].out.size());
      s_.values[id] = backend_.template allocate<T>(0); // (frees it, if the executor ran)
      placed_[id] = true;
      shared_[id] = true;
    }
    point_views();
    return at.total * sizeof(T);
  }

  /// Split backward (a zero-bubble pipeline's, exec/pipeline.hpp): `weight_side` (one flag per
  /// node) marks the nodes whose values come from parameters alone (the parameters, and what is
  /// computed or moved from them only). Each backward then runs in two parts
  /// (`executor::backward_node` with a `backward_part`): the *inputs* part writes the
  /// gradients of activations, which the previous stage waits for; the *weights* part, later,
  /// those of weight-side nodes and so the parameters'. What the weights part reads stays until
  /// then: its activation inputs (kept per activation slot) and, for each node that reads a
  /// weight-side value, the node's own gradient, which gets a buffer of its own in every slot.
  /// After `reuse_gradient_buffers` and `set_activation_slots`, before the executor first runs;
  /// not with recomputation (its segments' values do not stay).
  void split_backward(std::vector<bool> weight_side) {
    if (weight_side.size() != g_.size())
      throw plan_error("executor",
                       std::to_string(weight_side.size()) + " weight-side flags for " +
                           std::to_string(g_.size()) + " nodes",
                       "give one flag per node");
    if (materialized_)
      throw plan_error("executor", "split_backward after the executor ran",
                       "split the backward before the first forward");
    if (!segments_.empty())
      throw config_error("executor", "a split backward with recomputation",
                         "recompute or split the backward, not both");
    weight_side_ = std::move(weight_side);
    for (graph::node_id i = 0; i < g_.size(); ++i)
      if (reads_weights(i)) {
        keep_gradient(i);
        this->hold_gradient_in_slots(i);
      }
  }
  [[nodiscard]] bool splits_backward() const noexcept { return !weight_side_.empty(); }
  /// Whether node `id` is weight-side (see `split_backward`).
  [[nodiscard]] bool weight_side(graph::node_id id) const {
    return !weight_side_.empty() && weight_side_.at(id);
  }
  /// Whether node `id` is an activation that reads a weight-side value (a split backward runs
  /// its backward in both parts).
  [[nodiscard]] bool reads_weights(graph::node_id id) const {
    if (weight_side_.empty() || weight_side_.at(id) || g_[id].type == dtype::i64)
      return false;
    return std::ranges::any_of(g_[id].inputs, [&](graph::node_id j) {
      return weight_side_[j] && g_[j].type != dtype::i64;
    });
  }
  /// Whether node `id`'s backward has something to do in `part`.
  [[nodiscard]] bool has_backward_part(graph::node_id id, backward_part part) const {
    switch (part) {
    case backward_part::whole:
      return true;
    case backward_part::inputs:
      return !weight_side(id);
    case backward_part::weights:
      return weight_side(id) || reads_weights(id);
    }
    return true;
  }
  /// Input k of node `id`'s gradient is written in `part` (a bit per input).
  [[nodiscard]] std::uint32_t wanted_inputs(graph::node_id id, backward_part part) const {
    if (part == backward_part::whole || weight_side(id))
      return ~0U;
    std::uint32_t mask = 0;
    for (std::size_t k = 0; k < g_[id].inputs.size() && k < 32; ++k)
      if (weight_side_[g_[id].inputs[k]] == (part == backward_part::weights))
        mask |= 1U << k;
    return mask;
  }

protected:
  executor_memory(const graph::graph& g, std::uint64_t seed,
                  std::vector<program::node_layout> layouts, B backend)
      : storage(g, seed, std::move(layouts), std::move(backend)) {}

  using storage::backend_;
  using storage::extra_users_;
  using storage::g_;
  using storage::gradient_in_place_;
  using storage::gradient_size;
  using storage::is_view;
  using storage::materialized_;
  using storage::own_grad_;
  using storage::placed_;
  using storage::plan_first_writes;
  using storage::point_views;
  using storage::pool_;
  using storage::pooled_;
  using storage::s_;
  using storage::shared_;
  using storage::stored_by_dual_;
  using storage::value_pool_;
  using storage::zero_before_;

private:
  template <class E>
  using buffer = typename B::template buffer<E>;

  buffer<T> recompute_pool_; // the recomputed segments' values (recompute)
  static constexpr std::size_t none_segment = static_cast<std::size_t>(-1);
  std::vector<std::size_t> segment_of_; // node i's recomputation segment, or none_segment
  std::vector<segment> segments_;
  std::vector<bool> weight_side_; // (split_backward; empty: not split)
};

} // namespace hspmd::exec

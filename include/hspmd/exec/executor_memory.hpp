#pragma once
// The executor's memory (exec/executor.hpp runs the nodes over it): where every node's value and
// gradient lives, and the plans that share it -- intermediate gradients whose lives do not
// overlap, working copies placed by their lives, recomputed values that the segments take turns
// in, views that read their input's buffer, and gradients that their first writer stores whole
// instead of a zeroed buffer (the plans themselves: exec/gradient_memory.hpp). Values and
// gradients other than the parameters' are allocated when the executor first runs, so what a
// plan places in shared memory is never allocated on its own.

#include <hspmd/core/error.hpp>
#include <hspmd/exec/backends/host.hpp>
#include <hspmd/exec/gradient_memory.hpp>
#include <hspmd/exec/op_profile.hpp>
#include <hspmd/exec/parameter_init.hpp>
#include <hspmd/graph/blocks.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/graph/ops.hpp>
#include <hspmd/kernels/backend.hpp>
#include <hspmd/kernels/registry.hpp>
#include <hspmd/program/layout.hpp>
#include <hspmd/program/recompute.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace hspmd::exec {

/// The storage of an executor of element type T on backend B (see the file comment).
template <std::floating_point T, backend B = host_backend>
class executor_memory {
public:
  using backend_type = B;

  [[nodiscard]] const graph::graph& graph() const noexcept { return g_; }
  [[nodiscard]] B& backend() noexcept { return backend_; }
  [[nodiscard]] const B& backend() const noexcept { return backend_; }

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
    recompute_pool_ = allocate_for<T>(segments_.empty() ? 0 : segments_.front().first, at.total,
                                      "recomputed values");
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
    own_grad_[id] = allocate_for<T>(id, gradient_size(id), "gradient");
    const std::span<T> own(own_grad_[id].data(), own_grad_[id].size());
    for (graph::node_id v = 0; v < g_.size(); ++v) // a view whose gradient it continues
      if (v != id && gradient_in_place_[v] && !g_[v].inputs.empty() && g_[v].inputs[0] == id &&
          s_.grads[v].data() == s_.grads[id].data())
        s_.grads[v] = own;
    s_.grads[id] = own;
    pooled_[id] = false;
  }
  /// Node `id`'s value. The const overload reads what is allocated: parameters, inputs, and
  /// every other node once the executor has run (before that it throws naming the node).
  /// (A node whose elements lie with dimensions 1 and 2 exchanged, `swapped`, is refused:
  /// `value_storage` and `gradient_storage` give its buffer as it lies.)
  [[nodiscard]] std::span<T> value(graph::node_id id) {
    in_order("value", id);
    return value_storage(id);
  }
  /// Node `id`'s value as it lies in memory, swapped or not.
  [[nodiscard]] std::span<T> value_storage(graph::node_id id) {
    if (s_.value_views.at(id).size() != value_size(id))
      materialize();
    return s_.value_views[id];
  }
  /// Node `id`'s gradient as it lies in memory, swapped or not.
  [[nodiscard]] std::span<T> gradient_storage(graph::node_id id) {
    if (s_.grads.at(id).size() != gradient_size(id))
      materialize();
    return s_.grads[id];
  }
  /// Whether node `id`'s value and gradient lie with dimensions 1 and 2 exchanged: a permute
  /// {0, 2, 1, 3} that batched matmuls read by strides (in its input's order), or a batched
  /// matmul that writes in the order of the permute reading it (graph::swapped_values).
  [[nodiscard]] bool swapped(graph::node_id id) const {
    return id < s_.swapped.size() && s_.swapped[id];
  }
  [[nodiscard]] std::span<const T> value(graph::node_id id) const {
    in_order("value", id);
    allocated("value", id, s_.value_views.at(id).size() == value_size(id));
    return s_.value_views[id];
  }
  /// Nodes whose values are read outside the graph's edges (a transfer's source, a driver's
  /// own use): they keep their elements in their own order, not as a strided view (see
  /// `is_view`). Before the executor first runs.
  void keep_element_order(const std::vector<graph::node_id>& nodes) {
    for (graph::node_id id : nodes)
      if (swapped(id)) {
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
  /// A copy of node `id`'s value in host memory (through the backend: any backend).
  [[nodiscard]] std::vector<T> value_to_host(graph::node_id id) {
    return to_host(std::span<const T>(value(id)));
  }
  /// A copy of node `id`'s gradient in host memory (valid after the backward that made it).
  [[nodiscard]] std::vector<T> grad_to_host(graph::node_id id) {
    return to_host(std::span<const T>(grad(id)));
  }
  /// Overwrites node `id`'s value (a parameter's, typically) from host memory.
  void value_from_host(graph::node_id id, std::span<const T> data) {
    const std::span<T> v = value(id);
    if (data.size() != v.size())
      throw shape_error("node \"" + g_[id].name + "\"",
                        std::to_string(data.size()) + " values for " + std::to_string(v.size()) +
                            " elements",
                        "one value per element of the node's (local) shape");
    backend_.copy_from_host(v.data(), data.data(), data.size());
  }

  /// Node `id`'s gradient (the const overload: as `value`).
  [[nodiscard]] std::span<T> grad(graph::node_id id) {
    in_order("gradient", id);
    return gradient_storage(id);
  }
  [[nodiscard]] std::span<const T> grad(graph::node_id id) const {
    in_order("gradient", id);
    allocated("gradient", id, s_.grads.at(id).size() == gradient_size(id));
    return s_.grads[id];
  }
  /// Whether node `id`'s gradient is stored whole by its first writer in the backward, so that
  /// it is never zeroed (see `plan_first_writes`); after the executor first runs.
  [[nodiscard]] bool gradient_stored_whole(graph::node_id id) const {
    return first_written_.at(id);
  }
  /// The value of an integer node (token ids, labels).
  [[nodiscard]] std::span<std::int64_t> ids(graph::node_id id) { return s_.ids.at(id); }
  [[nodiscard]] std::span<const std::int64_t> ids(graph::node_id id) const { return s_.ids.at(id); }
  /// The layout of a node; nullptr when the graph is not a local one.
  [[nodiscard]] const program::node_layout* layout(graph::node_id id) const {
    return s_.layouts.empty() ? nullptr : &s_.layouts.at(id);
  }

  /// Sets node `id`'s `node_layout::base` (a two-level plan's node: its rows' first element in
  /// the whole batch's tensor).
  void set_element_base(graph::node_id id, std::size_t base) { s_.layouts.at(id).base = base; }

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
    value_pool_ =
        allocate_for<T>(lives.empty() ? 0 : lives.front().first, at.total, "shared value");
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
  /// Nodes whose value is a view of node `id`'s (reshapes of it, and of those).
  [[nodiscard]] std::vector<graph::node_id> views_of(graph::node_id id) const {
    return program::views_of(g_, id, s_.swapped);
  }

  /// The parameter node named `name`; throws `plan_error` when there is none.
  [[nodiscard]] graph::node_id parameter(std::string_view name) const {
    const auto id = g_.find(name);
    if (!id || g_[*id].kind != graph::op::parameter)
      throw plan_error("executor", "no parameter named \"" + std::string(name) + "\"",
                       "use the qualified name, e.g. layers.0.fc1.weight");
    return *id;
  }

  /// Activation slots, for a pipeline stage that holds several micro-batches at once
  /// (exec/pipeline.hpp): `n` sets of the storage a forward fills and its backward reads -- the
  /// values the executor places when it first runs (inputs included), the integer inputs and
  /// what kernels save for their backward -- of which one is in use at a time
  /// (`use_activation_slot`). Parameters, gradients (each backward makes its own), working
  /// copies placed by `share_value_buffers` and recomputed values (made again before use) are
  /// one set. Call before the executor first runs; the peak holds `n` sets.
  void set_activation_slots(std::size_t n) {
    if (n == 0)
      throw config_error("executor", "0 activation slots", "give at least 1");
    if (materialized_)
      throw plan_error("executor", "activation slots set after the executor ran",
                       "call set_activation_slots before the first forward");
    slots_.resize(n);
    for (std::size_t k = 1; k < n; ++k) {
      slots_[k].ids.resize(g_.size());
      for (graph::node_id i = 0; i < g_.size(); ++i)
        if (g_[i].type == dtype::i64)
          slots_[k].ids[i] = allocate_for<std::int64_t>(i, g_[i].out.size(), "ids");
    }
  }
  [[nodiscard]] std::size_t activation_slots() const noexcept {
    return slots_.empty() ? 1 : slots_.size();
  }
  /// Makes slot `k` the one forwards fill and backwards read (its values stay as the last
  /// forward in it left them).
  void use_activation_slot(std::size_t k) {
    if (k >= activation_slots())
      throw config_error("executor",
                         "activation slot " + std::to_string(k) + " of " +
                             std::to_string(activation_slots()),
                         "give set_activation_slots enough slots");
    materialize();
    if (k == slot_)
      return;
    swap_slot(slots_[slot_]); // the active set goes to its slot ...
    swap_slot(slots_[k]);     // ... and slot k's becomes the active one
    slot_ = k;
    for (graph::node_id i = 0; i < g_.size(); ++i)
      if (slotted_[i])
        s_.value_views[i] =
            arena_offset_[i] != not_in_arena
                ? std::span<T>(value_arena_.data() + arena_offset_[i], value_size(i))
                : std::span<T>(s_.values[i].data(), s_.values[i].size());
    point_views();
  }
  [[nodiscard]] std::size_t activation_slot() const noexcept { return slot_; }
  /// Bytes the activation slots hold now, every slot counted: the values placed when the
  /// executor first ran and what kernels saved for their backward (allocated by the first
  /// forward in a slot). What a pipeline stage's micro-batches in flight cost.
  [[nodiscard]] std::size_t activation_bytes() const {
    std::size_t bytes = value_arena_.size() * sizeof(T);
    const auto add_node_buffers = [&](const auto& values, const auto& saved, const auto& index) {
      for (graph::node_id i = 0; i < g_.size(); ++i) {
        if (i < values.size() && !slotted_.empty() && slotted_[i] &&
            arena_offset_[i] == not_in_arena)
          bytes += values[i].size() * sizeof(T);
        if (i < saved.size())
          bytes += saved[i].size() * sizeof(T);
        if (i < index.size())
          bytes += index[i].size() * sizeof(std::size_t);
      }
    };
    add_node_buffers(s_.values, s_.saved, s_.saved_index);
    for (std::size_t k = 0; k < slots_.size(); ++k)
      if (k != slot_) {
        bytes += slots_[k].arena.size() * sizeof(T);
        add_node_buffers(slots_[k].values, slots_[k].saved, slots_[k].saved_index);
      }
    return bytes;
  }

  /// Gradient accumulation over micro-batches: parameters' gradients are not zeroed by a
  /// backward but added to, until `zero_parameter_gradients`. Call before the executor first runs
  /// (a parameter's first writer then adds instead of storing).
  void set_accumulate_parameter_gradients(bool on) {
    if (materialized_)
      throw plan_error("executor", "gradient accumulation set after the executor ran",
                       "call set_accumulate_parameter_gradients before the first forward");
    accumulate_ = on;
  }
  [[nodiscard]] bool accumulates_parameter_gradients() const noexcept { return accumulate_; }
  /// Zeroes every parameter's gradient (the start of an accumulated step).
  void zero_parameter_gradients() {
    for (graph::node_id i : g_.parameters())
      fill(backend_, s_.grads[i].data(), s_.grads[i].size(), T{});
  }

protected:
  // See executor's constructor.
  executor_memory(const graph::graph& g, std::uint64_t seed,
                  std::vector<program::node_layout> layouts, B backend)
      : g_(g), backend_(std::move(backend)) {
    if (!g.loss())
      throw plan_error("executor", "the graph has no loss", "mark one with tracer::set_loss");
    if (!layouts.empty() && layouts.size() != g.size())
      throw plan_error("executor",
                       std::to_string(layouts.size()) + " layouts for " + std::to_string(g.size()) +
                           " nodes",
                       "give one layout per node or none");
    s_.layouts = std::move(layouts);
    const std::size_t n = g.size();
    s_.values.resize(n);
    s_.value_views.resize(n);
    s_.ids.resize(n);
    s_.grads.resize(n);
    s_.saved.resize(n);
    s_.saved_index.resize(n);
    own_grad_.resize(n);
    pooled_.assign(n, false);
    gradient_in_place_.assign(n, false);
    placed_.assign(n, false);
    shared_.assign(n, false);
    zero_before_.resize(n);
    first_written_.assign(n, false);
    for (graph::node_id i = 0; i < n; ++i) {
      const graph::node& node = g[i];
      if (node.type == dtype::i64) {
        s_.ids[i] = allocate_for<std::int64_t>(i, node.out.size(), "ids");
        placed_[i] = true;
      } else if (node.kind == graph::op::parameter) {
        s_.value_views[i] = s_.values[i] = allocate_for<T>(i, node.out.size(), "value");
        placed_[i] = true;
        own_grad_[i] = allocate_for<T>(i, node.out.size(), "gradient");
        s_.grads[i] = std::span<T>(own_grad_[i].data(), own_grad_[i].size());
        initialize_parameter_on(i, seed);
      }
    }
    plan_strided_views();
    point_views();
  }
  executor_memory(const executor_memory&) = delete;
  executor_memory& operator=(const executor_memory&) = delete;
  executor_memory(executor_memory&&) = default;
  ~executor_memory() = default;

  // A reshape's value is its input's elements in the same order: it reads them where they lie
  // instead of copying (only its forward's copy goes; its gradient stays a buffer of its own).
  // Nothing writes a node's value but its own forward, so the input's buffer holds the reshape's
  // value for as long as the input's own.
  // A permute {0, 2, 1, 3} read only by batched matmuls is one too: they read it by strides
  // (its elements stay in its input's order, `node_storage::swapped`).
  // A batched matmul read only by a permute {0, 2, 1, 3} writes its value in the permute's order,
  // and the permute is a view of it.
  [[nodiscard]] bool is_view(graph::node_id i) const { return graph::is_view(g_, i, s_.swapped); }
  // Which values lie with dimensions 1 and 2 exchanged (graph::swapped_values).
  void plan_strided_views() { s_.swapped = graph::swapped_values(g_); }

  [[nodiscard]] std::size_t value_size(graph::node_id i) const {
    return g_[i].type == dtype::i64 ? 0 : g_[i].out.size();
  }
  [[nodiscard]] std::size_t gradient_size(graph::node_id i) const { return value_size(i); }

  // Allocates the values and gradients not placed yet (see the constructor), once.
  void materialize() {
    if (materialized_)
      return;
    materialized_ = true;
    slotted_.assign(g_.size(), false);
    arena_offset_.assign(g_.size(), not_in_arena);
    if constexpr (std::is_same_v<B, host_backend>) {
      // On the host the values share one arena (one block, so it is in huge pages: most of a
      // transformer's activations are below 2 MiB, and on 4 KiB pages the step ran ~2 % slower),
      // each value at a multiple of 64 bytes.
      constexpr std::size_t align = 64 / sizeof(T) > 0 ? 64 / sizeof(T) : 1;
      std::vector<std::size_t> offset(g_.size(), 0);
      std::size_t total = 0;
      for (graph::node_id i = 0; i < g_.size(); ++i)
        if (g_[i].type != dtype::i64 && !placed_[i] && !is_view(i)) {
          offset[i] = total;
          total += (value_size(i) + align - 1) / align * align;
        }
      value_arena_ = allocate_for<T>(0, total, "values");
      for (graph::node_id i = 0; i < g_.size(); ++i)
        if (g_[i].type != dtype::i64 && !placed_[i] && !is_view(i)) {
          s_.value_views[i] = std::span<T>(value_arena_.data() + offset[i], value_size(i));
          placed_[i] = true;
          slotted_[i] = true;
          arena_offset_[i] = offset[i];
        }
      for (std::size_t k = 1; k < slots_.size(); ++k)
        slots_[k].arena = allocate_for<T>(0, total, "values");
    }
    for (graph::node_id i = 0; i < g_.size(); ++i) {
      if (g_[i].type == dtype::i64)
        continue;
      if (!placed_[i] && !is_view(i)) {
        s_.value_views[i] = s_.values[i] = allocate_for<T>(i, value_size(i), "value");
        placed_[i] = true;
        slotted_[i] = true;
        for (std::size_t k = 1; k < slots_.size(); ++k) {
          slots_[k].values.resize(g_.size());
          slots_[k].values[i] = allocate_for<T>(i, value_size(i), "value");
        }
      }
      if (!pooled_[i] && s_.grads[i].size() != gradient_size(i)) {
        own_grad_[i] = allocate_for<T>(i, gradient_size(i), "gradient");
        s_.grads[i] = std::span<T>(own_grad_[i].data(), own_grad_[i].size());
      }
    }
    point_views();
    plan_first_writes();
  }
  // Which backward writes each gradient first, and whether it stores it whole instead of adding
  // into a zeroed buffer (exec/gradient_memory.hpp `first_writes_of`).
  void plan_first_writes() {
    first_writes f = first_writes_of(g_, extra_users_, stored_by_dual_,
                                     [](graph::op k) { return kernel_assigns(k); });
    if (accumulate_) // a parameter's gradient is added to, never stored whole
      for (graph::node_id i = 0; i < g_.size(); ++i) {
        if (g_[i].kind == graph::op::parameter)
          f.stored_whole[i] = false;
        for (std::size_t k = 0; k < g_[i].inputs.size() && k < 32; ++k)
          if (g_[g_[i].inputs[k]].kind == graph::op::parameter)
            f.assign[i] &= ~(1U << k);
      }
    s_.assign = std::move(f.assign);
    first_written_ = std::move(f.stored_whole);
  }

  // A view reads its input's buffer, once that has one.
  void point_views() {
    for (graph::node_id i = 0; i < g_.size(); ++i)
      if (is_view(i) && s_.value_views[g_[i].inputs[0]].size() >= g_[i].out.size())
        s_.value_views[i] = s_.value_views[g_[i].inputs[0]].first(g_[i].out.size());
  }
  // A strided view's elements are not in its shape's order: reading it whole is refused.
  void in_order(const char* what, graph::node_id id) const {
    if (swapped(id))
      throw plan_error("executor",
                       std::string("the ") + what + " of graph node \"" + g_[id].name +
                           "\" lies with dimensions 1 and 2 exchanged (a permute next to a "
                           "batched matmul, read by strides instead of copied)",
                       "read the permute's other side, the storage accessors, or name the node "
                       "in keep_element_order before the first run");
  }
  void allocated(const char* what, graph::node_id id, bool yes) const {
    if (!yes)
      throw plan_error("executor",
                       std::string("the ") + what + " of graph node \"" + g_[id].name +
                           "\" is not allocated before the executor first runs",
                       "read it after a forward, or through a non-const executor");
  }

  // Node i's buffer of n elements; a device out of memory is reported with the node it was for.
  template <class E>
  [[nodiscard]] typename B::template buffer<E> allocate_for(graph::node_id i, std::size_t n,
                                                            const char* what) {
    try {
      return backend_.template allocate<E>(n);
    } catch (const device_error& e) {
      throw device_error(e.device(), "allocate",
                         e.reason() + " for the " + what + " of graph node \"" + g_[i].name +
                             "\" " + g_[i].out.to_string(),
                         e.fix());
    }
  }

  // A parameter's initial values: written in place in host memory, else staged on the host
  // and copied (once, at construction).
  void initialize_parameter_on(graph::node_id i, std::uint64_t seed) {
    if constexpr (host_memory_v<B>) {
      initialize_parameter<T>(g_[i], layout(i), seed, s_.value_views[i]);
    } else {
      std::vector<T> staged(s_.value_views[i].size());
      initialize_parameter<T>(g_[i], layout(i), seed, std::span<T>(staged));
      backend_.copy_from_host(s_.value_views[i].data(), staged.data(), staged.size());
    }
  }

  [[nodiscard]] std::vector<T> to_host(std::span<const T> v) {
    std::vector<T> out(v.size());
    backend_.copy_to_host(out.data(), v.data(), v.size());
    return out;
  }

  template <class E>
  using buffer = typename B::template buffer<E>;

  // What one activation slot holds while another is in use (see `set_activation_slots`).
  struct slot_storage {
    buffer<T> arena;                       // the host's arena
    std::vector<buffer<T>> values;         // values with buffers of their own
    std::vector<buffer<std::int64_t>> ids; // integer nodes
    std::vector<buffer<T>> saved;          // what kernels keep for their backward
    std::vector<buffer<std::size_t>> saved_index;
  };
  // Exchanges the active storage of everything a slot holds with `o`'s.
  void swap_slot(slot_storage& o) {
    using std::swap;
    const std::size_t n = g_.size();
    swap(value_arena_, o.arena);
    o.values.resize(n);
    o.ids.resize(n);
    o.saved.resize(n);
    o.saved_index.resize(n);
    for (graph::node_id i = 0; i < n; ++i) {
      if (slotted_[i] && arena_offset_[i] == not_in_arena)
        swap(s_.values[i], o.values[i]);
      if (g_[i].type == dtype::i64)
        swap(s_.ids[i], o.ids[i]);
      swap(s_.saved[i], o.saved[i]);
      swap(s_.saved_index[i], o.saved_index[i]);
    }
  }
  const graph::graph& g_;
  B backend_;
  node_storage<T, B> s_;
  std::vector<buffer<T>> own_grad_; // nodes with a gradient buffer of their own
  buffer<T> pool_;                  // shared gradient buffers (reuse_gradient_buffers)
  buffer<T> value_pool_;            // shared working-copy values (share_value_buffers)
  buffer<T> value_arena_;           // the host's values placed when the executor first runs
  buffer<T> recompute_pool_;        // the recomputed segments' values (recompute)
  static constexpr std::size_t none_segment = static_cast<std::size_t>(-1);
  std::vector<std::size_t> segment_of_; // node i's recomputation segment, or none_segment
  std::vector<segment> segments_;
  std::vector<bool> pooled_; // the gradient of node i lies in pool_
  // node i (a reshape) shares its gradient's memory with its input's: its backward does not run
  std::vector<bool> gradient_in_place_;
  std::vector<bool> placed_;  // node i's value has its storage (see the constructor)
  std::vector<bool> shared_;  // node i's value lies in value_pool_
  bool materialized_ = false; // every value and gradient has its storage
  std::vector<std::vector<graph::node_id>> zero_before_; // zeroed when node i's backward starts
  std::vector<bool> first_written_; // stored whole by its first writer: never zeroed
  std::vector<std::pair<graph::node_id, graph::node_id>> extra_users_; // (see reuse_...)
  std::vector<graph::node_id> stored_by_dual_;                         // (see reuse_...)
  bool accumulate_ = false; // parameters' gradients accumulate over backwards
  // activation slots (set_activation_slots): the inactive ones, the active one's index, which
  // nodes' values a slot holds and where in the arena (not_in_arena: a buffer of its own)
  std::vector<slot_storage> slots_;
  std::size_t slot_ = 0;
  static constexpr std::size_t not_in_arena = static_cast<std::size_t>(-1);
  std::vector<bool> slotted_;
  std::vector<std::size_t> arena_offset_;
};

} // namespace hspmd::exec

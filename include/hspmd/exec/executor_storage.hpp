#pragma once
// Where an executor's values and gradients live (exec/executor.hpp runs the nodes over it, exec/
// executor_memory.hpp adds the plans that share the memory): parameters and integer nodes are
// allocated at construction, every other value and gradient when the executor first runs
// (`materialize`), so what a plan places in shared memory first is never allocated on its own.
// Also here: views that read their input's buffer, gradients that their first writer stores
// whole instead of a zeroed buffer, activation slots (several micro-batches in flight) and
// gradient accumulation over micro-batches.

#include <hspmd/core/error.hpp>
#include <hspmd/exec/activation_slots.hpp>
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
class executor_storage {
public:
  using backend_type = B;

  [[nodiscard]] const graph::graph& graph() const noexcept { return g_; }
  [[nodiscard]] B& backend() noexcept { return backend_; }
  [[nodiscard]] const B& backend() const noexcept { return backend_; }

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
    slots_.resize(n, g_, [&](graph::node_id i) {
      return allocate_for<std::int64_t>(i, g_[i].out.size(), "ids");
    });
  }
  [[nodiscard]] std::size_t activation_slots() const noexcept { return slots_.count(); }
  /// Makes slot `k` the one forwards fill and backwards read (its values stay as the last
  /// forward in it left them).
  void use_activation_slot(std::size_t k) {
    if (k >= activation_slots())
      throw config_error("executor",
                         "activation slot " + std::to_string(k) + " of " +
                             std::to_string(activation_slots()),
                         "give set_activation_slots enough slots");
    materialize();
    if (k == slots_.active())
      return;
    slots_.activate(k, g_, s_, value_arena_, own_grad_);
    for (graph::node_id i = 0; i < g_.size(); ++i)
      if (slots_.holds(i))
        s_.value_views[i] =
            slots_.arena_offset(i) != slots_.not_in_arena
                ? std::span<T>(value_arena_.data() + slots_.arena_offset(i), value_size(i))
                : std::span<T>(s_.values[i].data(), s_.values[i].size());
    point_views();
  }
  [[nodiscard]] std::size_t activation_slot() const noexcept { return slots_.active(); }
  /// Bytes the activation slots hold now, every slot counted: the values placed when the
  /// executor first ran and what kernels saved for their backward (allocated by the first
  /// forward in a slot), and the gradients a split backward keeps per micro-batch. What a
  /// pipeline stage's micro-batches in flight cost.
  [[nodiscard]] std::size_t activation_bytes() const {
    return slots_.bytes(g_, s_, value_arena_, own_grad_);
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
  executor_storage(const graph::graph& g, std::uint64_t seed,
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
  executor_storage(const executor_storage&) = delete;
  executor_storage& operator=(const executor_storage&) = delete;
  executor_storage(executor_storage&&) = default;
  ~executor_storage() = default;

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
    slots_.start_placing(g_.size());
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
          slots_.hold_in_arena(i, offset[i]);
        }
      slots_.place_arena(total, [&](std::size_t m) { return allocate_for<T>(0, m, "values"); });
    }
    for (graph::node_id i = 0; i < g_.size(); ++i) {
      if (g_[i].type == dtype::i64)
        continue;
      if (!placed_[i] && !is_view(i)) {
        s_.value_views[i] = s_.values[i] = allocate_for<T>(i, value_size(i), "value");
        placed_[i] = true;
        slots_.hold_own(i, g_.size(), [&] { return allocate_for<T>(i, value_size(i), "value"); });
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

  // Node i's gradient (a buffer of its own) exists once per activation slot.
  void hold_gradient_in_slots(graph::node_id i) {
    slots_.hold_gradient(i, g_.size(),
                         [&] { return allocate_for<T>(i, gradient_size(i), "gradient"); });
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

  const graph::graph& g_;
  B backend_;
  node_storage<T, B> s_;
  std::vector<buffer<T>> own_grad_; // nodes with a gradient buffer of their own
  buffer<T> pool_;                  // shared gradient buffers (reuse_gradient_buffers)
  buffer<T> value_pool_;            // shared working-copy values (share_value_buffers)
  buffer<T> value_arena_;           // the host's values placed when the executor first runs
  std::vector<bool> pooled_;        // the gradient of node i lies in pool_
  // node i (a reshape) shares its gradient's memory with its input's: its backward does not run
  std::vector<bool> gradient_in_place_;
  std::vector<bool> placed_;  // node i's value has its storage (see the constructor)
  std::vector<bool> shared_;  // node i's value lies in value_pool_
  bool materialized_ = false; // every value and gradient has its storage
  std::vector<std::vector<graph::node_id>> zero_before_; // zeroed when node i's backward starts
  std::vector<bool> first_written_; // stored whole by its first writer: never zeroed
  std::vector<std::pair<graph::node_id, graph::node_id>> extra_users_; // (see reuse_...)
  std::vector<graph::node_id> stored_by_dual_;                         // (see reuse_...)
  bool accumulate_ = false;           // parameters' gradients accumulate over backwards
  activation_slot_store<T, B> slots_; // (set_activation_slots)
};

} // namespace hspmd::exec

#pragma once
// Activation slots of an executor (exec/executor_storage.hpp `set_activation_slots`): a pipeline
// stage holds several micro-batches' activations at once (exec/pipeline.hpp), so the storage a
// forward fills and its backward reads exists n times, one set in use. This class keeps the
// sets not in use and exchanges them with the executor's active storage; the executor decides
// which nodes a slot holds (those it places when it first runs, and the gradients a split
// backward reads after the micro-batch's input gradients) and allocates their buffers.

#include <hspmd/graph/ir.hpp>
#include <hspmd/kernels/common.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace hspmd::exec {

/// The inactive activation slots of an executor of T on backend B (see the file comment).
template <class T, class B>
class activation_slot_store {
public:
  template <class E>
  using buffer = typename B::template buffer<E>;
  static constexpr std::size_t not_in_arena = static_cast<std::size_t>(-1);

  /// What one slot holds while another is in use.
  struct storage {
    buffer<T> arena;                       // the host's arena
    std::vector<buffer<T>> values;         // values with buffers of their own
    std::vector<buffer<std::int64_t>> ids; // integer nodes
    std::vector<buffer<T>> saved;          // what kernels keep for their backward
    std::vector<buffer<std::size_t>> saved_index;
    std::vector<buffer<T>> grads; // gradients kept per micro-batch (`hold_gradient`)
  };

  /// `n` slots over a graph of `nodes` nodes; `allocate_ids(i)` gives integer node i's buffer
  /// for each slot but the first (which is the executor's own storage).
  template <class AllocateIds>
  void resize(std::size_t n, const graph::graph& g, AllocateIds allocate_ids) {
    slots_.resize(n);
    for (std::size_t k = 1; k < n; ++k) {
      slots_[k].ids.resize(g.size());
      for (graph::node_id i = 0; i < g.size(); ++i)
        if (g[i].type == dtype::i64)
          slots_[k].ids[i] = allocate_ids(i);
    }
  }
  [[nodiscard]] std::size_t count() const noexcept { return slots_.empty() ? 1 : slots_.size(); }
  [[nodiscard]] std::size_t active() const noexcept { return active_; }

  /// When the executor first runs: no node is held by the slots yet.
  void start_placing(std::size_t nodes) {
    held_.assign(nodes, false);
    arena_offset_.assign(nodes, not_in_arena);
  }
  /// The slots hold node i's value at `offset` in the arena (every slot's arena has `total`
  /// elements, allocated by `allocate(total)` for each slot but the first).
  template <class Allocate>
  void place_arena(std::size_t total, Allocate allocate) {
    for (std::size_t k = 1; k < slots_.size(); ++k)
      slots_[k].arena = allocate(total);
  }
  void hold_in_arena(graph::node_id i, std::size_t offset) {
    held_[i] = true;
    arena_offset_[i] = offset;
  }
  /// The slots hold node i's value in a buffer of its own (`allocate()` for each slot but the
  /// first).
  template <class Allocate>
  void hold_own(graph::node_id i, std::size_t nodes, Allocate allocate) {
    held_[i] = true;
    for (std::size_t k = 1; k < slots_.size(); ++k) {
      slots_[k].values.resize(nodes);
      slots_[k].values[i] = allocate();
    }
  }
  [[nodiscard]] bool holds(graph::node_id i) const { return !held_.empty() && held_[i]; }
  /// The slots hold node i's gradient too (a buffer of its own in the executor: `allocate()`
  /// gives one for each slot but the first).
  template <class Allocate>
  void hold_gradient(graph::node_id i, std::size_t nodes, Allocate allocate) {
    held_grad_.resize(nodes, false);
    held_grad_[i] = true;
    for (std::size_t k = 1; k < slots_.size(); ++k) {
      slots_[k].grads.resize(nodes);
      slots_[k].grads[i] = allocate();
    }
  }
  [[nodiscard]] bool holds_gradient(graph::node_id i) const {
    return i < held_grad_.size() && held_grad_[i];
  }
  [[nodiscard]] std::size_t arena_offset(graph::node_id i) const { return arena_offset_[i]; }

  /// Makes slot `k` the active one: the executor's active storage (`s`, `arena`, the held
  /// gradients' buffers `own_grad`) goes to the current slot and slot k's takes its place. The
  /// gradients (and their views) are re-pointed here; the caller re-points the value views.
  void activate(std::size_t k, const graph::graph& g, node_storage<T, B>& s, buffer<T>& arena,
                std::vector<buffer<T>>& own_grad) {
    std::vector<const T*> before(held_grad_.size(), nullptr);
    for (graph::node_id i = 0; i < held_grad_.size(); ++i)
      if (held_grad_[i])
        before[i] = own_grad[i].data();
    exchange(slots_[active_], g, s, arena, own_grad);
    exchange(slots_[k], g, s, arena, own_grad);
    active_ = k;
    for (graph::node_id i = 0; i < held_grad_.size(); ++i)
      if (held_grad_[i] && before[i] != nullptr)
        for (std::span<T>& v : s.grads) // the node's and its views' (same memory)
          if (v.data() == before[i])
            v = std::span<T>(own_grad[i].data(), v.size());
  }

  /// Bytes every slot holds, the active one read from the executor's storage.
  [[nodiscard]] std::size_t bytes(const graph::graph& g, const node_storage<T, B>& s,
                                  const buffer<T>& arena,
                                  const std::vector<buffer<T>>& own_grad) const {
    std::size_t total = arena.size() * sizeof(T);
    for (graph::node_id i = 0; i < held_grad_.size(); ++i)
      if (held_grad_[i]) {
        total += own_grad[i].size() * sizeof(T);
        for (std::size_t k = 0; k < slots_.size(); ++k)
          if (k != active_ && i < slots_[k].grads.size())
            total += slots_[k].grads[i].size() * sizeof(T);
      }
    const auto add = [&](const auto& values, const auto& saved, const auto& index) {
      for (graph::node_id i = 0; i < g.size(); ++i) {
        if (i < values.size() && holds(i) && arena_offset_[i] == not_in_arena)
          total += values[i].size() * sizeof(T);
        if (i < saved.size())
          total += saved[i].size() * sizeof(T);
        if (i < index.size())
          total += index[i].size() * sizeof(std::size_t);
      }
    };
    add(s.values, s.saved, s.saved_index);
    for (std::size_t k = 0; k < slots_.size(); ++k)
      if (k != active_) {
        total += slots_[k].arena.size() * sizeof(T);
        add(slots_[k].values, slots_[k].saved, slots_[k].saved_index);
      }
    return total;
  }

private:
  // Exchanges the active storage of everything a slot holds with `o`'s.
  void exchange(storage& o, const graph::graph& g, node_storage<T, B>& s, buffer<T>& arena,
                std::vector<buffer<T>>& own_grad) {
    using std::swap;
    const std::size_t n = g.size();
    swap(arena, o.arena);
    o.grads.resize(n);
    for (graph::node_id i = 0; i < held_grad_.size(); ++i)
      if (held_grad_[i])
        swap(own_grad[i], o.grads[i]);
    o.values.resize(n);
    o.ids.resize(n);
    o.saved.resize(n);
    o.saved_index.resize(n);
    for (graph::node_id i = 0; i < n; ++i) {
      if (holds(i) && arena_offset_[i] == not_in_arena)
        swap(s.values[i], o.values[i]);
      if (g[i].type == dtype::i64)
        swap(s.ids[i], o.ids[i]);
      swap(s.saved[i], o.saved[i]);
      swap(s.saved_index[i], o.saved_index[i]);
    }
  }

  std::vector<storage> slots_; // [0] unused while slot 0 is active (it is the executor's own)
  std::size_t active_ = 0;
  std::vector<bool> held_;                // node i's value is held by the slots
  std::vector<std::size_t> arena_offset_; // where in the arena, or not_in_arena
  std::vector<bool> held_grad_;           // node i's gradient is held by the slots
};

} // namespace hspmd::exec

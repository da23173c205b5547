#pragma once
// Runs a traced graph on one process: forward through every node's kernel, reverse-mode
// autodiff back (gradients of nodes used more than once accumulate), parameters materialized
// from the seeded counter-based RNG by their global element index.
//
//     exec::executor<float> ex(g, /*seed=*/42);
//     ex.set_input("x", features);  ex.set_input("labels", labels);
//     const float loss = ex.forward();
//     ex.backward();                       // ex.grad(id) for every node
//
// The executor keeps the schedule, the storage and the autodiff bookkeeping; the arithmetic is in
// the kernels (kernels/), which reach the device through the backend (kernels/backend.hpp;
// `host_backend` by default).

#include <hspmd/core/error.hpp>
#include <hspmd/exec/backends/host.hpp>
#include <hspmd/exec/batch_sink.hpp>
#include <hspmd/exec/executor_memory.hpp>
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

/// Executes a graph in one process with element type T (float or double) on backend B.
template <std::floating_point T, backend B = host_backend>
class executor : public executor_memory<T, B> {
  using base = executor_memory<T, B>;

public:
  using segment = typename base::segment;
  using base::parameter;
  using base::segment_ending_at;
  using base::value;

  /// Allocates the parameters (value and gradient) and integer nodes and materializes the
  /// parameters from `seed` (exec/parameter_init.hpp), so any rank can materialize any slice of
  /// any parameter. Every other value and gradient -- inputs too: on a rank, values moved from
  /// other ranks are inputs -- is allocated when the executor is first run, fed or read
  /// (`forward`, `backward`, `set_input`, a node's `value` or `grad`): buffers that
  /// `reuse_gradient_buffers` or `share_value_buffers` place in shared memory before that are
  /// never allocated on their own, so the device's peak is the shared size, not the unshared.
  ///
  /// `layouts` (one per node, or none): where each node's value sits in the whole tensor when
  /// `g` is one rank's local graph (program/lower.hpp); parameters, dropout masks, means, causal
  /// masks and vocabulary ranges then follow global positions.
  explicit executor(const graph::graph& g, std::uint64_t seed = 0,
                    std::vector<program::node_layout> layouts = {}, B backend = {})
      : base(g, seed, std::move(layouts), std::move(backend)) {
    state_.seed = seed;
  }

  /// The training step: dropout masks are drawn at (seed ^ step, node, element index), so a step's
  /// masks are the same however often it is re-run (and on any rank, for any shard).
  void set_step(std::uint64_t step) noexcept { state_.step = step; }
  /// Training (dropout active) or evaluation (dropout is the identity).
  void set_training(bool on) noexcept { state_.training = on; }

  /// Mixed precision (kernels/precision.hpp): under bf16 or f16 every activation and activation
  /// gradient is stored rounded to the 16-bit type and GEMM operands are rounded, while
  /// parameters, their gradients and the loss stay in float. Only an executor of float takes a
  /// 16-bit precision.
  void set_precision(exec::precision p) {
    if (p != exec::precision::f32 && !std::is_same_v<T, float>)
      throw config_error("precision " + std::string(name(p)),
                         "needs an executor of float (16-bit storage with float master weights)",
                         "train in float, or give precision f32");
    state_.precision = p;
  }
  [[nodiscard]] exec::precision precision() const noexcept { return state_.precision; }
  /// Keeps node `id`'s value and gradient in float under a 16-bit precision: a rank's local copy
  /// of a parameter (a transfer's target, exec/distributed.hpp), whose gradient is a master
  /// weight's.
  void keep_in_float(graph::node_id id) {
    keep_float_.resize(g_.size(), false);
    keep_float_.at(id) = true;
  }
  /// The backward's seed, d loss / d loss (dynamic loss scaling for f16, train/loss_scale.hpp):
  /// every gradient comes out multiplied by it; the optimizer divides it out.
  void set_loss_scale(double scale) {
    if (!(scale > 0.0) || !std::isfinite(scale))
      throw config_error("loss scale", std::to_string(scale) + " is not a finite value > 0",
                         "give a positive scale (train::dynamic_loss_scale keeps one)");
    loss_scale_ = scale;
  }
  [[nodiscard]] double loss_scale() const noexcept { return loss_scale_; }

  /// Feeds a floating-point input node by name.
  void set_input(std::string_view name, std::span<const T> data) {
    const graph::node_id id = input(name, false);
    if (data.size() != value(id).size())
      throw shape_error("input \"" + std::string(name) + "\"",
                        std::to_string(data.size()) + " values for shape " + g_[id].out.to_string(),
                        "one value per element");
    backend_.copy_from_host(s_.value_views[id].data(), data.data(), data.size());
  }
  /// Feeds an integer input node (token ids, labels) by name.
  void set_input(std::string_view name, std::span<const std::int64_t> data) {
    const graph::node_id id = input(name, true);
    if (data.size() != s_.ids[id].size())
      throw shape_error("input \"" + std::string(name) + "\"",
                        std::to_string(data.size()) + " ids for shape " + g_[id].out.to_string(),
                        "one id per element");
    backend_.copy_from_host(s_.ids[id].data(), data.data(), data.size());
  }

  /// Runs every node; returns the loss.
  T forward() {
    materialize();
    for (graph::node_id i = 0; i < g_.size(); ++i)
      forward_node(i);
    T loss{};
    backend_.copy_to_host(&loss, value(*g_.loss()).data(), 1);
    return loss;
  }

  /// d loss / d every node (inputs included). Gradients are recomputed from zero each call.
  /// Segments given to `recompute` run their forward again just before their backward.
  void backward() {
    begin_backward();
    for (graph::node_id i = static_cast<graph::node_id>(g_.size()); i-- > 0;) {
      replay_segment_ending_at(i);
      backward_node(i);
    }
  }

  /// Runs the forward of the segment whose last node is `i` again, if there is one (before node
  /// i's backward). Drivers that move values between ranks replay a segment themselves
  /// (exec/distributed.hpp).
  void replay_segment_ending_at(graph::node_id i) {
    if (const segment* sg = segment_ending_at(i))
      for (graph::node_id j : sg->internal)
        forward_node(j);
  }

  /// One node's forward (inputs and parameters: nothing). For drivers that interleave
  /// communication with the nodes (exec/distributed.hpp).
  void forward_node(graph::node_id i) {
    materialize();
    timed_run(i, false);
  }
  /// Zeroes every gradient and seeds d loss / d loss = 1 (shared gradient buffers are zeroed
  /// when they come into use, see `reuse_gradient_buffers`).
  /// A gradient whose first writer stores it whole (`plan_first_writes`) is not zeroed, nor a
  /// parameter's while gradients accumulate (`set_accumulate_parameter_gradients`).
  /// A split backward's weights part (`split_backward`) zeroes the weight-side gradients only
  /// and does not seed.
  void begin_backward(backward_part part = backward_part::whole) {
    materialize();
    const bool accumulate = this->accumulates_parameter_gradients();
    for (graph::node_id i = 0; i < g_.size(); ++i)
      if (!pooled_[i] && !first_written_[i] &&
          !(accumulate && g_[i].kind == graph::op::parameter) &&
          (part != backward_part::weights || this->weight_side(i)))
        fill(backend_, s_.grads[i].data(), s_.grads[i].size(), T{});
    if (part != backward_part::weights)
      fill(backend_, s_.grads[*g_.loss()].data(), 1, static_cast<T>(loss_scale_));
  }
  /// One node's backward: adds its inputs' gradients (after `begin_backward`, in reverse order).
  /// Under a split backward, `part` says which of them (`split_backward`): every node's
  /// inputs part first, in reverse order, then -- later -- the weights parts in the same order.
  void backward_node(graph::node_id i, backward_part part = backward_part::whole) {
    if (part != backward_part::whole && !this->splits_backward())
      throw plan_error("executor", "a backward part without a split backward",
                       "call split_backward before the first forward");
    enter_backward(i, part); // (materializes)
    if (g_[i].type == dtype::i64 || gradient_in_place_[i] || !this->has_backward_part(i, part))
      return;
    timed_run(i, true, this->wanted_inputs(i, part));
  }
  /// Zeroes the shared gradient buffers that come into use at node i's backward (in `part`:
  /// those of its class); drivers that run a node's backward themselves (a transfer's dual)
  /// call it first.
  void enter_backward(graph::node_id i, backward_part part = backward_part::whole) {
    materialize();
    for (graph::node_id j : zero_before_[i])
      if (!first_written_[j] && (part == backward_part::whole ||
                                 this->weight_side(j) == (part == backward_part::weights)))
        fill(backend_, s_.grads[j].data(), s_.grads[j].size(), T{});
  }

  /// Sums `data` element-wise over the ranks sharing a vocabulary-parallel cross-entropy
  /// (`max`: the maximum instead); required when a layout says `vocab_parallel`.
  void set_row_reduce(std::function<void(std::span<T> data, bool max)> f) {
    row_reduce_ = std::move(f);
  }

  /// Starts (or stops) accumulating time per op kind and per node; starting clears earlier
  /// totals.
  void set_profiling(bool on) { profiler_.set(on, g_.size()); }
  /// Seconds spent per op kind (indexed by graph::op), forward and backward, while profiling.
  [[nodiscard]] const std::vector<profile_entry>& profile() const noexcept {
    return profiler_.per_kind();
  }
  /// Seconds spent per node (indexed by node id), forward and backward, while profiling is on.
  [[nodiscard]] const std::vector<profile_entry>& node_profile() const noexcept {
    return profiler_.per_node();
  }

private:
  using base::backend_;
  using base::first_written_;
  using base::g_;
  using base::gradient_in_place_;
  using base::gradient_size;
  using base::is_view;
  using base::materialize;
  using base::pooled_;
  using base::s_;
  using base::zero_before_;

  void timed_run(graph::node_id i, bool backward, std::uint32_t wanted = ~0U) {
    if (!profiler_.on()) {
      run(i, backward, wanted);
      return;
    }
    profiler_.add(g_[i].kind, i, backward, backend_.timed([&] { run(i, backward, wanted); }));
  }
  // A device error names the node whose kernel saw it. Kernels run asynchronously on a device:
  // a fault is seen at the next checked call, so the node named is where it was noticed (with
  // CUDA_LAUNCH_BLOCKING=1, the node that caused it).
  void run(graph::node_id i, bool backward, std::uint32_t wanted) {
    auto state = state_;
    state.row_reduce = &row_reduce_;
    state.wanted = wanted;
    kernel_context<T, B> c(backend_, g_, i, s_, state);
    try {
      const unwanted_gradients away(*this, i, wanted);
      run_kernel(c, backward);
      if (state_.precision != exec::precision::f32)
        store_rounded(i, backward);
    } catch (const device_error& e) {
      const graph::node& n = g_[i];
      throw device_error(e.device(), e.call(),
                         e.reason() + " in the " + (backward ? "backward" : "forward") +
                             " of graph node \"" + n.name + "\" (" +
                             std::string(graph::name(n.kind)) + ", " + n.out.to_string() + ")",
                         e.fix());
    }
  }

  // Under a 16-bit precision, what node i's kernel stored is rounded to the 16-bit type: its
  // value (forward; not a parameter's, a scalar's -- losses stay float -- or a view's) or the
  // gradients it added to its inputs (backward; not a parameter's). Nodes kept in float
  // (`keep_in_float`) are neither.
  void store_rounded(graph::node_id i, bool backward) {
    const graph::node& n = g_[i];
    const exec::precision p = state_.precision;
    const auto activation = [&](graph::node_id id) {
      const graph::node& m = g_[id];
      return m.type != dtype::i64 && m.kind != graph::op::parameter &&
             (keep_float_.empty() || !keep_float_[id]);
    };
    if (!backward) {
      if (activation(i) && n.kind != graph::op::input && n.out.rank() != 0 && !is_view(i))
        round_in_place(backend_, p, s_.value_views[i].data(), s_.value_views[i].size());
      return;
    }
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      const graph::node_id j = n.inputs[k];
      const auto here = n.inputs.begin() + static_cast<std::ptrdiff_t>(k);
      if (!activation(j) || std::find(n.inputs.begin(), here, j) != here) // counted once
        continue;
      round_in_place(backend_, p, s_.grads[j].data(), s_.grads[j].size());
    }
  }

  // While it lives, the gradients of node i's unwanted inputs (a split backward's other part)
  // point to scratch memory, one range each: what a kernel writes there is dropped.
  class unwanted_gradients {
  public:
    unwanted_gradients(executor& x, graph::node_id i, std::uint32_t wanted) : x_(x) {
      if (wanted == ~0U)
        return;
      const graph::node& n = x.g_[i];
      std::size_t total = 0;
      for (std::size_t k = 0; k < n.inputs.size() && k < 32; ++k)
        if (((wanted >> k) & 1U) == 0U)
          total += x.gradient_size(n.inputs[k]);
      if (x.scratch_.size() < total)
        x.scratch_ = x.backend_.template allocate<T>(total);
      std::size_t at = 0;
      for (std::size_t k = 0; k < n.inputs.size() && k < 32; ++k) {
        const graph::node_id j = n.inputs[k];
        if (((wanted >> k) & 1U) != 0U ||
            std::ranges::any_of(saved_, [&](const auto& s) { return s.first == j; }))
          continue;
        saved_.emplace_back(j, x.s_.grads[j]);
        x.s_.grads[j] = std::span<T>(x.scratch_.data() + at, x.gradient_size(j));
        at += x.gradient_size(j);
      }
    }
    ~unwanted_gradients() {
      for (const auto& [j, g] : saved_)
        x_.s_.grads[j] = g;
    }
    unwanted_gradients(const unwanted_gradients&) = delete;
    unwanted_gradients& operator=(const unwanted_gradients&) = delete;

  private:
    executor& x_;
    std::vector<std::pair<graph::node_id, std::span<T>>> saved_;
  };

  graph::node_id input(std::string_view name, bool integral) const {
    return input_node(g_, name, integral, "executor");
  }

  typename kernel_context<T, B>::row_reduce_fn row_reduce_;
  typename kernel_context<T, B>::run_state state_;
  double loss_scale_ = 1.0;
  std::vector<bool> keep_float_; // nodes kept in float under a 16-bit precision (or empty)
  typename B::template buffer<T> scratch_; // (unwanted_gradients)
  op_profiler profiler_;
};

/// Recomputation segments for `executor::recompute`, one per block of a model whose parameters
/// are named `prefix` + block + "." + ... (e.g. "layers.3.attn.wq"; graph::block_ranges, which
/// the planner prices recomputation with).
[[nodiscard]] inline std::vector<std::pair<graph::node_id, graph::node_id>>
scope_segments(const graph::graph& g, std::string_view prefix = "layers.") {
  return graph::block_ranges(g, prefix);
}

/// Writes the executor's per-op-kind profile as a table (see exec/op_profile.hpp).
template <std::floating_point T, backend B>
void write_profile(std::ostream& out, const executor<T, B>& ex, std::size_t steps) {
  write_profile(out, std::span<const profile_entry>(ex.profile()), steps);
}

} // namespace hspmd::exec

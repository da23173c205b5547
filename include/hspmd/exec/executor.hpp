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
// the kernels (exec/kernels/), which reach the device through the backend (exec/backend.hpp;
// `host_backend` by default).

#include <hspmd/core/error.hpp>
#include <hspmd/exec/backend.hpp>
#include <hspmd/exec/backends/host.hpp>
#include <hspmd/exec/gradient_memory.hpp>
#include <hspmd/exec/kernels.hpp>
#include <hspmd/exec/op_profile.hpp>
#include <hspmd/exec/parameter_init.hpp>
#include <hspmd/graph/blocks.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/graph/ops.hpp>
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
class executor {
public:
  using backend_type = B;

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
      : g_(g), backend_(std::move(backend)) {
    if (!g.loss())
      throw plan_error("executor", "the graph has no loss", "mark one with tracer::set_loss");
    if (!layouts.empty() && layouts.size() != g.size())
      throw plan_error("executor",
                       std::to_string(layouts.size()) + " layouts for " + std::to_string(g.size()) +
                           " nodes",
                       "give one layout per node or none");
    state_.seed = seed;
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

  [[nodiscard]] const graph::graph& graph() const noexcept { return g_; }
  [[nodiscard]] B& backend() noexcept { return backend_; }
  [[nodiscard]] const B& backend() const noexcept { return backend_; }

  /// The training step: dropout masks are drawn at (seed ^ step, node, element index), so a step's
  /// masks are the same however often it is re-run (and on any rank, for any shard).
  void set_step(std::uint64_t step) noexcept { state_.step = step; }
  /// Training (dropout active) or evaluation (dropout is the identity).
  void set_training(bool on) noexcept { state_.training = on; }

  /// Mixed precision (exec/precision.hpp): under bf16 or f16 every activation and activation
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
    constexpr std::size_t align = 16; // elements, as share_value_buffers
    std::size_t total = 0;
    std::vector<std::size_t> offset(n, 0);
    for (const segment& sg : segments_) {
      std::size_t at = 0;
      for (graph::node_id i : sg.internal) {
        offset[i] = at;
        at += (g_[i].out.size() + align - 1) / align * align;
      }
      total = std::max(total, at);
    }
    recompute_pool_ = allocate_for<T>(segments_.empty() ? 0 : segments_.front().first, total,
                                      "recomputed values");
    for (const segment& sg : segments_)
      for (graph::node_id i : sg.internal) {
        s_.value_views[i] = std::span<T>(recompute_pool_.data() + offset[i], g_[i].out.size());
        s_.values[i] = backend_.template allocate<T>(0); // (frees it, if the executor ran)
        placed_[i] = true;
      }
    point_views();
    return total * sizeof(T);
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
  /// A gradient whose first writer stores it whole (`plan_first_writes`) is not zeroed.
  void begin_backward() {
    materialize();
    for (graph::node_id i = 0; i < g_.size(); ++i)
      if (!pooled_[i] && !first_written_[i])
        fill(backend_, s_.grads[i].data(), s_.grads[i].size(), T{});
    fill(backend_, s_.grads[*g_.loss()].data(), 1, static_cast<T>(loss_scale_));
  }
  /// One node's backward: adds its inputs' gradients (after `begin_backward`, in reverse order).
  void backward_node(graph::node_id i) {
    enter_backward(i); // (materializes)
    if (g_[i].type != dtype::i64 && !gradient_in_place_[i])
      timed_run(i, true);
  }
  /// Zeroes the shared gradient buffers that come into use at node i's backward; drivers that
  /// run a node's backward themselves (a transfer's dual) call it first.
  void enter_backward(graph::node_id i) {
    materialize();
    for (graph::node_id j : zero_before_[i])
      if (!first_written_[j])
        fill(backend_, s_.grads[j].data(), s_.grads[j].size(), T{});
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
    constexpr std::size_t align = 16; // elements: every copy starts on a 64-byte line
    struct placed {
      std::size_t offset, size;
      graph::node_id last;
    };
    std::vector<placed> done;
    std::vector<std::size_t> offset(lives.size());
    std::size_t total = 0;
    std::vector<std::size_t> order(lives.size());
    for (std::size_t k = 0; k < order.size(); ++k)
      order[k] = k;
    std::ranges::sort(order, {}, [&](std::size_t k) { return lives[k].first; });
    for (std::size_t k : order) {
      const auto [id, last] = lives[k];
      const std::size_t size = (g_[id].out.size() + align - 1) / align * align;
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
      offset[k] = at;
      done.push_back({at, size, last});
      total = std::max(total, at + size);
    }
    value_pool_ = allocate_for<T>(lives.empty() ? 0 : lives.front().first, total, "shared value");
    for (std::size_t k = 0; k < lives.size(); ++k) {
      const graph::node_id id = lives[k].first;
      s_.value_views[id] = std::span<T>(value_pool_.data() + offset[k], g_[id].out.size());
      s_.values[id] = backend_.template allocate<T>(0); // (frees it, if the executor ran)
      placed_[id] = true;
      shared_[id] = true;
    }
    point_views();
    return total * sizeof(T);
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

private:
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
        }
    }
    for (graph::node_id i = 0; i < g_.size(); ++i) {
      if (g_[i].type == dtype::i64)
        continue;
      if (!placed_[i] && !is_view(i)) {
        s_.value_views[i] = s_.values[i] = allocate_for<T>(i, value_size(i), "value");
        placed_[i] = true;
      }
      if (!pooled_[i] && s_.grads[i].size() != gradient_size(i)) {
        own_grad_[i] = allocate_for<T>(i, gradient_size(i), "gradient");
        s_.grads[i] = std::span<T>(own_grad_[i].data(), own_grad_[i].size());
      }
    }
    point_views();
    plan_first_writes();
  }
  // Which backward writes each gradient first in the reverse sweep (its user of the largest id),
  // and whether it can store the gradient whole instead of adding into a zeroed buffer: the
  // user's kernel says so for that input (`kernel_assigns`), reads the node through one input
  // only, and nothing outside the graph's edges adds into the gradient (`extra_users_`, a
  // transfer's dual), and the node is not the loss. Such gradients are not zeroed before the
  // backward: a memory pass fewer per activation and parameter (the zeroing was ~5 % of a
  // BERT-small step on the host).
  void plan_first_writes() {
    const std::size_t n = g_.size();
    std::vector<std::optional<graph::node_id>> first(n);
    for (graph::node_id j = 0; j < n; ++j)
      for (graph::node_id in : g_[j].inputs)
        if (!first[in] || *first[in] < j)
          first[in] = j;
    std::vector<std::size_t> external(n, 0);
    for (const auto& [from, to] : extra_users_)
      ++external.at(from);
    s_.assign.assign(n, 0U);
    first_written_.assign(n, false);
    for (graph::node_id i = 0; i < n; ++i) {
      const graph::node& node = g_[i];
      if (node.type == dtype::i64) // (no backward runs)
        continue;
      const std::uint32_t can = kernel_assigns(node.kind);
      for (std::size_t k = 0; k < node.inputs.size() && k < 32; ++k) {
        const graph::node_id j = node.inputs[k];
        if (((can >> k) & 1U) == 0 || external[j] != 0 || first[j] != i ||
            g_[j].type == dtype::i64 || j == *g_.loss() || std::ranges::count(node.inputs, j) != 1)
          continue; // (the loss's gradient holds the backward's seed)
        s_.assign[i] |= 1U << k;
        first_written_[j] = true;
      }
    }
    for (graph::node_id j : stored_by_dual_) // its dual is its only writer
      if (j < n && !first[j] && external[j] == 1 && j != *g_.loss() && g_[j].type != dtype::i64)
        first_written_[j] = true;
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

  void timed_run(graph::node_id i, bool backward) {
    if (!profiler_.on()) {
      run(i, backward);
      return;
    }
    profiler_.add(g_[i].kind, i, backward, backend_.timed([&] { run(i, backward); }));
  }
  // A device error names the node whose kernel saw it. Kernels run asynchronously on a device:
  // a fault is seen at the next checked call, so the node named is where it was noticed (with
  // CUDA_LAUNCH_BLOCKING=1, the node that caused it).
  void run(graph::node_id i, bool backward) {
    auto state = state_;
    state.row_reduce = &row_reduce_;
    kernel_context<T, B> c(backend_, g_, i, s_, state);
    try {
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

  graph::node_id input(std::string_view name, bool integral) const {
    const auto id = g_.find(name);
    if (!id || g_[*id].kind != graph::op::input)
      throw plan_error("executor", "no input named \"" + std::string(name) + "\"",
                       "feed the inputs the model declared");
    if ((g_[*id].type == dtype::i64) != integral)
      throw plan_error("input \"" + std::string(name) + "\"",
                       integral ? "is not an integer input" : "is an integer input",
                       "feed ids as int64 and features as floating point");
    return *id;
  }

  template <class E>
  using buffer = typename B::template buffer<E>;

  const graph::graph& g_;
  B backend_;
  node_storage<T, B> s_;
  typename kernel_context<T, B>::row_reduce_fn row_reduce_;
  typename kernel_context<T, B>::run_state state_;
  double loss_scale_ = 1.0;
  std::vector<bool> keep_float_; // nodes kept in float under a 16-bit precision (or empty)
  op_profiler profiler_;
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

#pragma once
// Runs a traced graph on one process: forward through the kernels, reverse-mode autodiff back
// (gradients of nodes used more than once accumulate), parameters materialized from the seeded
// counter-based RNG by their global element index.
//
//     exec::executor<float> ex(g, /*seed=*/42);
//     ex.set_input("x", features);  ex.set_input("labels", labels);
//     const float loss = ex.forward();
//     ex.backward();                       // ex.grad(id) for every node
//
// Kernels: GEMM through exec/kernels.hpp, everything else straightforward loops.

#include <hspmd/core/error.hpp>
#include <hspmd/core/hash.hpp>
#include <hspmd/core/rng.hpp>
#include <hspmd/exec/kernels.hpp>
#include <hspmd/exec/kernels/moe_routing.hpp>
#include <hspmd/exec/layout.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/graph/ops.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <numbers>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hspmd::exec {

namespace detail {

// Row-major strides of dims.
[[nodiscard]] inline std::vector<std::size_t> strides_of(const std::vector<std::size_t>& dims) {
  std::vector<std::size_t> s(dims.size(), 1);
  for (std::size_t i = dims.size(); i-- > 1;)
    s[i - 1] = s[i] * dims[i];
  return s;
}

// For a broadcast of `in` onto `out` (trailing alignment): per output dimension, the stride into
// `in` (0 where `in` is broadcast).
[[nodiscard]] inline std::vector<std::size_t> broadcast_strides(const hspmd::shape& in,
                                                                const hspmd::shape& out) {
  const auto s = strides_of(in.dims);
  std::vector<std::size_t> b(out.rank(), 0);
  const std::size_t off = out.rank() - in.rank();
  for (std::size_t i = 0; i < in.rank(); ++i)
    b[off + i] = in.dims[i] == 1 ? 0 : s[i];
  return b;
}

// Calls f(out_index, a_index, b_index) over all output elements.
template <class F>
void for_each_broadcast(const hspmd::shape& out, const std::vector<std::size_t>& sa,
                        const std::vector<std::size_t>& sb, F&& f) {
  const std::size_t r = out.rank();
  const std::size_t total = out.size();
  if (r == 0) {
    f(std::size_t{0}, std::size_t{0}, std::size_t{0});
    return;
  }
  std::vector<std::size_t> idx(r, 0);
  std::size_t ia = 0;
  std::size_t ib = 0;
  for (std::size_t o = 0; o < total; ++o) {
    f(o, ia, ib);
    for (std::size_t d = r; d-- > 0;) { // odometer increment
      ++idx[d];
      ia += sa[d];
      ib += sb[d];
      if (idx[d] < out.dims[d])
        break;
      ia -= sa[d] * out.dims[d];
      ib -= sb[d] * out.dims[d];
      idx[d] = 0;
    }
  }
}

} // namespace detail

/// Executes a graph in one process with element type T (float or double).
template <std::floating_point T>
class executor {
public:
  /// Allocates every node's value and gradient and materializes the parameters from `seed`:
  /// element i of parameter P is N(0, stddev^2) drawn at (seed, fnv1a64(P's name), i), so any
  /// rank can materialize any slice of any parameter identically.
  ///
  /// `layouts` (one per node, or none): where each node's value sits in the whole tensor when
  /// `g` is one rank's local graph (exec/lower.hpp); parameters, dropout masks, means, causal
  /// masks and vocabulary ranges then follow global positions.
  explicit executor(const graph::graph& g, std::uint64_t seed = 0,
                    std::vector<node_layout> layouts = {})
      : g_(g), seed_(seed), layouts_(std::move(layouts)) {
    if (!g.loss())
      throw plan_error("executor", "the graph has no loss", "mark one with tracer::set_loss");
    if (!layouts_.empty() && layouts_.size() != g.size())
      throw plan_error("executor",
                       std::to_string(layouts_.size()) + " layouts for " +
                           std::to_string(g.size()) + " nodes",
                       "give one layout per node or none");
    val_.resize(g.size());
    grad_.resize(g.size());
    own_grad_.resize(g.size());
    pooled_.assign(g.size(), false);
    zero_before_.resize(g.size());
    ids_.resize(g.size());
    aux_.resize(g.size());
    index_.resize(g.size());
    for (graph::node_id i = 0; i < g.size(); ++i) {
      const graph::node& n = g[i];
      if (n.type == dtype::i64)
        ids_[i].assign(n.out.size(), 0);
      else
        val_[i].assign(n.out.size(), T{});
      own_grad_[i].assign(n.type == dtype::i64 ? 0 : n.out.size(), T{});
      grad_[i] = std::span<T>(own_grad_[i]);
      if (n.kind == graph::op::parameter)
        initialize(i);
    }
  }

  [[nodiscard]] const graph::graph& graph() const noexcept { return g_; }

  /// The training step: dropout masks are drawn at (seed ^ step, node, element index), so a step's
  /// masks are the same however often it is re-run (and on any rank, for any shard).
  void set_step(std::uint64_t step) noexcept { step_ = step; }
  /// Training (dropout active) or evaluation (dropout is the identity).
  void set_training(bool on) noexcept { training_ = on; }

  /// Feeds a floating-point input node by name.
  void set_input(std::string_view name, std::span<const T> data) {
    const graph::node_id id = input(name, false);
    if (data.size() != val_[id].size())
      throw shape_error("input \"" + std::string(name) + "\"",
                        std::to_string(data.size()) + " values for shape " + g_[id].out.to_string(),
                        "one value per element");
    std::copy(data.begin(), data.end(), val_[id].begin());
  }
  /// Feeds an integer input node (token ids, labels) by name.
  void set_input(std::string_view name, std::span<const std::int64_t> data) {
    const graph::node_id id = input(name, true);
    if (data.size() != ids_[id].size())
      throw shape_error("input \"" + std::string(name) + "\"",
                        std::to_string(data.size()) + " ids for shape " + g_[id].out.to_string(),
                        "one id per element");
    std::copy(data.begin(), data.end(), ids_[id].begin());
  }

  /// Runs every node; returns the loss.
  T forward() {
    for (graph::node_id i = 0; i < g_.size(); ++i)
      forward_node(i);
    return val_[*g_.loss()][0];
  }

  /// d loss / d every node (inputs included). Gradients are recomputed from zero each call.
  void backward() {
    begin_backward();
    for (graph::node_id i = static_cast<graph::node_id>(g_.size()); i-- > 0;)
      backward_node(i);
  }

  /// One node's forward (inputs and parameters: nothing). For drivers that interleave
  /// communication with the nodes (exec/distributed.hpp).
  void forward_node(graph::node_id i) {
    timed(i, false, [&] { run_forward(i); });
  }
  /// Zeroes every gradient and seeds d loss / d loss = 1 (shared gradient buffers are zeroed
  /// when they come into use, see `reuse_gradient_buffers`).
  void begin_backward() {
    for (graph::node_id i = 0; i < g_.size(); ++i)
      if (!pooled_[i])
        std::fill(grad_[i].begin(), grad_[i].end(), T{});
    grad_[*g_.loss()][0] = T{1};
  }
  /// One node's backward: adds its inputs' gradients (after `begin_backward`, in reverse order).
  void backward_node(graph::node_id i) {
    enter_backward(i);
    timed(i, true, [&] { run_backward(i); });
  }
  /// Zeroes the shared gradient buffers that come into use at node i's backward; drivers that
  /// run a node's backward themselves (a transfer's dual) call it first.
  void enter_backward(graph::node_id i) {
    for (graph::node_id j : zero_before_[i])
      std::fill(grad_[j].begin(), grad_[j].end(), T{});
  }

  /// Plans the gradient buffers of intermediate nodes: a node's gradient is live from the
  /// backward of its last user (the first to add into it, in reverse order) to its own
  /// backward, and nodes whose lives do not overlap share memory (best fit over the reverse
  /// sweep). Parameters, the loss, nodes without users and `keep` keep buffers of their own, so
  /// their gradients survive the backward; every other node's gradient is valid only during
  /// the backward. `extra_users` (from, to): to's backward adds into from's gradient outside
  /// the graph's edges (a transfer's dual). Returns the bytes of gradient storage after.
  std::size_t reuse_gradient_buffers(
      const std::vector<graph::node_id>& keep = {},
      const std::vector<std::pair<graph::node_id, graph::node_id>>& extra_users = {}) {
    if (!pool_.empty() || std::ranges::any_of(pooled_, [](bool p) { return p; }))
      throw plan_error("executor", "gradient buffers are already shared",
                       "call reuse_gradient_buffers once, before the first backward");
    const std::size_t n = g_.size();
    std::vector<std::optional<graph::node_id>> last_user(n);
    const auto use = [&](graph::node_id from, graph::node_id to) {
      if (!last_user[from] || *last_user[from] < to)
        last_user[from] = to;
    };
    for (graph::node_id j = 0; j < n; ++j)
      for (graph::node_id in : g_[j].inputs)
        use(in, j);
    for (const auto& [from, to] : extra_users)
      use(from, to);
    std::vector<bool> own(n, false);
    for (graph::node_id i = 0; i < n; ++i)
      own[i] = g_[i].kind == op::parameter || g_[i].type == dtype::i64 || i == *g_.loss() ||
               !last_user[i] || grad_[i].empty();
    for (graph::node_id k : keep)
      own.at(k) = true;
    // Reverse sweep: take a slot when the last user's backward starts, free it after the
    // node's own backward.
    struct slot {
      std::size_t capacity = 0;
      bool busy = false;
    };
    std::vector<slot> slots;
    std::vector<std::size_t> slot_of(n, 0);
    std::vector<std::vector<graph::node_id>> starts(n);
    for (graph::node_id i = 0; i < n; ++i)
      if (!own[i])
        starts[*last_user[i]].push_back(i);
    for (graph::node_id c = static_cast<graph::node_id>(n); c-- > 0;) {
      for (graph::node_id j : starts[c]) {
        const std::size_t need = grad_[j].size();
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
      if (!own[c])
        slots[slot_of[c]].busy = false;
    }
    std::vector<std::size_t> offset(slots.size() + 1, 0);
    for (std::size_t k = 0; k < slots.size(); ++k)
      offset[k + 1] = offset[k] + slots[k].capacity;
    pool_.assign(offset.back(), T{});
    std::size_t bytes = pool_.size() * sizeof(T);
    for (graph::node_id i = 0; i < n; ++i) {
      pooled_[i] = !own[i];
      zero_before_[i] = starts[i];
      if (own[i]) {
        bytes += own_grad_[i].size() * sizeof(T);
        continue;
      }
      grad_[i] = std::span<T>(pool_.data() + offset[slot_of[i]], own_grad_[i].size());
      std::vector<T>().swap(own_grad_[i]);
    }
    return bytes;
  }
  /// Sums `data` element-wise over the ranks sharing a vocabulary-parallel cross-entropy
  /// (`max`: the maximum instead); required when a layout says `vocab_parallel`.
  void set_row_reduce(std::function<void(std::span<T> data, bool max)> f) {
    row_reduce_ = std::move(f);
  }

  /// Seconds spent per op kind, forward and backward, while profiling is on.
  struct profile_entry {
    double forward = 0.0;
    double backward = 0.0;
  };
  /// Starts (or stops) accumulating time per op kind and per node; starting clears earlier
  /// totals.
  void set_profiling(bool on) {
    profiling_ = on;
    if (on) {
      profile_.assign(graph::op_count, profile_entry{});
      node_profile_.assign(g_.size(), profile_entry{});
    }
  }
  [[nodiscard]] const std::vector<profile_entry>& profile() const noexcept { return profile_; }
  /// Seconds spent per node (indexed by node id), forward and backward, while profiling is on.
  [[nodiscard]] const std::vector<profile_entry>& node_profile() const noexcept {
    return node_profile_;
  }

  [[nodiscard]] std::span<T> value(graph::node_id id) { return val_.at(id); }
  [[nodiscard]] std::span<const T> value(graph::node_id id) const { return val_.at(id); }
  [[nodiscard]] std::span<T> grad(graph::node_id id) { return grad_.at(id); }
  [[nodiscard]] std::span<const T> grad(graph::node_id id) const { return grad_.at(id); }
  /// The value of an integer node (token ids, labels).
  [[nodiscard]] std::span<std::int64_t> ids(graph::node_id id) { return ids_.at(id); }
  [[nodiscard]] std::span<const std::int64_t> ids(graph::node_id id) const { return ids_.at(id); }
  /// The layout of a node; nullptr when the graph is not a local one.
  [[nodiscard]] const node_layout* layout(graph::node_id id) const {
    return layouts_.empty() ? nullptr : &layouts_.at(id);
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
  using op = graph::op;

  template <class F>
  void timed(graph::node_id i, bool backward, F&& f) {
    if (!profiling_) {
      f();
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    f();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    auto& e = profile_[static_cast<std::size_t>(g_[i].kind)];
    (backward ? e.backward : e.forward) += s;
    (backward ? node_profile_[i].backward : node_profile_[i].forward) += s;
  }

  graph::node_id input(std::string_view name, bool integral) const {
    const auto id = g_.find(name);
    if (!id || g_[*id].kind != op::input)
      throw plan_error("executor", "no input named \"" + std::string(name) + "\"",
                       "feed the inputs the model declared");
    if ((g_[*id].type == dtype::i64) != integral)
      throw plan_error("input \"" + std::string(name) + "\"",
                       integral ? "is not an integer input" : "is an integer input",
                       "feed ids as int64 and features as floating point");
    return *id;
  }

  void initialize(graph::node_id id) {
    const graph::node& n = g_[id];
    auto& v = val_[id];
    if (n.init.how == graph::initializer::kind::constant) {
      std::fill(v.begin(), v.end(), static_cast<T>(n.init.value));
      return;
    }
    const rng_key key{seed_, fnv1a64(n.name)};
    const node_layout* l = layout(id);
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<T>(n.init.value * normal01(key, l != nullptr ? l->global_index(i) : i));
  }

  [[nodiscard]] bool skip_bias(graph::node_id id) const {
    const node_layout* l = layout(id);
    return l != nullptr && l->skip_bias;
  }

  [[nodiscard]] const graph::node& in_node(const graph::node& n, std::size_t k) const {
    return g_[n.inputs[k]];
  }
  std::vector<T>& in(const graph::node& n, std::size_t k) { return val_[n.inputs[k]]; }
  std::span<T>& din(const graph::node& n, std::size_t k) { return grad_[n.inputs[k]]; }

  // (m, k, n) of a matmul or linear node: rows of x, inner size, outputs.
  [[nodiscard]] std::array<std::size_t, 3> matmul_dims(const graph::node& n) const {
    const auto& w = in_node(n, 1).out;
    return {rows(in_node(n, 0).out), w.dims[0], w.dims[1]};
  }
  // (batches, m, k, n) of a batched_matmul node.
  [[nodiscard]] std::array<std::size_t, 4> batched_dims(const graph::node& n) const {
    const auto& a = in_node(n, 0).out;
    const std::size_t r = a.rank();
    const std::size_t m = a.dims[r - 2];
    const std::size_t k = a.dims[r - 1];
    return {m * k == 0 ? 0 : a.size() / (m * k), m, k, n.out.dims[r - 1]};
  }

  // Rows of a tensor viewed as (rows, last dimension).
  static std::size_t rows(const hspmd::shape& s) {
    if (s.rank() == 0)
      return 1;
    return s.dims.back() == 0 ? 0 : s.size() / s.dims.back();
  }

  // ---- forward -------------------------------------------------------------------------------
  void run_forward(graph::node_id id) {
    const graph::node& n = g_[id];
    auto& out = val_[id];
    switch (n.kind) {
    case op::input:
    case op::parameter:
      return;
    case op::matmul:
    case op::linear: {
      const auto [m, k, nn] = matmul_dims(n);
      gemm(transpose::no, transpose::no, m, nn, k, T{1}, in(n, 0).data(), k, in(n, 1).data(), nn,
           T{0}, out.data(), nn);
      if (n.kind == op::linear && !skip_bias(id)) {
        const auto& b = in(n, 2);
        for (std::size_t i = 0; i < m; ++i)
          for (std::size_t j = 0; j < nn; ++j)
            out[i * nn + j] += b[j];
      }
      return;
    }
    case op::batched_matmul: {
      const auto [batches, m, k, nn] = batched_dims(n);
      const bool bt = n.attrs.flag;
      for (std::size_t b = 0; b < batches; ++b)
        gemm(transpose::no, bt ? transpose::yes : transpose::no, m, nn, k, T{1},
             in(n, 0).data() + b * m * k, k, in(n, 1).data() + b * k * nn, bt ? k : nn, T{0},
             out.data() + b * m * nn, nn);
      return;
    }
    case op::add:
    case op::sub:
    case op::mul: {
      const auto sa = detail::broadcast_strides(in_node(n, 0).out, n.out);
      const auto sb = detail::broadcast_strides(in_node(n, 1).out, n.out);
      const T* a = in(n, 0).data();
      const T* b = in(n, 1).data();
      if (n.kind == op::add)
        detail::for_each_broadcast(n.out, sa, sb, [&](std::size_t o, std::size_t i, std::size_t j) {
          out[o] = a[i] + b[j];
        });
      else if (n.kind == op::sub)
        detail::for_each_broadcast(n.out, sa, sb, [&](std::size_t o, std::size_t i, std::size_t j) {
          out[o] = a[i] - b[j];
        });
      else
        detail::for_each_broadcast(n.out, sa, sb, [&](std::size_t o, std::size_t i, std::size_t j) {
          out[o] = a[i] * b[j];
        });
      return;
    }
    case op::scale: {
      const auto& x = in(n, 0);
      const auto c = static_cast<T>(n.attrs.scalar);
      for (std::size_t i = 0; i < out.size(); ++i)
        out[i] = c * x[i];
      return;
    }
    case op::relu: {
      const auto& x = in(n, 0);
      for (std::size_t i = 0; i < out.size(); ++i)
        out[i] = x[i] > T{0} ? x[i] : T{0};
      return;
    }
    case op::gelu: {
      const auto& x = in(n, 0);
      for (std::size_t i = 0; i < out.size(); ++i)
        out[i] = x[i] * phi(x[i]);
      return;
    }
    case op::tanh: {
      const auto& x = in(n, 0);
      for (std::size_t i = 0; i < out.size(); ++i)
        out[i] = std::tanh(x[i]);
      return;
    }
    case op::sigmoid: {
      const auto& x = in(n, 0);
      for (std::size_t i = 0; i < out.size(); ++i)
        out[i] = T{1} / (T{1} + std::exp(-x[i]));
      return;
    }
    case op::softmax:
    case op::log_softmax: {
      const auto& x = in(n, 0);
      const std::size_t l = n.out.dims.back();
      const bool causal = n.kind == op::softmax && n.attrs.flag;
      // Query rows: the second-to-last dimension (a local piece may start at an offset).
      const std::size_t nq = n.out.rank() >= 2 ? n.out.dims[n.out.rank() - 2] : 1;
      const node_layout* lay = layout(id);
      const std::size_t q0 =
          lay != nullptr && n.out.rank() >= 2 ? lay->offset_of(n.out.rank() - 2) : 0;
      for (std::size_t r = 0; r < rows(n.out); ++r) {
        const T* xr = x.data() + r * l;
        T* yr = out.data() + r * l;
        const std::size_t seen =
            causal ? q0 + r % std::max<std::size_t>(nq, 1) + 1 : l; // query q sees keys 0 .. q
        const T mx = *std::max_element(xr, xr + seen);
        T s{0};
        for (std::size_t j = 0; j < seen; ++j)
          s += std::exp(xr[j] - mx);
        const T log_s = std::log(s);
        for (std::size_t j = 0; j < seen; ++j)
          yr[j] = n.kind == op::softmax ? std::exp(xr[j] - mx) / s : xr[j] - mx - log_s;
        for (std::size_t j = seen; j < l; ++j)
          yr[j] = T{0};
      }
      return;
    }
    case op::layer_norm: {
      const auto& x = in(n, 0);
      const auto& gamma = in(n, 1);
      const auto& beta = in(n, 2);
      const std::size_t l = n.out.dims.back();
      const std::size_t rr = rows(n.out);
      auto& saved = aux_[id]; // per row: mean, 1/std
      saved.resize(2 * rr);
      for (std::size_t r = 0; r < rr; ++r) {
        const T* xr = x.data() + r * l;
        T mu{0};
        for (std::size_t j = 0; j < l; ++j)
          mu += xr[j];
        mu /= static_cast<T>(l);
        T var{0};
        for (std::size_t j = 0; j < l; ++j)
          var += (xr[j] - mu) * (xr[j] - mu);
        var /= static_cast<T>(l);
        const T rstd = T{1} / std::sqrt(var + static_cast<T>(n.attrs.scalar));
        saved[2 * r] = mu;
        saved[2 * r + 1] = rstd;
        for (std::size_t j = 0; j < l; ++j)
          out[r * l + j] = gamma[j] * (xr[j] - mu) * rstd + beta[j];
      }
      return;
    }
    case op::embedding: {
      const auto& table = in(n, 0);
      const auto& ids = ids_[n.inputs[1]];
      const auto [v0, v, total] = vocab_range(n);
      const std::size_t h = in_node(n, 0).out.dims[1];
      for (std::size_t t = 0; t < ids.size(); ++t) {
        const auto row = checked_id(n, ids[t], total, "token id");
        if (row >= v0 && row < v0 + v)
          std::copy_n(table.data() + (row - v0) * h, h, out.data() + t * h);
        else
          std::fill_n(out.data() + t * h, h, T{0}); // another rank's rows (a partial sum)
      }
      return;
    }
    case op::cross_entropy: {
      const auto& logits = in(n, 0);
      const auto& targets = ids_[n.inputs[1]];
      const std::size_t v = in_node(n, 0).out.dims[1];
      const auto [v0, vv, vocab] = vocab_range(n);
      const node_layout* lay = layout(id);
      const bool vocab_parallel = lay != nullptr && lay->vocab_parallel;
      auto& lse = aux_[id]; // per row: log-sum-exp, reused by the backward
      lse.resize(targets.size());
      for (std::size_t r = 0; r < targets.size(); ++r) {
        const T* lr = logits.data() + r * v;
        lse[r] = v == 0 ? -std::numeric_limits<T>::infinity() : *std::max_element(lr, lr + v);
      }
      if (vocab_parallel) // the row maxima over every rank's piece of the vocabulary
        row_reduce(lse, true);
      std::vector<T> sums(targets.size(), T{0});
      for (std::size_t r = 0; r < targets.size(); ++r) {
        const T* lr = logits.data() + r * v;
        for (std::size_t j = 0; j < v; ++j)
          sums[r] += std::exp(lr[j] - lse[r]);
      }
      if (vocab_parallel)
        row_reduce(sums, false);
      T total{0};
      for (std::size_t r = 0; r < targets.size(); ++r) {
        const auto t = checked_id(n, targets[r], vocab, "target");
        lse[r] += std::log(sums[r]);
        if (!vocab_parallel || lay->owner)
          total += lse[r];
        if (t >= v0 && t < v0 + vv)
          total -= logits[r * v + t - v0];
      }
      out[0] = total;
      return;
    }
    case op::sum:
    case op::mean: {
      const auto& x = in(n, 0);
      T s{0};
      for (T v : x)
        s += v;
      out[0] = n.kind == op::sum ? s : s / static_cast<T>(global_count(n.inputs[0]));
      return;
    }
    case op::reshape:
      std::copy(in(n, 0).begin(), in(n, 0).end(), out.begin());
      return;
    case op::permute:
      permute(in_node(n, 0).out, n.attrs.dims, in(n, 0).data(), out.data(), false);
      return;
    case op::dropout: {
      const auto& x = in(n, 0);
      auto& mask = aux_[id];
      mask.assign(out.size(), T{1});
      const double p = n.attrs.scalar;
      if (training_ && p > 0.0) {
        const rng_key key{seed_ ^ (step_ * 0x9E3779B97F4A7C15ULL), fnv1a64(n.name)};
        const auto keep = static_cast<T>(1.0 / (1.0 - p));
        std::vector<double> u(std::min<std::size_t>(mask.size(), 4096));
        // Runs of consecutive global indices (a local piece is one run per outer index).
        const node_layout* lay = layout(id);
        std::size_t run = mask.size();
        if (lay != nullptr && lay->split) {
          run = lay->length;
          for (std::size_t d = *lay->split + 1; d < lay->global.size(); ++d)
            run *= lay->global[d];
        }
        for (std::size_t r0 = 0; run > 0 && r0 < mask.size(); r0 += run) {
          const std::size_t g0 = lay != nullptr ? lay->global_index(r0) : r0;
          for (std::size_t at = 0; at < run; at += u.size()) {
            const std::size_t len = std::min(u.size(), run - at);
            fill_uniform01_u32(key, g0 + at, len, u.data());
            for (std::size_t i = 0; i < len; ++i)
              mask[r0 + at + i] = u[i] >= p ? keep : T{0};
          }
        }
      }
      for (std::size_t i = 0; i < out.size(); ++i)
        out[i] = x[i] * mask[i];
      return;
    }
    case op::slice:
    case op::concat:
      copy_blocks(id, false);
      return;
    case op::conv2d:
      conv2d(id, false);
      return;
    case op::max_pool2d: {
      const auto& x = in(n, 0);
      const auto& xs = in_node(n, 0).out.dims;
      const std::size_t k = n.attrs.dims[0];
      const std::size_t st = n.attrs.dims[1];
      const std::size_t ho = n.out.dims[2];
      const std::size_t wo = n.out.dims[3];
      auto& arg = index_[id];
      arg.resize(out.size());
      for (std::size_t p = 0; p < xs[0] * xs[1]; ++p) // each (image, channel) plane
        for (std::size_t i = 0; i < ho; ++i)
          for (std::size_t j = 0; j < wo; ++j) {
            std::size_t best = p * xs[2] * xs[3] + i * st * xs[3] + j * st;
            for (std::size_t r = 0; r < k; ++r)
              for (std::size_t c = 0; c < k; ++c) {
                const std::size_t at = p * xs[2] * xs[3] + (i * st + r) * xs[3] + j * st + c;
                if (x[at] > x[best])
                  best = at;
              }
            const std::size_t o = (p * ho + i) * wo + j;
            arg[o] = best;
            out[o] = x[best];
          }
      return;
    }
    case op::adaptive_avg_pool2d:
      adaptive_pool(id, false);
      return;
    case op::moe_dispatch:
      moe_dispatch(id, false);
      return;
    case op::moe_combine:
      moe_combine(id, false);
      return;
    case op::broadcast: {
      const auto sx = detail::broadcast_strides(in_node(n, 0).out, n.out);
      const T* x = in(n, 0).data();
      detail::for_each_broadcast(n.out, sx, sx,
                                 [&](std::size_t o, std::size_t i, std::size_t) { out[o] = x[i]; });
      return;
    }
    }
  }

  // ---- backward ------------------------------------------------------------------------------
  void run_backward(graph::node_id id) {
    const graph::node& n = g_[id];
    if (n.type == dtype::i64)
      return;
    const auto& g = grad_[id];
    const auto& y = val_[id];
    switch (n.kind) {
    case op::input:
    case op::parameter:
      return;
    case op::matmul:
    case op::linear: {
      const auto [m, k, nn] = matmul_dims(n);
      // dX += dY W^T ; dW += X^T dY
      gemm(transpose::no, transpose::yes, m, k, nn, T{1}, g.data(), nn, in(n, 1).data(), nn, T{1},
           din(n, 0).data(), k);
      gemm(transpose::yes, transpose::no, k, nn, m, T{1}, in(n, 0).data(), k, g.data(), nn, T{1},
           din(n, 1).data(), nn);
      if (n.kind == op::linear && !skip_bias(id)) {
        auto& db = din(n, 2);
        for (std::size_t i = 0; i < m; ++i)
          for (std::size_t j = 0; j < nn; ++j)
            db[j] += g[i * nn + j];
      }
      return;
    }
    case op::batched_matmul: {
      const auto [batches, m, k, nn] = batched_dims(n);
      const bool bt = n.attrs.flag;
      for (std::size_t b = 0; b < batches; ++b) {
        const T* gb = g.data() + b * m * nn;
        const T* ab = in(n, 0).data() + b * m * k;
        const T* bb = in(n, 1).data() + b * k * nn;
        T* dab = din(n, 0).data() + b * m * k;
        T* dbb = din(n, 1).data() + b * k * nn;
        if (!bt) { // C = A B: dA += dC B^T (m x k), dB += A^T dC (k x n)
          gemm(transpose::no, transpose::yes, m, k, nn, T{1}, gb, nn, bb, nn, T{1}, dab, k);
          gemm(transpose::yes, transpose::no, k, nn, m, T{1}, ab, k, gb, nn, T{1}, dbb, nn);
        } else { // C = A B^T, B is n x k: dA += dC B (m x k), dB += dC^T A (n x k)
          gemm(transpose::no, transpose::no, m, k, nn, T{1}, gb, nn, bb, k, T{1}, dab, k);
          gemm(transpose::yes, transpose::no, nn, k, m, T{1}, gb, nn, ab, k, T{1}, dbb, k);
        }
      }
      return;
    }
    case op::add:
    case op::sub:
    case op::mul: {
      const auto sa = detail::broadcast_strides(in_node(n, 0).out, n.out);
      const auto sb = detail::broadcast_strides(in_node(n, 1).out, n.out);
      auto& da = din(n, 0);
      auto& db = din(n, 1);
      const T* a = in(n, 0).data();
      const T* b = in(n, 1).data();
      if (n.kind == op::add)
        detail::for_each_broadcast(n.out, sa, sb, [&](std::size_t o, std::size_t i, std::size_t j) {
          da[i] += g[o];
          db[j] += g[o];
        });
      else if (n.kind == op::sub)
        detail::for_each_broadcast(n.out, sa, sb, [&](std::size_t o, std::size_t i, std::size_t j) {
          da[i] += g[o];
          db[j] -= g[o];
        });
      else
        detail::for_each_broadcast(n.out, sa, sb, [&](std::size_t o, std::size_t i, std::size_t j) {
          da[i] += g[o] * b[j];
          db[j] += g[o] * a[i];
        });
      return;
    }
    case op::scale: {
      auto& dx = din(n, 0);
      const auto c = static_cast<T>(n.attrs.scalar);
      for (std::size_t i = 0; i < g.size(); ++i)
        dx[i] += c * g[i];
      return;
    }
    case op::relu: {
      auto& dx = din(n, 0);
      const auto& x = in(n, 0);
      for (std::size_t i = 0; i < g.size(); ++i)
        dx[i] += x[i] > T{0} ? g[i] : T{0};
      return;
    }
    case op::gelu: {
      auto& dx = din(n, 0);
      const auto& x = in(n, 0);
      const T inv_sqrt_2pi = static_cast<T>(1.0 / std::sqrt(2.0 * std::numbers::pi));
      constexpr T tiny = std::numeric_limits<T>::min() * T{1024};
      for (std::size_t i = 0; i < g.size(); ++i) { // d/dx x Phi(x) = Phi(x) + x phi(x)
        // Phi(x) = y / x recovers the forward's erf to an ulp; erf again only near 0.
        const T cdf = std::abs(x[i]) > tiny ? y[i] / x[i] : phi(x[i]);
        dx[i] += g[i] * (cdf + x[i] * inv_sqrt_2pi * std::exp(-x[i] * x[i] / T{2}));
      }
      return;
    }
    case op::tanh: {
      auto& dx = din(n, 0);
      for (std::size_t i = 0; i < g.size(); ++i)
        dx[i] += g[i] * (T{1} - y[i] * y[i]);
      return;
    }
    case op::sigmoid: {
      auto& dx = din(n, 0);
      for (std::size_t i = 0; i < g.size(); ++i)
        dx[i] += g[i] * y[i] * (T{1} - y[i]);
      return;
    }
    case op::softmax:
    case op::log_softmax: {
      auto& dx = din(n, 0);
      const std::size_t l = n.out.dims.back();
      for (std::size_t r = 0; r < rows(n.out); ++r) {
        const T* gr = g.data() + r * l;
        const T* yr = y.data() + r * l;
        T* dr = dx.data() + r * l;
        T s{0};
        if (n.kind == op::softmax) { // dx = y (g - sum g y)
          for (std::size_t j = 0; j < l; ++j)
            s += gr[j] * yr[j];
          for (std::size_t j = 0; j < l; ++j)
            dr[j] += yr[j] * (gr[j] - s);
        } else { // dx = g - softmax * sum g
          for (std::size_t j = 0; j < l; ++j)
            s += gr[j];
          for (std::size_t j = 0; j < l; ++j)
            dr[j] += gr[j] - std::exp(yr[j]) * s;
        }
      }
      return;
    }
    case op::layer_norm: {
      const auto& x = in(n, 0);
      const auto& gamma = in(n, 1);
      auto& dx = din(n, 0);
      auto& dgamma = din(n, 1);
      auto& dbeta = din(n, 2);
      const auto& saved = aux_[id];
      const std::size_t l = n.out.dims.back();
      const auto lt = static_cast<T>(l);
      for (std::size_t r = 0; r < rows(n.out); ++r) {
        const T mu = saved[2 * r];
        const T rstd = saved[2 * r + 1];
        const T* xr = x.data() + r * l;
        const T* gr = g.data() + r * l;
        T sum_dxhat{0};
        T sum_dxhat_xhat{0};
        for (std::size_t j = 0; j < l; ++j) {
          const T xhat = (xr[j] - mu) * rstd;
          const T dxhat = gr[j] * gamma[j];
          sum_dxhat += dxhat;
          sum_dxhat_xhat += dxhat * xhat;
          dgamma[j] += gr[j] * xhat;
          dbeta[j] += gr[j];
        }
        for (std::size_t j = 0; j < l; ++j) {
          const T xhat = (xr[j] - mu) * rstd;
          const T dxhat = gr[j] * gamma[j];
          dx[r * l + j] += rstd / lt * (lt * dxhat - sum_dxhat - xhat * sum_dxhat_xhat);
        }
      }
      return;
    }
    case op::embedding: {
      auto& dtable = din(n, 0);
      const auto& ids = ids_[n.inputs[1]];
      const std::size_t h = in_node(n, 0).out.dims[1];
      const auto [v0, v, total] = vocab_range(n);
      for (std::size_t t = 0; t < ids.size(); ++t) {
        const auto row = static_cast<std::size_t>(ids[t]);
        if (row < v0 || row >= v0 + v)
          continue;
        for (std::size_t j = 0; j < h; ++j)
          dtable[(row - v0) * h + j] += g[t * h + j];
      }
      return;
    }
    case op::cross_entropy: {
      const auto& logits = in(n, 0);
      auto& dl = din(n, 0);
      const auto& targets = ids_[n.inputs[1]];
      const std::size_t v = in_node(n, 0).out.dims[1];
      const auto& lse = aux_[id];
      const auto [v0, vv, total] = vocab_range(n);
      for (std::size_t r = 0; r < targets.size(); ++r) {
        const T* lr = logits.data() + r * v;
        for (std::size_t j = 0; j < v; ++j) // g * softmax(l) - g * onehot(t)
          dl[r * v + j] += g[0] * std::exp(lr[j] - lse[r]);
        const auto t = static_cast<std::size_t>(targets[r]);
        if (t >= v0 && t < v0 + vv)
          dl[r * v + t - v0] -= g[0];
      }
      return;
    }
    case op::sum:
    case op::mean: {
      auto& dx = din(n, 0);
      const T each = n.kind == op::sum ? g[0] : g[0] / static_cast<T>(global_count(n.inputs[0]));
      for (T& d : dx)
        d += each;
      return;
    }
    case op::reshape: {
      auto& dx = din(n, 0);
      for (std::size_t i = 0; i < g.size(); ++i)
        dx[i] += g[i];
      return;
    }
    case op::permute:
      permute(in_node(n, 0).out, n.attrs.dims, g.data(), din(n, 0).data(), true);
      return;
    case op::dropout: {
      auto& dx = din(n, 0);
      const auto& mask = aux_[id];
      for (std::size_t i = 0; i < g.size(); ++i)
        dx[i] += g[i] * mask[i];
      return;
    }
    case op::slice:
    case op::concat:
      copy_blocks(id, true);
      return;
    case op::conv2d:
      conv2d(id, true);
      return;
    case op::max_pool2d: {
      auto& dx = din(n, 0);
      const auto& arg = index_[id];
      for (std::size_t o = 0; o < g.size(); ++o)
        dx[arg[o]] += g[o];
      return;
    }
    case op::adaptive_avg_pool2d:
      adaptive_pool(id, true);
      return;
    case op::moe_dispatch:
      moe_dispatch(id, true);
      return;
    case op::moe_combine:
      moe_combine(id, true);
      return;
    case op::broadcast: {
      const auto sx = detail::broadcast_strides(in_node(n, 0).out, n.out);
      auto& dx = din(n, 0);
      detail::for_each_broadcast(n.out, sx, sx,
                                 [&](std::size_t o, std::size_t i, std::size_t) { dx[i] += g[o]; });
      return;
    }
    }
  }

  // conv2d by im2col + GEMM, one image at a time. The column matrix of image b is
  // (C R S) x (Ho Wo): entry ((c R + r) S + s, oh Wo + ow) is x[b, c, oh*stride - pad + r,
  // ow*stride - pad + s] (0 outside the image). Forward: y_b = W col_b + bias. Backward:
  // dW += dy_b col_b^T, dcol = W^T dy_b scattered back into dx, dbias += row sums of dy_b.
  void conv2d(graph::node_id id, bool backward) {
    const graph::node& n = g_[id];
    const auto& xs = in_node(n, 0).out.dims; // N, C, H, W
    const auto& ws = in_node(n, 1).out.dims; // K, C, R, S
    const std::size_t stride = n.attrs.dims[0];
    const std::size_t pad = n.attrs.dims[1];
    const std::size_t ho = n.out.dims[2];
    const std::size_t wo = n.out.dims[3];
    const std::size_t crs = ws[1] * ws[2] * ws[3];
    const std::size_t plane = ho * wo;
    const std::size_t image = xs[1] * xs[2] * xs[3];
    std::vector<T> col(crs * plane);
    std::vector<T> dcol(backward ? crs * plane : 0);
    // Visits every (column row, output position) with its input offset, or none when padded.
    const auto each = [&](auto&& f) {
      for (std::size_t c = 0; c < ws[1]; ++c)
        for (std::size_t r = 0; r < ws[2]; ++r)
          for (std::size_t s = 0; s < ws[3]; ++s) {
            const std::size_t row = (c * ws[2] + r) * ws[3] + s;
            for (std::size_t oh = 0; oh < ho; ++oh) {
              const std::size_t ih = oh * stride + r;
              for (std::size_t ow = 0; ow < wo; ++ow) {
                const std::size_t iw = ow * stride + s;
                const bool inside = ih >= pad && iw >= pad && ih - pad < xs[2] && iw - pad < xs[3];
                f(row * plane + oh * wo + ow,
                  inside ? (c * xs[2] + ih - pad) * xs[3] + iw - pad : image);
              }
            }
          }
    };
    for (std::size_t b = 0; b < xs[0]; ++b) {
      const T* x = in(n, 0).data() + b * image;
      each([&](std::size_t at, std::size_t from) { col[at] = from < image ? x[from] : T{0}; });
      if (!backward) {
        T* y = val_[id].data() + b * ws[0] * plane;
        gemm(transpose::no, transpose::no, ws[0], plane, crs, T{1}, in(n, 1).data(), crs,
             col.data(), plane, T{0}, y, plane);
        if (!skip_bias(id))
          for (std::size_t k = 0; k < ws[0]; ++k)
            for (std::size_t p = 0; p < plane; ++p)
              y[k * plane + p] += in(n, 2)[k];
        continue;
      }
      const T* dy = grad_[id].data() + b * ws[0] * plane;
      gemm(transpose::no, transpose::yes, ws[0], crs, plane, T{1}, dy, plane, col.data(), plane,
           T{1}, din(n, 1).data(), crs);
      gemm(transpose::yes, transpose::no, crs, plane, ws[0], T{1}, in(n, 1).data(), crs, dy, plane,
           T{0}, dcol.data(), plane);
      T* dx = din(n, 0).data() + b * image;
      each([&](std::size_t at, std::size_t from) {
        if (from < image)
          dx[from] += dcol[at];
      });
      if (!skip_bias(id))
        for (std::size_t k = 0; k < ws[0]; ++k)
          for (std::size_t p = 0; p < plane; ++p)
            din(n, 2)[k] += dy[k * plane + p];
    }
  }

  // MoE dispatch: token t's row goes to slot s of expert e for each of its routed choices.
  // The routing is discrete: no gradient flows to the probabilities here (it does in combine).
  // Sharded (a rank's local graph): token parallel routes the rank's tokens into its share of
  // the capacity (the output's local capacity); hidden parallel routes every token and copies
  // the rank's hidden columns.
  void moe_dispatch(graph::node_id id, bool backward) {
    const graph::node& n = g_[id];
    const std::size_t tokens = in_node(n, 0).out.dims[0];
    const std::size_t h = in_node(n, 0).out.dims[1];
    const std::size_t experts = in_node(n, 1).out.dims[1];
    const std::size_t capacity = n.out.dims[1];
    const auto r = route_top2(in(n, 1).data(), tokens, experts, capacity);
    if (!backward)
      std::fill(val_[id].begin(), val_[id].end(), T{0}); // unused slots are zero
    for (std::size_t k = 0; k < 2 * tokens; ++k) {
      if (r.slots[k] == moe_routing::dropped)
        continue;
      const std::size_t t = k / 2;
      const std::size_t at = (r.experts[k] * capacity + r.slots[k]) * h;
      for (std::size_t j = 0; j < h; ++j) {
        if (backward)
          din(n, 0)[t * h + j] += grad_[id][at + j];
        else
          val_[id][at + j] = in(n, 0)[t * h + j];
      }
    }
  }

  // MoE combine: y_t = g1 out[e1, s1] + g2 out[e2, s2] with g_k = p_ek / (p_e1 + p_e2); a dropped
  // choice contributes nothing. Backward: d out = g dy; d g_k = dy . out_k, through the
  // normalization to the two probabilities. Expert parallel (the rank holds experts
  // [first, first + held) of the buffers, all probabilities): every token is routed, only the
  // rank's experts contribute, and the output (and the probabilities' gradient) is a partial
  // sum over ranks.
  void moe_combine(graph::node_id id, bool backward) {
    const graph::node& n = g_[id];
    const std::size_t held = in_node(n, 0).out.dims[0];
    const std::size_t capacity = in_node(n, 0).out.dims[1];
    const std::size_t h = in_node(n, 0).out.dims[2];
    const std::size_t tokens = in_node(n, 1).out.dims[0];
    const std::size_t experts = in_node(n, 1).out.dims[1];
    const node_layout* buffers = layout(n.inputs[0]);
    const std::size_t first = buffers != nullptr ? buffers->offset_of(0) : 0;
    const T* probs = in(n, 1).data();
    const auto r = route_top2(probs, tokens, experts, capacity);
    if (!backward)
      std::fill(val_[id].begin(), val_[id].end(), T{0});
    for (std::size_t t = 0; t < tokens; ++t) {
      const std::size_t e1 = r.experts[2 * t];
      const std::size_t e2 = r.experts[2 * t + 1];
      const T p1 = probs[t * experts + e1];
      const T p2 = probs[t * experts + e2];
      const T z = p1 + p2;
      const T gates[2] = {p1 / z, p2 / z};
      T dgate[2] = {T{0}, T{0}};
      for (std::size_t k = 0; k < 2; ++k) {
        const std::size_t slot = r.slots[2 * t + k];
        const std::size_t e = r.experts[2 * t + k];
        if (slot == moe_routing::dropped || e < first || e >= first + held)
          continue;
        const std::size_t at = ((e - first) * capacity + slot) * h;
        for (std::size_t j = 0; j < h; ++j) {
          if (backward) {
            const T dy = grad_[id][t * h + j];
            din(n, 0)[at + j] += gates[k] * dy;
            dgate[k] += dy * in(n, 0)[at + j];
          } else {
            val_[id][t * h + j] += gates[k] * in(n, 0)[at + j];
          }
        }
      }
      if (backward) { // g1 = p1 / z, g2 = p2 / z
        auto& dp = din(n, 1);
        dp[t * experts + e1] += (dgate[0] * p2 - dgate[1] * p2) / (z * z);
        dp[t * experts + e2] += (dgate[1] * p1 - dgate[0] * p1) / (z * z);
      }
    }
  }

  // Adaptive average pooling: output cell (i, j) averages the input window rows
  // [i H / Ho, ceil((i + 1) H / Ho)) by the same rule for columns.
  void adaptive_pool(graph::node_id id, bool backward) {
    const graph::node& n = g_[id];
    const auto& xs = in_node(n, 0).out.dims;
    const std::size_t ho = n.out.dims[2];
    const std::size_t wo = n.out.dims[3];
    for (std::size_t p = 0; p < xs[0] * xs[1]; ++p)
      for (std::size_t i = 0; i < ho; ++i)
        for (std::size_t j = 0; j < wo; ++j) {
          const auto [r0, r1] = graph::adaptive_window(i, xs[2], ho);
          const auto [c0, c1] = graph::adaptive_window(j, xs[3], wo);
          const auto count = static_cast<T>((r1 - r0) * (c1 - c0));
          const std::size_t o = (p * ho + i) * wo + j;
          T acc{0};
          for (std::size_t r = r0; r < r1; ++r)
            for (std::size_t c = c0; c < c1; ++c) {
              const std::size_t at = (p * xs[2] + r) * xs[3] + c;
              if (backward)
                din(n, 0)[at] += grad_[id][o] / count;
              else
                acc += in(n, 0)[at];
            }
          if (!backward)
            val_[id][o] = acc / count;
        }
  }

  // Slice and concat move blocks along one axis. Viewing a tensor as (outer, axis, inner), input
  // k's block of `len` rows lands at `at` in the output's axis. Forward copies input -> output;
  // backward adds output gradient -> input gradient.
  void copy_blocks(graph::node_id id, bool backward) {
    const graph::node& n = g_[id];
    const std::size_t axis = n.attrs.dims[0];
    const auto& dims = n.kind == op::slice ? in_node(n, 0).out.dims : n.out.dims;
    std::size_t outer = 1;
    std::size_t inner = 1;
    for (std::size_t d = 0; d < axis; ++d)
      outer *= dims[d];
    for (std::size_t d = axis + 1; d < dims.size(); ++d)
      inner *= dims[d];
    if (n.kind == op::slice) { // the input is the big tensor
      const std::size_t total = dims[axis];
      const std::size_t start = n.attrs.dims[1];
      const std::size_t len = n.attrs.dims[2];
      T* big = backward ? din(n, 0).data() : in(n, 0).data();
      T* part = backward ? grad_[id].data() : val_[id].data();
      for (std::size_t o = 0; o < outer; ++o)
        for (std::size_t r = 0; r < len; ++r)
          for (std::size_t i = 0; i < inner; ++i) {
            T& b = big[(o * total + start + r) * inner + i];
            T& p = part[(o * len + r) * inner + i];
            if (backward)
              b += p;
            else
              p = b;
          }
      return;
    }
    const std::size_t total = dims[axis]; // concat: the output is the big tensor
    std::size_t at = 0;
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      const std::size_t len = in_node(n, k).out.dims[axis];
      T* part = backward ? din(n, k).data() : in(n, k).data();
      T* big = backward ? grad_[id].data() : val_[id].data();
      for (std::size_t o = 0; o < outer; ++o)
        for (std::size_t r = 0; r < len; ++r)
          for (std::size_t i = 0; i < inner; ++i) {
            T& b = big[(o * total + at + r) * inner + i];
            T& p = part[(o * len + r) * inner + i];
            if (backward)
              p += b;
            else
              b = p;
          }
      at += len;
    }
  }

  // The rows of an embedding table / columns of cross-entropy logits this node holds: first,
  // count, and the whole vocabulary.
  struct vocab_span {
    std::size_t first, count, total;
  };
  [[nodiscard]] vocab_span vocab_range(const graph::node& n) const {
    const std::size_t axis = n.kind == op::embedding ? 0 : 1;
    const std::size_t local = in_node(n, 0).out.dims[axis];
    const node_layout* l = layout(n.inputs[0]);
    if (l == nullptr)
      return {0, local, local};
    return {l->offset_of(axis), local, l->global.at(axis)};
  }
  // Elements of the whole tensor node `id` holds a piece of.
  [[nodiscard]] std::size_t global_count(graph::node_id id) const {
    const node_layout* l = layout(id);
    return std::max<std::size_t>(l != nullptr ? l->global_size() : g_[id].out.size(), 1);
  }
  void row_reduce(std::vector<T>& v, bool max) {
    if (!row_reduce_)
      throw plan_error("executor", "a vocabulary-parallel cross-entropy without a communicator",
                       "run local graphs through exec::distributed_executor");
    row_reduce_(std::span<T>(v), max);
  }

  static T phi(T x) { // standard normal CDF
    return static_cast<T>(0.5) * (T{1} + std::erf(x / std::numbers::sqrt2_v<T>));
  }

  std::size_t checked_id(const graph::node& n, std::int64_t id, std::size_t limit,
                         const char* what) const {
    if (id < 0 || static_cast<std::size_t>(id) >= limit)
      throw shape_error("graph node \"" + n.name + "\"",
                        std::string(what) + " " + std::to_string(id) + " is out of range [0, " +
                            std::to_string(limit) + ")",
                        "check the data against the model's vocabulary or class count");
    return static_cast<std::size_t>(id);
  }

  // out[permuted index] = in[index] (forward), or accumulate in the reverse direction.
  static void permute(const hspmd::shape& in_shape, const std::vector<std::size_t>& perm,
                      const T* src, T* dst, bool reverse) {
    const std::size_t r = in_shape.rank();
    const auto in_strides = detail::strides_of(in_shape.dims);
    std::vector<std::size_t> out_dims(r);
    for (std::size_t i = 0; i < r; ++i)
      out_dims[i] = in_shape.dims[perm[i]];
    std::vector<std::size_t> idx(r, 0);
    const std::size_t total = in_shape.size();
    for (std::size_t o = 0; o < total; ++o) {
      std::size_t from = 0;
      for (std::size_t i = 0; i < r; ++i)
        from += idx[i] * in_strides[perm[i]];
      if (reverse)
        dst[from] += src[o];
      else
        dst[o] = src[from];
      for (std::size_t d = r; d-- > 0;) {
        if (++idx[d] < out_dims[d])
          break;
        idx[d] = 0;
      }
    }
  }

  const graph::graph& g_;
  std::uint64_t seed_;
  std::vector<node_layout> layouts_;
  std::function<void(std::span<T>, bool)> row_reduce_;
  std::uint64_t step_ = 0;
  bool training_ = true;
  bool profiling_ = false;
  std::vector<profile_entry> profile_, node_profile_;
  std::vector<std::vector<T>> val_, aux_;
  std::vector<std::span<T>> grad_;       // own_grad_[i], or a range of pool_
  std::vector<std::vector<T>> own_grad_; // nodes with a gradient buffer of their own
  std::vector<T> pool_;                  // shared gradient buffers (reuse_gradient_buffers)
  std::vector<bool> pooled_;             // grad_[i] lies in pool_
  std::vector<std::vector<graph::node_id>> zero_before_; // zeroed when node i's backward starts
  std::vector<std::vector<std::size_t>> index_;          // max_pool2d: where each maximum came from
  std::vector<std::vector<std::int64_t>> ids_;
};

/// Writes the executor's per-op-kind profile as a table, most expensive first: op, forward and
/// backward milliseconds per step (totals divided by `steps`), and share of the graph's time.
template <std::floating_point T>
void write_profile(std::ostream& out, const executor<T>& ex, std::size_t steps) {
  const auto& p = ex.profile();
  std::vector<std::size_t> kinds;
  double total = 0.0;
  for (std::size_t k = 0; k < p.size(); ++k)
    if (p[k].forward + p[k].backward > 0.0) {
      kinds.push_back(k);
      total += p[k].forward + p[k].backward;
    }
  std::ranges::stable_sort(kinds, [&](std::size_t a, std::size_t b) {
    return p[a].forward + p[a].backward > p[b].forward + p[b].backward;
  });
  const double per = 1e3 / static_cast<double>(std::max<std::size_t>(steps, 1));
  char line[160];
  std::snprintf(line, sizeof line, "%-22s %12s %12s %8s\n", "op", "forward ms", "backward ms",
                "share");
  out << line;
  for (auto k : kinds) {
    std::snprintf(line, sizeof line, "%-22s %12.2f %12.2f %7.1f%%\n",
                  std::string(graph::name(static_cast<graph::op>(k))).c_str(), p[k].forward * per,
                  p[k].backward * per, 100.0 * (p[k].forward + p[k].backward) / total);
    out << line;
  }
  std::snprintf(line, sizeof line, "%-22s %25.2f ms per step\n", "graph total", total * per);
  out << line;
}

} // namespace hspmd::exec

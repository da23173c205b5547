#pragma once
// Tracing a model's forward pass into a graph.
//
// Model code works on `value<T, E>`: a node of the tracer's graph with typed extents, so the
// static shape rules of core/ (matmul inner sizes, elementwise shapes) fail at compile time,
// while the runtime sizes (the bound batch, configured sizes) are checked as the node is added.
//
//     nn::tracer t(dtype::f32, /*batch=*/32);
//     auto x = t.input<float, extents<batch, 784>>("x");          // (batch=32, 784)
//     auto y = model.forward(t, x);                                 // records nodes
//     t.set_loss(nn::cross_entropy(t, logits, labels));
//     graph::graph g = t.take();
//
// Parameters are named by the scopes they are created in (`layers.3.attn.wq`) and created once:
// asking for an existing name returns the same node, so modules can be called again (weight
// sharing) without duplicating weights.

#include <hspmd/core/dtype.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/core/extents.hpp>
#include <hspmd/core/placement.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/graph/ops.hpp>
#include <hspmd/graph/rules.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace hspmd::nn {

class tracer;

/// The placement of a value that the synthesizer decides (nothing pinned in the type).
struct unpinned {};

/// `unpinned`, or a placement type (`replicated`, `partial`, `split<D>`) that pins the value.
template <class P>
concept pin_type = placement_type<P> || std::same_as<P, unpinned>;

/// The placement a pin type fixes, if any.
template <pin_type P>
inline constexpr std::optional<placement> pin_of = std::nullopt;
template <placement_type P>
inline constexpr std::optional<placement> pin_of<P> = placement_of<P>;

/// A traced tensor: a node of a tracer's graph with typed extents and, optionally, a placement
/// pinned in its type (manual SPMD: ops on pinned values run locally and their results' pins
/// follow from the rule table at compile time; see nn/ops.hpp).
template <class T, extents_type E, pin_type P = unpinned>
class value {
public:
  using element_type = T;
  using extents_type = E;
  using placement_type = P;
  value(tracer& t, graph::node_id id, const E& e) : tracer_(&t), id_(id), extents_(e) {}

  [[nodiscard]] graph::node_id id() const noexcept { return id_; }
  [[nodiscard]] const E& extents() const noexcept { return extents_; }
  [[nodiscard]] std::size_t extent(std::size_t i) const noexcept { return extents_.extent(i); }
  [[nodiscard]] tracer& owner() const noexcept { return *tracer_; }

private:
  tracer* tracer_;
  graph::node_id id_;
  E extents_;
};

/// Records nodes; binds the batch size; names parameters by scope.
class tracer {
public:
  explicit tracer(dtype type = dtype::f32, std::size_t batch_size = 1)
      : type_(type), batch_(batch_size) {
    if (!is_floating(type) || size_of(type) < 4)
      throw plan_error("nn::tracer", "element type " + std::string(name(type)),
                       "f32 or f64 for traced models");
    if (batch_size == 0) // a step of no samples would train on nothing and report loss 0
      throw config_error("batch 0", "a training step needs at least one sample",
                         "give a batch of 1 or more");
  }

  /// The bound batch size.
  [[nodiscard]] std::size_t batch() const noexcept { return batch_; }
  [[nodiscard]] dtype type() const noexcept { return type_; }
  [[nodiscard]] const graph::graph& graph() const noexcept { return g_; }

  /// Names created while the returned guard lives are prefixed with `name` and a dot.
  class scope_guard {
  public:
    explicit scope_guard(tracer& t) : t_(&t) {}
    scope_guard(const scope_guard&) = delete;
    scope_guard& operator=(const scope_guard&) = delete;
    ~scope_guard() { t_->scopes_.pop_back(); }

  private:
    tracer* t_;
  };
  [[nodiscard]] scope_guard scope(std::string name) {
    scopes_.push_back(std::move(name));
    return scope_guard(*this);
  }
  /// `leaf` with the current scopes: "layers.3.attn" + "wq" -> "layers.3.attn.wq".
  [[nodiscard]] std::string qualified(std::string_view leaf) const {
    std::string s;
    for (const auto& p : scopes_)
      s += p + ".";
    return s + std::string(leaf);
  }

  /// A data input with extents E: `batch` dimensions take the bound batch size, other runtime
  /// dimensions are given in order. `type` defaults to the tracer's element type (token ids and
  /// labels are i64).
  /// `P` pins its placement (e.g. `split<0>`: every rank reads its share of the batch).
  template <class T, extents_type E, pin_type P = unpinned, std::integral... Ds>
  value<T, E, P> input(std::string name, Ds... runtime_dims) {
    static_assert(!std::same_as<P, partial>, "nn::tracer: an input cannot be partial");
    const E e = bind<E>(runtime_dims...);
    graph::node n;
    n.kind = graph::op::input;
    n.name = std::move(name);
    n.out = e.shape();
    n.type = std::is_integral_v<T> ? dtype::i64 : type_;
    n.pin = pin_of<P>;
    return {*this, add(std::move(n)), e};
  }

  /// The parameter named qualified(leaf), created with `init` on first use; `P` pins its
  /// placement (e.g. `split<1>` for a column-parallel weight).
  template <class T, extents_type E, pin_type P = unpinned>
  value<T, E, P> parameter(std::string_view leaf, const E& e, graph::initializer init) {
    static_assert(!std::same_as<P, partial>, "nn::tracer: a parameter cannot be partial");
    const std::string full = qualified(leaf);
    if (const auto id = g_.find(full)) {
      if (g_[*id].kind != graph::op::parameter || g_[*id].out != e.shape())
        throw plan_error("parameter \"" + full + "\"",
                         "exists with shape " + g_[*id].out.to_string() + ", asked for " +
                             e.shape().to_string(),
                         "give distinct modules distinct names");
      return {*this, *id, e};
    }
    graph::node n;
    n.kind = graph::op::parameter;
    n.name = full;
    n.out = e.shape();
    n.type = type_;
    n.init = init;
    n.pin = pin_of<P>;
    return {*this, add(std::move(n)), e};
  }

  /// Appends an op node; infers and checks its shape (throws `shape_error` naming the node).
  graph::node_id op(graph::op kind, std::vector<graph::node_id> inputs,
                    graph::attributes attrs = {}) {
    graph::node n;
    n.kind = kind;
    n.inputs = std::move(inputs);
    n.attrs = std::move(attrs);
    n.type = type_;
    n.name = qualified(std::string(graph::name(kind)) + std::to_string(g_.size()));
    n.out = graph::infer_shape(g_, n);
    propagate_pins(n);
    return add(std::move(n));
  }

  /// Appends an identity node whose output is pinned to `p` (a redistribution: the
  /// synthesizer inserts the collective that moves the operand there).
  graph::node_id redistribute(graph::node_id x, placement p) {
    graph::node n;
    n.kind = graph::op::reshape;
    n.inputs = {x};
    n.attrs.dims = g_[x].out.dims;
    n.type = g_[x].type;
    n.name = qualified("redistribute" + std::to_string(g_.size()));
    n.out = graph::infer_shape(g_, n);
    n.pin = p;
    return add(std::move(n));
  }

  /// Marks the scalar loss.
  template <class T, extents_type E, pin_type P>
  void set_loss(const value<T, E, P>& loss) {
    g_.set_loss(loss.id());
  }

  /// Hands over the recorded graph (the tracer is empty afterwards).
  [[nodiscard]] graph::graph take() { return std::exchange(g_, graph::graph{}); }

  /// Extents E with `batch` bound and the runtime dimensions given in order.
  template <extents_type E, std::integral... Ds>
  [[nodiscard]] E bind(Ds... runtime_dims) const {
    constexpr std::size_t given = sizeof...(Ds);
    static_assert(given + (E::has_batch ? 1U : 0U) == E::rank_dynamic(),
                  "nn::tracer: give one size per runtime dimension other than batch");
    std::array<std::size_t, E::rank_dynamic()> ds{};
    const std::array<std::size_t, given> vals{static_cast<std::size_t>(runtime_dims)...};
    std::size_t next = 0;
    std::size_t k = 0;
    for (std::size_t i = 0; i < E::rank(); ++i) {
      if (is_static_extent(E::static_extent(i)))
        continue;
      ds[k++] = E::static_extent(i) == hspmd::batch ? batch_ : vals[next++];
    }
    if constexpr (E::rank_dynamic() == 0)
      return E{};
    else
      return E{ds};
  }

private:
  graph::node_id add(graph::node n) { return g_.add(std::move(n)); }

  // Pins of operands fix the output's placement where the rule table allows only one (the
  // same function the typed ops evaluate at compile time, here with the runtime shapes, for
  // ops whose rules depend on attributes such as a permutation).
  void propagate_pins(graph::node& n) const {
    std::array<std::optional<placement>, graph::max_operands> pins{};
    bool any = false;
    const std::size_t arity = std::min(n.inputs.size(), graph::max_operands);
    std::array<graph::dims_view, graph::max_operands> dims{};
    for (std::size_t i = 0; i < arity; ++i) {
      pins[i] = g_[n.inputs[i]].pin;
      any = any || pins[i].has_value();
      dims[i] = graph::dims_view::of(g_[n.inputs[i]].out.dims);
    }
    if (!any)
      return;
    const auto sig =
        graph::signature_of(n.kind, std::span<const graph::dims_view>(dims.data(), arity),
                            graph::dims_view::of(n.out.dims), n.attrs.dims, n.attrs.flag);
    const auto o = graph::propagate_pins(
        sig, n.kind, std::span<const std::optional<placement>>(pins.data(), arity));
    if (o.what == graph::pin_outcome::kind::pinned) {
      n.pin = o.out;
    } else if (o.what == graph::pin_outcome::kind::no_rule) {
      std::string got;
      for (std::size_t i = 0; i < arity; ++i)
        got += (i == 0 ? "" : ", ") + (pins[i] ? pins[i]->to_string() : std::string("unpinned"));
      throw plan_error("node \"" + n.name + "\" (" + std::string(graph::name(n.kind)) + ")",
                       "no placement rule runs it locally on operands pinned (" + got + ")",
                       o.has_fix ? "insert redistribute<" + o.fix.to_string() + "> on operand " +
                                       std::to_string(o.fix_operand)
                                 : std::string("redistribute its operands"));
    }
  }

  dtype type_;
  std::size_t batch_;
  graph::graph g_;
  std::vector<std::string> scopes_;
};

} // namespace hspmd::nn

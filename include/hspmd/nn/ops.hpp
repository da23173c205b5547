#pragma once
// Typed ops on traced values. Each adds one node to the tracer's graph; static extents are
// checked at compile time with the rules of core/shape_rules.hpp (the message names the rule and
// the sizes), runtime sizes when the node is added (`shape_error` naming the node).

#include <hspmd/core/collectives.hpp>
#include <hspmd/core/extents.hpp>
#include <hspmd/core/placement.hpp>
#include <hspmd/core/shape_rules.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/graph/rules.hpp>
#include <hspmd/nn/tracer.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>

// Typed ops live in nn::functional (like PyTorch's torch.nn.functional); the ones whose names do
// not collide with layers (nn::linear, nn::layer_norm, nn::embedding) are also in nn itself.
namespace hspmd::nn::functional {

namespace detail {
// E with its last extent replaced by N.
template <extents_type E, std::size_t N, class Seq = std::make_index_sequence<E::rank()>>
struct replace_last;
template <std::size_t... Es, std::size_t N, std::size_t... Is>
struct replace_last<extents<Es...>, N, std::index_sequence<Is...>> {
  using type = extents<(Is + 1 == sizeof...(Es) ? N : Es)...>;
};
template <extents_type E, std::size_t N>
using replace_last_t = typename replace_last<E, N>::type;

// E with N appended.
template <extents_type E, std::size_t N>
struct append;
template <std::size_t... Es, std::size_t N>
struct append<extents<Es...>, N> {
  using type = extents<Es..., N>;
};

template <class X, class W>
struct features_must_match {
  static_assert(sizeof(X) == 0,
                "hspmd::nn: the input's last dimension (its features) does not match the layer's "
                "input size (the sizes are in the instantiation above) -- fix the layer's In or "
                "the tensor feeding it");
  static constexpr bool value = false;
};
template <std::size_t N>
struct input_features {};
template <std::size_t N>
struct layer_expects {};

// Checks at compile time that the last static extent of X may equal K.
template <extents_type X, std::size_t K>
inline constexpr bool last_dim_fits = std::conditional_t<
    extents_may_match(X::static_extent(X::rank() - 1), K), std::true_type,
    features_must_match<input_features<X::static_extent(X::rank() - 1)>, layer_expects<K>>>::value;

// ---- compile-time placement algebra (manual SPMD) -------------------------------------------
// The static shape of E for the rule table: runtime extents count as large (splittable).
template <extents_type E>
[[nodiscard]] constexpr graph::dims_view static_dims() {
  graph::dims_view v;
  v.rank = E::rank();
  if constexpr (E::rank() > 0) // nvcc calls `i < 0` on an unsigned pointless (an error here)
    for (std::size_t i = 0; i < E::rank(); ++i)
      v.d[i] = is_static_extent(E::static_extent(i)) ? E::static_extent(i) : std::size_t{1} << 20U;
  return v;
}

template <std::size_t C>
struct pin_from_code {
  using type = split<C - 2>;
};
template <>
struct pin_from_code<0> {
  using type = replicated;
};
template <>
struct pin_from_code<1> {
  using type = partial;
};

// The template arguments of `no_placement_rule` are what the compiler prints: the op, the
// operands' placements and the redistribution to insert.
template <graph::op O>
struct op_ {};
template <class... Ps>
struct operands_pinned_as {};
template <std::size_t I, class P>
struct insert_redistribute_on_operand {};
struct no_single_redistribution_helps {};

template <class Op, class Operands, class Fix>
struct no_placement_rule {
  static_assert(sizeof(Op) == 0,
                "hspmd::nn: no placement rule runs this op locally on its operands' pinned "
                "placements; the instantiation names the op (op_<...>), the placements "
                "(operands_pinned_as<...>) and the fix (insert_redistribute_on_operand<I, P>: "
                "wrap operand I in nn::redistribute<P>(...))");
  using type = unpinned;
};

template <graph::pin_outcome::kind K, std::size_t C, class Error>
struct pick_pin {
  using type = unpinned;
};
template <std::size_t C, class Error>
struct pick_pin<graph::pin_outcome::kind::pinned, C, Error> {
  using type = typename pin_from_code<C>::type;
};
template <std::size_t C, class Error>
struct pick_pin<graph::pin_outcome::kind::no_rule, C, Error> {
  using type = typename Error::type;
};

// The pin of op O's result (extents R) on operand value types Vs, by the rule table.
template <graph::op O, extents_type R, class... Vs>
struct pin_result {
  static constexpr std::array<graph::dims_view, sizeof...(Vs)> ins{
      static_dims<typename Vs::extents_type>()...};
  static constexpr std::array<std::optional<placement>, sizeof...(Vs)> pins{
      pin_of<typename Vs::placement_type>...};
  static constexpr graph::pin_outcome outcome =
      graph::propagate_pins(graph::signature_of(O, ins, static_dims<R>()), O, pins);
  using fix = std::conditional_t<
      outcome.has_fix,
      insert_redistribute_on_operand<outcome.fix_operand,
                                     typename pin_from_code<graph::code_of(outcome.fix)>::type>,
      no_single_redistribution_helps>;
  using type = typename pick_pin<
      outcome.what, graph::code_of(outcome.out),
      no_placement_rule<op_<O>, operands_pinned_as<typename Vs::placement_type...>, fix>>::type;
};
template <graph::op O, extents_type R, class... Vs>
using pin_result_t = typename pin_result<O, R, Vs...>::type;

template <extents_type E>
[[nodiscard]] E extents_of(const hspmd::shape& s) {
  std::array<std::size_t, E::rank()> dims{};
  for (std::size_t i = 0; i < E::rank(); ++i)
    dims[i] = s.dims.at(i);
  return E::from_dims(dims, "nn value");
}
} // namespace detail

/// x (..., k) times w (k, n): (..., n). The weight is shared by all leading dimensions.
template <class T, extents_type EX, std::size_t K, std::size_t N, class PX, class PW>
requires(detail::last_dim_fits<EX, K>)
    [[nodiscard]] auto matmul(const value<T, EX, PX>& x, const value<T, extents<K, N>, PW>& w) {
  using R = detail::replace_last_t<EX, N>;
  using P =
      detail::pin_result_t<graph::op::matmul, R, value<T, EX, PX>, value<T, extents<K, N>, PW>>;
  tracer& t = x.owner();
  const auto id = t.op(graph::op::matmul, {x.id(), w.id()});
  return value<T, R, P>(t, id, detail::extents_of<R>(t.graph()[id].out));
}

/// x (..., k) times w (k, n) plus bias (n).
template <class T, extents_type EX, std::size_t K, std::size_t N, std::size_t NB, class PX,
          class PW, class PB>
requires(detail::last_dim_fits<EX, K>)
    [[nodiscard]] auto linear(const value<T, EX, PX>& x, const value<T, extents<K, N>, PW>& w,
                              const value<T, extents<NB>, PB>& b) {
  using R = detail::replace_last_t<EX, N>;
  using P = detail::pin_result_t<graph::op::linear, R, value<T, EX, PX>,
                                 value<T, extents<K, N>, PW>, value<T, extents<NB>, PB>>;
  tracer& t = x.owner();
  const auto id = t.op(graph::op::linear, {x.id(), w.id(), b.id()});
  return value<T, R, P>(t, id, detail::extents_of<R>(t.graph()[id].out));
}

namespace detail {
template <graph::op O, class T, extents_type E, class P>
auto unary(const value<T, E, P>& x, graph::attributes a = {}) {
  tracer& t = x.owner();
  return value<T, E, pin_result_t<O, E, value<T, E, P>>>(t, t.op(O, {x.id()}, std::move(a)),
                                                         x.extents());
}
template <graph::op O, class T, extents_type EA, extents_type EB, class PA, class PB>
auto binary(const value<T, EA, PA>& a, const value<T, EB, PB>& b) {
  using R = elementwise_extents_t<EA, EB>;
  tracer& t = a.owner();
  const auto id = t.op(O, {a.id(), b.id()});
  return value<T, R, pin_result_t<O, R, value<T, EA, PA>, value<T, EB, PB>>>(
      t, id, detail::extents_of<R>(t.graph()[id].out));
}
} // namespace detail

/// Elementwise a + b (equal extents).
template <class T, extents_type EA, extents_type EB, class PA, class PB>
[[nodiscard]] auto add(const value<T, EA, PA>& a, const value<T, EB, PB>& b) {
  return detail::binary<graph::op::add>(a, b);
}
/// Elementwise a - b (equal extents).
template <class T, extents_type EA, extents_type EB, class PA, class PB>
[[nodiscard]] auto sub(const value<T, EA, PA>& a, const value<T, EB, PB>& b) {
  return detail::binary<graph::op::sub>(a, b);
}
/// Elementwise a * b (equal extents).
template <class T, extents_type EA, extents_type EB, class PA, class PB>
[[nodiscard]] auto mul(const value<T, EA, PA>& a, const value<T, EB, PB>& b) {
  return detail::binary<graph::op::mul>(a, b);
}
/// a + b where b covers a's trailing dimensions (a bias, a position table): a's extents.
template <class T, extents_type EA, extents_type EB, class PA, class PB>
requires(EB::rank() <= EA::rank())
    [[nodiscard]] auto add_broadcast(const value<T, EA, PA>& a, const value<T, EB, PB>& b) {
  tracer& t = a.owner();
  using P = detail::pin_result_t<graph::op::add, EA, value<T, EA, PA>, value<T, EB, PB>>;
  return value<T, EA, P>(t, t.op(graph::op::add, {a.id(), b.id()}), a.extents());
}
/// x * c.
template <class T, extents_type E, class P>
[[nodiscard]] auto scale(const value<T, E, P>& x, double c) {
  graph::attributes a;
  a.scalar = c;
  return detail::unary<graph::op::scale>(x, a);
}
// The typed function of every op whose registry line (graph/ops/list.hpp) says `unary`:
// f(x) keeps x's extents; its placement follows from the rule table at compile time.
#define HSPMD_NN_TYPED_unary(o)                                                                    \
  template <class T, extents_type E, class P>                                                      \
  [[nodiscard]] auto o(const value<T, E, P>& x) {                                                  \
    return detail::unary<graph::op::o>(x);                                                         \
  }
#define HSPMD_NN_TYPED_none(o)
#define HSPMD_NN_TYPED(o, form) HSPMD_NN_TYPED_##form(o)
HSPMD_GRAPH_OPS(HSPMD_NN_TYPED)
#undef HSPMD_NN_TYPED
#undef HSPMD_NN_TYPED_none
#undef HSPMD_NN_TYPED_unary

/// Layer normalization over the last dimension with scale gamma and shift beta.
template <class T, extents_type E, std::size_t L1, std::size_t L2, class P, class PG, class PB>
[[nodiscard]] auto layer_norm(const value<T, E, P>& x, const value<T, extents<L1>, PG>& gamma,
                              const value<T, extents<L2>, PB>& beta, double eps = 1e-5) {
  tracer& t = x.owner();
  graph::attributes a;
  a.scalar = eps;
  using R = detail::pin_result_t<graph::op::layer_norm, E, value<T, E, P>,
                                 value<T, extents<L1>, PG>, value<T, extents<L2>, PB>>;
  return value<T, E, R>(t, t.op(graph::op::layer_norm, {x.id(), gamma.id(), beta.id()}, a),
                        x.extents());
}

/// RMS normalization over the last dimension with a per-feature weight.
template <class T, extents_type E, std::size_t L, class P, class PW>
[[nodiscard]] auto rms_norm(const value<T, E, P>& x, const value<T, extents<L>, PW>& weight,
                            double eps = 1e-6) {
  tracer& t = x.owner();
  graph::attributes a;
  a.scalar = eps;
  using R = detail::pin_result_t<graph::op::rms_norm, E, value<T, E, P>, value<T, extents<L>, PW>>;
  return value<T, E, R>(t, t.op(graph::op::rms_norm, {x.id(), weight.id()}, a), x.extents());
}

/// Rotary position embedding of x (..., S, heads, d): pairs rotated by position (base 10000).
template <class T, extents_type E, class P>
requires(E::rank() >= 3) [[nodiscard]] auto rotary(const value<T, E, P>& x, double base = 10000.0) {
  graph::attributes a;
  a.scalar = base;
  return detail::unary<graph::op::rotary>(x, a);
}

/// silu(gate) * up, elementwise (the gate of a SwiGLU MLP); operands of equal extents.
template <class T, extents_type E, class PA, class PB>
[[nodiscard]] auto swiglu(const value<T, E, PA>& gate, const value<T, E, PB>& up) {
  tracer& t = gate.owner();
  using R = detail::pin_result_t<graph::op::swiglu, E, value<T, E, PA>, value<T, E, PB>>;
  return value<T, E, R>(t, t.op(graph::op::swiglu, {gate.id(), up.id()}), gate.extents());
}

/// Softmax over the last dimension of scores (..., S, S) where row i sees keys j <= i.
template <class T, extents_type E, class P>
requires(E::rank() >= 2) [[nodiscard]] auto causal_softmax(const value<T, E, P>& scores) {
  graph::attributes a;
  a.flag = true;
  return detail::unary<graph::op::softmax>(scores, a);
}

/// Rows of `table` (V, H) picked by integer ids (...): (..., H).
template <class T, std::size_t V, std::size_t H, extents_type EI, class PT, class PI>
[[nodiscard]] auto embedding(const value<T, extents<V, H>, PT>& table,
                             const value<std::int64_t, EI, PI>& ids) {
  using R = typename detail::append<EI, H>::type;
  using P = detail::pin_result_t<graph::op::embedding, R, value<T, extents<V, H>, PT>,
                                 value<std::int64_t, EI, PI>>;
  tracer& t = table.owner();
  const auto id = t.op(graph::op::embedding, {table.id(), ids.id()});
  return value<T, R, P>(t, id, detail::extents_of<R>(t.graph()[id].out));
}

/// How a loss reduces over rows: the mean (as PyTorch's default) or the sum.
enum class reduction : std::uint8_t { mean, sum };

/// Mean (or sum) over rows of -log softmax(logits)[target]: logits (N, V), integer targets (N).
/// A mean divides by the whole batch's N in every plan, so distributed losses stay means.
template <class T, extents_type EL, extents_type ET, class PL, class PT>
requires(EL::rank() == 2 && ET::rank() == 1)
    [[nodiscard]] auto cross_entropy(const value<T, EL, PL>& logits,
                                     const value<std::int64_t, ET, PT>& targets,
                                     reduction r = reduction::mean) {
  tracer& t = logits.owner();
  using P = detail::pin_result_t<graph::op::cross_entropy, extents<>, value<T, EL, PL>,
                                 value<std::int64_t, ET, PT>>;
  graph::attributes a;
  if (r == reduction::mean)
    a.scalar = static_cast<double>(logits.extent(0));
  return value<T, extents<>, P>(
      t, t.op(graph::op::cross_entropy, {logits.id(), targets.id()}, std::move(a)), extents<>{});
}

/// Sum of all elements.
template <class T, extents_type E, class P>
[[nodiscard]] auto sum(const value<T, E, P>& x) {
  tracer& t = x.owner();
  using R = detail::pin_result_t<graph::op::sum, extents<>, value<T, E, P>>;
  return value<T, extents<>, R>(t, t.op(graph::op::sum, {x.id()}), extents<>{});
}
/// Mean of all elements.
template <class T, extents_type E, class P>
[[nodiscard]] auto mean(const value<T, E, P>& x) {
  tracer& t = x.owner();
  using R = detail::pin_result_t<graph::op::mean, extents<>, value<T, E, P>>;
  return value<T, extents<>, R>(t, t.op(graph::op::mean, {x.id()}), extents<>{});
}

/// The same elements with extents `to` (the element count must match).
/// (Its rules depend on the sizes: a pinned operand pins the node at run time, not the type.)
template <class T, extents_type E, extents_type To, class P>
[[nodiscard]] value<T, To> reshape(const value<T, E, P>& x, const To& to) {
  tracer& t = x.owner();
  graph::attributes a;
  a.dims = to.shape().dims;
  return {t, t.op(graph::op::reshape, {x.id()}, a), to};
}

/// The collective that moves a tensor from placement From to To (decided at compile time):
/// split -> replicated all-gather, partial -> replicated all-reduce, partial -> split
/// reduce-scatter, split -> split all-to-all, replicated -> split a local slice (none).
template <placement_type From, placement_type To>
[[nodiscard]] constexpr std::optional<collective> redistribution() {
  constexpr placement f = placement_of<From>;
  constexpr placement t = placement_of<To>;
  if constexpr (f == t || (f.is_replicated() && !t.is_partial()))
    return std::nullopt; // nothing to move (a slice is local)
  else if constexpr (t.is_replicated())
    return f.is_split() ? collective::all_gather_v : collective::all_reduce;
  else if constexpr (t.is_split())
    return f.is_partial() ? collective::reduce_scatter_v : collective::all_to_all_v;
  else
    return std::nullopt; // to partial: one rank keeps it, the others zero (local)
}

/// x moved to placement To: the value is pinned to To and the synthesizer inserts the collective
/// (`redistribution<From, To>()` when x is pinned).
template <placement_type To, class T, extents_type E, class P>
[[nodiscard]] value<T, E, To> redistribute(const value<T, E, P>& x) {
  tracer& t = x.owner();
  return {t, t.redistribute(x.id(), placement_of<To>), x.extents()};
}

} // namespace hspmd::nn::functional

namespace hspmd::nn {
using functional::add;
using functional::add_broadcast;
using functional::causal_softmax;
using functional::cross_entropy;
using functional::matmul;
using functional::mean;
using functional::mul;
using functional::redistribute;
using functional::redistribution;
using functional::reduction;
using functional::reshape;
using functional::scale;
using functional::sub;
using functional::sum;
#define HSPMD_NN_USING_unary(o) using functional::o;
#define HSPMD_NN_USING_none(o)
#define HSPMD_NN_USING(o, form) HSPMD_NN_USING_##form(o)
HSPMD_GRAPH_OPS(HSPMD_NN_USING)
#undef HSPMD_NN_USING
#undef HSPMD_NN_USING_none
#undef HSPMD_NN_USING_unary
} // namespace hspmd::nn

namespace hspmd::nn::functional {

namespace detail {
// Extents of an image batch after a spatial op: the batch stays, the rest becomes runtime.
template <extents_type E>
using image_extents_t =
    extents<E::static_extent(0), dynamic_extent, dynamic_extent, dynamic_extent>;
} // namespace detail

namespace detail {
// N runtime extents.
template <std::size_t N, class Seq = std::make_index_sequence<N>>
struct runtime_extents;
template <std::size_t N, std::size_t... Is>
struct runtime_extents<N, std::index_sequence<Is...>> {
  using type = extents<((void)Is, dynamic_extent)...>;
};
template <std::size_t N>
using runtime_extents_t = typename runtime_extents<N>::type;

// A node's value with extents R read from its inferred shape (placement pins propagate at run
// time, in tracer::op, for ops whose rules depend on attributes).
template <class T, extents_type R>
value<T, R> made(tracer& t, graph::node_id id) {
  return value<T, R>(t, id, extents_of<R>(t.graph()[id].out));
}
} // namespace detail

/// a (b..., m, k) times b (b..., k, n) -> (b..., m, n); with `transpose_b`, b is (b..., n, k).
template <class T, extents_type EA, extents_type EB, class PA, class PB>
requires(EA::rank() == EB::rank() && EA::rank() >= 3)
    [[nodiscard]] auto batched_matmul(const value<T, EA, PA>& a, const value<T, EB, PB>& b,
                                      bool transpose_b = false) {
  tracer& t = a.owner();
  graph::attributes attrs;
  attrs.flag = transpose_b;
  return detail::made<T, with_runtime_dim_t<EA, EA::rank() - 1>>(
      t, t.op(graph::op::batched_matmul, {a.id(), b.id()}, attrs));
}

/// Fused scaled-dot-product attention: softmax(scale q k^T) v of q (b..., S, d), k (b..., T, d),
/// v (b..., T, e) -> (b..., S, e), without storing the scores (graph/ops/attention.hpp);
/// `causal`: query i sees keys j <= i (S = T).
template <class T, extents_type EQ, extents_type EK, extents_type EV, class PQ, class PK, class PV>
requires(EQ::rank() == EK::rank() && EQ::rank() == EV::rank() && EQ::rank() >= 3)
    [[nodiscard]] auto attention(const value<T, EQ, PQ>& q, const value<T, EK, PK>& k,
                                 const value<T, EV, PV>& v, double scale, bool causal = false) {
  tracer& t = q.owner();
  graph::attributes attrs;
  attrs.scalar = scale;
  attrs.flag = causal;
  return detail::made<T, with_runtime_dim_t<EQ, EQ::rank() - 1>>(
      t, t.op(graph::op::attention, {q.id(), k.id(), v.id()}, attrs));
}

/// The dimensions of x reordered: result dimension i is x's dimension `order[i]`.
template <class T, extents_type E, class P>
[[nodiscard]] auto permute(const value<T, E, P>& x,
                           const std::array<std::size_t, E::rank()>& order) {
  tracer& t = x.owner();
  graph::attributes a;
  a.dims.assign(order.begin(), order.end());
  return detail::made<T, detail::runtime_extents_t<E::rank()>>(
      t, t.op(graph::op::permute, {x.id()}, a));
}

/// `length` entries of x from `start` along dimension `axis`.
template <class T, extents_type E, class P>
[[nodiscard]] auto slice(const value<T, E, P>& x, std::size_t axis, std::size_t start,
                         std::size_t length) {
  tracer& t = x.owner();
  return detail::made<T, detail::runtime_extents_t<E::rank()>>(
      t, t.op(graph::op::slice, {x.id()}, graph::attributes{0.0, {axis, start, length}, false}));
}

/// Dropout with probability p while training (the identity in evaluation); p = 0 adds no node.
template <class T, extents_type E, class P>
[[nodiscard]] value<T, E, P> dropout(const value<T, E, P>& x, double p) {
  if (p <= 0.0)
    return x;
  graph::attributes a;
  a.scalar = p;
  tracer& t = x.owner();
  return {t, t.op(graph::op::dropout, {x.id()}, a), x.extents()};
}

/// Top-2 MoE dispatch: tokens x (T, H) and gate probabilities (T, E) -> expert buffers
/// (E, capacity, H).
template <class T, extents_type EX, extents_type EP, class PX, class PP>
requires(EX::rank() == 2 && EP::rank() == 2)
    [[nodiscard]] auto moe_dispatch(const value<T, EX, PX>& x, const value<T, EP, PP>& probs,
                                    std::size_t capacity) {
  tracer& t = x.owner();
  return detail::made<T, detail::runtime_extents_t<3>>(
      t, t.op(graph::op::moe_dispatch, {x.id(), probs.id()},
              graph::attributes{0.0, {capacity}, false}));
}

/// Top-2 MoE combine: expert outputs (E, C, H) and gate probabilities (T, E) -> tokens (T, H).
template <class T, extents_type EB, extents_type EP, class PB, class PP>
requires(EB::rank() == 3 && EP::rank() == 2)
    [[nodiscard]] auto moe_combine(const value<T, EB, PB>& buffers, const value<T, EP, PP>& probs) {
  tracer& t = buffers.owner();
  return detail::made<T, detail::runtime_extents_t<2>>(
      t, t.op(graph::op::moe_combine, {buffers.id(), probs.id()}));
}

/// 2-D convolution: x (N, C, H, W), weight (K, C, R, S), bias (K) -> (N, K, Ho, Wo).
template <class T, extents_type E, extents_type EW, extents_type EB, class PX, class PW, class PB>
requires(E::rank() == 4 && EW::rank() == 4 && EB::rank() == 1)
    [[nodiscard]] auto conv2d(const value<T, E, PX>& x, const value<T, EW, PW>& w,
                              const value<T, EB, PB>& b, std::size_t stride = 1,
                              std::size_t padding = 0) {
  using R = detail::image_extents_t<E>;
  tracer& t = x.owner();
  const auto id = t.op(graph::op::conv2d, {x.id(), w.id(), b.id()},
                       graph::attributes{0.0, {stride, padding}, false});
  return value<T, R>(t, id, detail::extents_of<R>(t.graph()[id].out));
}

/// Max pooling with a square kernel.
template <class T, extents_type E, class P>
requires(E::rank() == 4)
    [[nodiscard]] auto max_pool2d(const value<T, E, P>& x, std::size_t kernel, std::size_t stride) {
  using R = detail::image_extents_t<E>;
  tracer& t = x.owner();
  const auto id =
      t.op(graph::op::max_pool2d, {x.id()}, graph::attributes{0.0, {kernel, stride}, false});
  return value<T, R>(t, id, detail::extents_of<R>(t.graph()[id].out));
}

/// Adaptive average pooling to (ho, wo).
template <class T, extents_type E, class P>
requires(E::rank() == 4) [[nodiscard]] auto adaptive_avg_pool2d(const value<T, E, P>& x,
                                                                std::size_t ho, std::size_t wo) {
  using R = detail::image_extents_t<E>;
  tracer& t = x.owner();
  const auto id =
      t.op(graph::op::adaptive_avg_pool2d, {x.id()}, graph::attributes{0.0, {ho, wo}, false});
  return value<T, R>(t, id, detail::extents_of<R>(t.graph()[id].out));
}

/// (N, ...) -> (N, product of the rest).
template <class T, extents_type E, class P>
requires(E::rank() >= 2) [[nodiscard]] auto flatten(const value<T, E, P>& x) {
  using R = extents<E::static_extent(0), dynamic_extent>;
  const std::size_t n = x.extent(0);
  const std::size_t rest = n == 0 ? 0 : x.extents().size() / n;
  return reshape(x, R::from_dims({n, rest}, "flatten"));
}

/// x repeated to the extents `to` (numpy broadcasting); `to`'s batch dimension stays marked.
template <class T, extents_type E, extents_type To, class P>
[[nodiscard]] value<T, To> broadcast_to(const value<T, E, P>& x, const To& to) {
  tracer& t = x.owner();
  graph::attributes a;
  a.dims = to.shape().dims;
  a.flag = To::has_batch && To::batch_dim == 0;
  return {t, t.op(graph::op::broadcast, {x.id()}, a), to};
}

/// Concatenation of two values along dimension Axis (made a runtime size in the result).
template <std::size_t Axis, class T, extents_type EA, extents_type EB, class PA, class PB>
requires(EA::rank() == EB::rank() && Axis < EA::rank())
    [[nodiscard]] auto concat(const value<T, EA, PA>& a, const value<T, EB, PB>& b) {
  using R = with_runtime_dim_t<EA, Axis>;
  tracer& t = a.owner();
  const auto id = t.op(graph::op::concat, {a.id(), b.id()}, graph::attributes{0.0, {Axis}, false});
  return value<T, R>(t, id, detail::extents_of<R>(t.graph()[id].out));
}

} // namespace hspmd::nn::functional

namespace hspmd::nn {
using functional::adaptive_avg_pool2d;
using functional::attention;
using functional::batched_matmul;
using functional::broadcast_to;
using functional::concat;
using functional::dropout;
using functional::flatten;
using functional::max_pool2d;
using functional::moe_combine;
using functional::moe_dispatch;
using functional::permute;
using functional::rotary;
using functional::slice;
using functional::swiglu;
} // namespace hspmd::nn

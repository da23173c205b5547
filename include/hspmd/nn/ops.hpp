#pragma once
// Typed ops on traced values. Each adds one node to the tracer's graph; static extents are
// checked at compile time with the rules of core/shape_rules.hpp (the message names the rule and
// the sizes), runtime sizes when the node is added (`shape_error` naming the node).

#include <hspmd/core/extents.hpp>
#include <hspmd/core/shape_rules.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/nn/tracer.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
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

template <extents_type E>
[[nodiscard]] E extents_of(const hspmd::shape& s) {
  std::array<std::size_t, E::rank()> dims{};
  for (std::size_t i = 0; i < E::rank(); ++i)
    dims[i] = s.dims.at(i);
  return E::from_dims(dims, "nn value");
}
} // namespace detail

/// x (..., k) times w (k, n): (..., n). The weight is shared by all leading dimensions.
template <class T, extents_type EX, std::size_t K, std::size_t N>
requires(detail::last_dim_fits<EX, K>)
    [[nodiscard]] auto matmul(const value<T, EX>& x, const value<T, extents<K, N>>& w) {
  using R = detail::replace_last_t<EX, N>;
  tracer& t = x.owner();
  const auto id = t.op(graph::op::matmul, {x.id(), w.id()});
  return value<T, R>(t, id, detail::extents_of<R>(t.graph()[id].out));
}

/// x (..., k) times w (k, n) plus bias (n).
template <class T, extents_type EX, std::size_t K, std::size_t N, std::size_t NB>
requires(detail::last_dim_fits<EX, K>)
    [[nodiscard]] auto linear(const value<T, EX>& x, const value<T, extents<K, N>>& w,
                              const value<T, extents<NB>>& b) {
  using R = detail::replace_last_t<EX, N>;
  tracer& t = x.owner();
  const auto id = t.op(graph::op::linear, {x.id(), w.id(), b.id()});
  return value<T, R>(t, id, detail::extents_of<R>(t.graph()[id].out));
}

namespace detail {
template <class T, extents_type E>
value<T, E> unary(graph::op o, const value<T, E>& x, graph::attributes a = {}) {
  tracer& t = x.owner();
  return {t, t.op(o, {x.id()}, std::move(a)), x.extents()};
}
template <class T, extents_type EA, extents_type EB>
auto binary(graph::op o, const value<T, EA>& a, const value<T, EB>& b) {
  using R = elementwise_extents_t<EA, EB>;
  tracer& t = a.owner();
  const auto id = t.op(o, {a.id(), b.id()});
  return value<T, R>(t, id, detail::extents_of<R>(t.graph()[id].out));
}
} // namespace detail

/// Elementwise a + b (equal extents).
template <class T, extents_type EA, extents_type EB>
[[nodiscard]] auto add(const value<T, EA>& a, const value<T, EB>& b) {
  return detail::binary(graph::op::add, a, b);
}
/// Elementwise a - b (equal extents).
template <class T, extents_type EA, extents_type EB>
[[nodiscard]] auto sub(const value<T, EA>& a, const value<T, EB>& b) {
  return detail::binary(graph::op::sub, a, b);
}
/// Elementwise a * b (equal extents).
template <class T, extents_type EA, extents_type EB>
[[nodiscard]] auto mul(const value<T, EA>& a, const value<T, EB>& b) {
  return detail::binary(graph::op::mul, a, b);
}
/// a + b where b covers a's trailing dimensions (a bias, a position table): a's extents.
template <class T, extents_type EA, extents_type EB>
requires(EB::rank() <= EA::rank())
    [[nodiscard]] value<T, EA> add_broadcast(const value<T, EA>& a, const value<T, EB>& b) {
  tracer& t = a.owner();
  return {t, t.op(graph::op::add, {a.id(), b.id()}), a.extents()};
}
/// x * c.
template <class T, extents_type E>
[[nodiscard]] value<T, E> scale(const value<T, E>& x, double c) {
  graph::attributes a;
  a.scalar = c;
  return detail::unary(graph::op::scale, x, a);
}
template <class T, extents_type E>
[[nodiscard]] value<T, E> relu(const value<T, E>& x) {
  return detail::unary(graph::op::relu, x);
}
template <class T, extents_type E>
[[nodiscard]] value<T, E> gelu(const value<T, E>& x) {
  return detail::unary(graph::op::gelu, x);
}
template <class T, extents_type E>
[[nodiscard]] value<T, E> tanh(const value<T, E>& x) {
  return detail::unary(graph::op::tanh, x);
}
template <class T, extents_type E>
[[nodiscard]] value<T, E> sigmoid(const value<T, E>& x) {
  return detail::unary(graph::op::sigmoid, x);
}
/// Softmax over the last dimension.
template <class T, extents_type E>
[[nodiscard]] value<T, E> softmax(const value<T, E>& x) {
  return detail::unary(graph::op::softmax, x);
}
/// Log-softmax over the last dimension.
template <class T, extents_type E>
[[nodiscard]] value<T, E> log_softmax(const value<T, E>& x) {
  return detail::unary(graph::op::log_softmax, x);
}

/// Layer normalization over the last dimension with scale gamma and shift beta.
template <class T, extents_type E, std::size_t L1, std::size_t L2>
[[nodiscard]] value<T, E> layer_norm(const value<T, E>& x, const value<T, extents<L1>>& gamma,
                                     const value<T, extents<L2>>& beta, double eps = 1e-5) {
  tracer& t = x.owner();
  graph::attributes a;
  a.scalar = eps;
  return {t, t.op(graph::op::layer_norm, {x.id(), gamma.id(), beta.id()}, a), x.extents()};
}

/// Rows of `table` (V, H) picked by integer ids (...): (..., H).
template <class T, std::size_t V, std::size_t H, extents_type EI>
[[nodiscard]] auto embedding(const value<T, extents<V, H>>& table,
                             const value<std::int64_t, EI>& ids) {
  using R = typename detail::append<EI, H>::type;
  tracer& t = table.owner();
  const auto id = t.op(graph::op::embedding, {table.id(), ids.id()});
  return value<T, R>(t, id, detail::extents_of<R>(t.graph()[id].out));
}

/// Sum over rows of -log softmax(logits)[target]: logits (N, V), integer targets (N).
template <class T, extents_type EL, extents_type ET>
requires(EL::rank() == 2 && ET::rank() == 1)
    [[nodiscard]] value<T, extents<>> cross_entropy(const value<T, EL>& logits,
                                                    const value<std::int64_t, ET>& targets) {
  tracer& t = logits.owner();
  return {t, t.op(graph::op::cross_entropy, {logits.id(), targets.id()}), extents<>{}};
}

/// Sum of all elements.
template <class T, extents_type E>
[[nodiscard]] value<T, extents<>> sum(const value<T, E>& x) {
  tracer& t = x.owner();
  return {t, t.op(graph::op::sum, {x.id()}), extents<>{}};
}
/// Mean of all elements.
template <class T, extents_type E>
[[nodiscard]] value<T, extents<>> mean(const value<T, E>& x) {
  tracer& t = x.owner();
  return {t, t.op(graph::op::mean, {x.id()}), extents<>{}};
}

/// The same elements with extents `to` (the element count must match).
template <class T, extents_type E, extents_type To>
[[nodiscard]] value<T, To> reshape(const value<T, E>& x, const To& to) {
  tracer& t = x.owner();
  graph::attributes a;
  a.dims = to.shape().dims;
  return {t, t.op(graph::op::reshape, {x.id()}, a), to};
}

} // namespace hspmd::nn::functional

namespace hspmd::nn {
using functional::add;
using functional::add_broadcast;
using functional::cross_entropy;
using functional::gelu;
using functional::log_softmax;
using functional::matmul;
using functional::mean;
using functional::mul;
using functional::relu;
using functional::reshape;
using functional::scale;
using functional::sigmoid;
using functional::softmax;
using functional::sub;
using functional::sum;
using functional::tanh;
} // namespace hspmd::nn

namespace hspmd::nn::functional {

namespace detail {
// Extents of an image batch after a spatial op: the batch stays, the rest becomes runtime.
template <extents_type E>
using image_extents_t =
    extents<E::static_extent(0), dynamic_extent, dynamic_extent, dynamic_extent>;
} // namespace detail

/// 2-D convolution: x (N, C, H, W), weight (K, C, R, S), bias (K) -> (N, K, Ho, Wo).
template <class T, extents_type E, extents_type EW, extents_type EB>
requires(E::rank() == 4 && EW::rank() == 4 && EB::rank() == 1)
    [[nodiscard]] auto conv2d(const value<T, E>& x, const value<T, EW>& w, const value<T, EB>& b,
                              std::size_t stride = 1, std::size_t padding = 0) {
  using R = detail::image_extents_t<E>;
  tracer& t = x.owner();
  const auto id = t.op(graph::op::conv2d, {x.id(), w.id(), b.id()},
                       graph::attributes{0.0, {stride, padding}, false});
  return value<T, R>(t, id, detail::extents_of<R>(t.graph()[id].out));
}

/// Max pooling with a square kernel.
template <class T, extents_type E>
requires(E::rank() == 4)
    [[nodiscard]] auto max_pool2d(const value<T, E>& x, std::size_t kernel, std::size_t stride) {
  using R = detail::image_extents_t<E>;
  tracer& t = x.owner();
  const auto id =
      t.op(graph::op::max_pool2d, {x.id()}, graph::attributes{0.0, {kernel, stride}, false});
  return value<T, R>(t, id, detail::extents_of<R>(t.graph()[id].out));
}

/// Adaptive average pooling to (ho, wo).
template <class T, extents_type E>
requires(E::rank() == 4)
    [[nodiscard]] auto adaptive_avg_pool2d(const value<T, E>& x, std::size_t ho, std::size_t wo) {
  using R = detail::image_extents_t<E>;
  tracer& t = x.owner();
  const auto id =
      t.op(graph::op::adaptive_avg_pool2d, {x.id()}, graph::attributes{0.0, {ho, wo}, false});
  return value<T, R>(t, id, detail::extents_of<R>(t.graph()[id].out));
}

/// (N, ...) -> (N, product of the rest).
template <class T, extents_type E>
requires(E::rank() >= 2) [[nodiscard]] auto flatten(const value<T, E>& x) {
  using R = extents<E::static_extent(0), dynamic_extent>;
  const std::size_t n = x.extent(0);
  const std::size_t rest = n == 0 ? 0 : x.extents().size() / n;
  return reshape(x, R::from_dims({n, rest}, "flatten"));
}

/// x repeated to the extents `to` (numpy broadcasting); `to`'s batch dimension stays marked.
template <class T, extents_type E, extents_type To>
[[nodiscard]] value<T, To> broadcast_to(const value<T, E>& x, const To& to) {
  tracer& t = x.owner();
  graph::attributes a;
  a.dims = to.shape().dims;
  a.flag = To::has_batch && To::batch_dim == 0;
  return {t, t.op(graph::op::broadcast, {x.id()}, a), to};
}

/// Concatenation of two values along dimension Axis (made a runtime size in the result).
template <std::size_t Axis, class T, extents_type EA, extents_type EB>
requires(EA::rank() == EB::rank() && Axis < EA::rank())
    [[nodiscard]] auto concat(const value<T, EA>& a, const value<T, EB>& b) {
  using R = with_runtime_dim_t<EA, Axis>;
  tracer& t = a.owner();
  const auto id = t.op(graph::op::concat, {a.id(), b.id()}, graph::attributes{0.0, {Axis}, false});
  return value<T, R>(t, id, detail::extents_of<R>(t.graph()[id].out));
}

} // namespace hspmd::nn::functional

namespace hspmd::nn {
using functional::adaptive_avg_pool2d;
using functional::broadcast_to;
using functional::concat;
using functional::flatten;
using functional::max_pool2d;
} // namespace hspmd::nn

#pragma once
// User-facing layers. A layer is a small value type holding its name and configuration; its
// parameters live in the tracer's graph under the layer's scope and are created the first time
// the layer is called (calling it again reuses them). Static sizes are checked at compile time,
// runtime sizes (`dynamic_extent`, set in the constructor) when the graph node is added.
//
//     nn::linear<float, 784, 256> fc1{"fc1"};        // parameters fc1.weight (784, 256), fc1.bias
//     auto h = fc1(t, x);                             // x: (batch, 784) -> (batch, 256)
//     nn::linear<float, 128, 10> bad{"bad"};
//     bad(t, h);  // does not compile: the input has 256 features, the layer expects 128

#include <hspmd/core/extents.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/nn/ops.hpp>
#include <hspmd/nn/tracer.hpp>

#include <cmath>
#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace hspmd::nn {

/// Initializers for layers' parameters.
[[nodiscard]] inline graph::initializer normal_init(double stddev) {
  return {graph::initializer::kind::normal, stddev};
}
[[nodiscard]] inline graph::initializer constant_init(double v) {
  return {graph::initializer::kind::constant, v};
}

/// y = x W + b over the last dimension. Weight N(0, 1/In), bias 0.
template <class T, std::size_t In, std::size_t Out>
struct linear {
  static constexpr std::size_t in_features = In;
  static constexpr std::size_t out_features = Out;

  std::string name;
  bool bias = true;
  std::size_t in = In;   ///< runtime size when In is dynamic_extent
  std::size_t out = Out; ///< runtime size when Out is dynamic_extent

  explicit linear(std::string n,
                  bool with_bias = true) requires(is_static_extent(In) && is_static_extent(Out))
      : name(std::move(n)), bias(with_bias) {}
  linear(std::string n, std::size_t in_size, std::size_t out_size, bool with_bias = true)
      : name(std::move(n)), bias(with_bias), in(in_size), out(out_size) {}

  template <extents_type E, class P>
  auto operator()(tracer& t, const value<T, E, P>& x) const {
    const auto scope = t.scope(name);
    const auto w = t.parameter<T>("weight", weight_extents(),
                                  normal_init(1.0 / std::sqrt(static_cast<double>(in))));
    if (!bias)
      return functional::matmul(x, w);
    const auto b = t.parameter<T>("bias", bias_extents(), constant_init(0.0));
    return functional::linear(x, w, b);
  }

private:
  [[nodiscard]] extents<In, Out> weight_extents() const {
    return extents<In, Out>::from_dims({in, out}, "nn::linear weight");
  }
  [[nodiscard]] extents<Out> bias_extents() const {
    return extents<Out>::from_dims({out}, "nn::linear bias");
  }
};

/// Layer normalization over the last dimension (gamma 1, beta 0).
template <class T, std::size_t L>
struct layer_norm {
  std::string name;
  double eps = 1e-5;
  std::size_t size = L;

  template <extents_type E, class P>
  auto operator()(tracer& t, const value<T, E, P>& x) const {
    const auto scope = t.scope(name);
    const auto e = extents<L>::from_dims({size}, "nn::layer_norm");
    const auto gamma = t.parameter<T>("gamma", e, constant_init(1.0));
    const auto beta = t.parameter<T>("beta", e, constant_init(0.0));
    return functional::layer_norm(x, gamma, beta, eps);
  }
};

/// RMS normalization over the last dimension (weight 1), as in Llama.
template <class T, std::size_t L>
struct rms_norm {
  std::string name;
  double eps = 1e-6;
  std::size_t size = L;

  template <extents_type E, class P>
  auto operator()(tracer& t, const value<T, E, P>& x) const {
    const auto scope = t.scope(name);
    const auto weight =
        t.parameter<T>("weight", extents<L>::from_dims({size}, "nn::rms_norm"), constant_init(1.0));
    return functional::rms_norm(x, weight, eps);
  }
};

/// A learned table (V, H) indexed by integer ids; N(0, 0.02^2) as in BERT.
template <class T, std::size_t V, std::size_t H>
struct embedding {
  std::string name;
  std::size_t vocabulary = V;
  std::size_t hidden = H;

  template <extents_type EI, class P>
  auto operator()(tracer& t, const value<std::int64_t, EI, P>& ids) const {
    const auto scope = t.scope(name);
    const auto table =
        t.parameter<T>("table", extents<V, H>::from_dims({vocabulary, hidden}, "nn::embedding"),
                       normal_init(0.02));
    return functional::embedding(table, ids);
  }
};

/// Activations as layers (shape-preserving: they pass features through).
struct relu_layer {
  static constexpr bool preserves_features = true;
  template <class V>
  auto operator()(tracer&, const V& x) const {
    return functional::relu(x);
  }
};
struct gelu_layer {
  static constexpr bool preserves_features = true;
  template <class V>
  auto operator()(tracer&, const V& x) const {
    return functional::gelu(x);
  }
};
struct tanh_layer {
  static constexpr bool preserves_features = true;
  template <class V>
  auto operator()(tracer&, const V& x) const {
    return functional::tanh(x);
  }
};

namespace detail {
template <class M>
concept has_features = requires {
  M::in_features;
  M::out_features;
};
template <class M>
concept preserves = requires {
  M::preserves_features;
};

template <std::size_t I>
struct layer_index {};
template <std::size_t N>
struct layer_outputs {};
template <std::size_t N>
struct next_layer_expects {};

template <class Index, class Outputs, class Expects>
struct sequential_layers_do_not_fit {
  static_assert(sizeof(Index) == 0,
                "hspmd::nn::sequential: a layer's output features differ from the next layer's "
                "input features (the layer index and sizes are in the instantiation above) -- "
                "make each layer's In equal the Out before it");
  static constexpr bool value = false;
};

// Walks the layers carrying the last known static feature count; fails on the first mismatch.
template <std::size_t I, std::size_t Features, class... M>
struct check_chain : std::true_type {};
template <std::size_t I, std::size_t Features, class First, class... Rest>
struct check_chain<I, Features, First, Rest...> {
  static constexpr std::size_t in = [] {
    if constexpr (has_features<First>)
      return First::in_features;
    else
      return dynamic_extent;
  }();
  static constexpr bool fits = extents_may_match(Features, in);
  static constexpr bool here =
      std::conditional_t<fits, std::true_type,
                         sequential_layers_do_not_fit<layer_index<I>, layer_outputs<Features>,
                                                      next_layer_expects<in>>>::value;
  static constexpr std::size_t next = [] {
    if constexpr (has_features<First>)
      return First::out_features;
    else if constexpr (preserves<First>)
      return Features;
    else
      return dynamic_extent;
  }();
  static constexpr bool value = here && check_chain<I + 1, next, Rest...>::value;
};
} // namespace detail

/// Layers applied in order; consecutive feature sizes are checked at compile time.
template <class... Layers>
struct sequential {
  static_assert(detail::check_chain<0, dynamic_extent, Layers...>::value,
                "hspmd::nn::sequential: see the sequential_layers_do_not_fit error above");
  std::tuple<Layers...> layers;

  explicit sequential(Layers... l) : layers(std::move(l)...) {}

  template <class V>
  auto operator()(tracer& t, const V& x) const {
    return apply(t, x, std::index_sequence_for<Layers...>{});
  }

private:
  template <class V, std::size_t I, std::size_t... Is>
  auto apply(tracer& t, const V& x, std::index_sequence<I, Is...>) const {
    const auto y = std::get<I>(layers)(t, x);
    if constexpr (sizeof...(Is) == 0)
      return y;
    else
      return apply(t, y, std::index_sequence<Is...>{});
  }
};

} // namespace hspmd::nn

namespace hspmd::nn {

/// 2-D convolution with a square kernel: C input channels, K output channels. He-initialized
/// weight N(0, 2 / (C R R)), bias 0.
template <class T, std::size_t C, std::size_t K>
struct conv2d {
  std::string name;
  std::size_t kernel = 3;
  std::size_t stride = 1;
  std::size_t padding = 1;
  std::size_t in_channels = C;
  std::size_t out_channels = K;

  template <extents_type E, class P>
  requires(E::rank() == 4) auto operator()(tracer& t, const value<T, E, P>& x) const {
    const auto scope = t.scope(name);
    const auto fan_in = static_cast<double>(in_channels * kernel * kernel);
    const auto w = t.parameter<T>("weight",
                                  extents<K, C, dynamic_extent, dynamic_extent>::from_dims(
                                      {out_channels, in_channels, kernel, kernel}, "nn::conv2d"),
                                  normal_init(std::sqrt(2.0 / fan_in)));
    const auto b = t.parameter<T>("bias", extents<K>::from_dims({out_channels}, "nn::conv2d"),
                                  constant_init(0.0));
    return functional::conv2d(x, w, b, stride, padding);
  }
};

} // namespace hspmd::nn

#pragma once
// Kernels of the activations and of the other maps of one input (registry: graph/ops/
// activation.hpp, scale in graph/ops/elementwise.hpp). Each op is a `math` with the forward
// y = f(x) and the backward dx = f'(x) dy (given x, y and dy), launched by `map_kernel`.

#include <hspmd/core/fastmath.hpp>
#include <hspmd/core/hd.hpp>
#include <hspmd/kernels/common.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <type_traits>

namespace hspmd::exec {

/// y[i] = m.forward(x[i]).
template <class Math, class T>
struct map_forward {
  Math m;
  const T* x;
  T* y;
  HSPMD_HD HSPMD_INLINE void operator()(std::size_t i) const { y[i] = m.forward(x[i]); }
};
/// dx[i] += m.backward(x[i], y[i], dy[i]) (stored with `assign`).
template <class Math, class T>
struct map_backward {
  Math m;
  const T* x;
  const T* y;
  const T* dy;
  T* dx;
  bool assign = false;
  HSPMD_HD HSPMD_INLINE void operator()(std::size_t i) const {
    contribute(dx[i], m.backward(x[i], y[i], dy[i]), assign);
  }
};

/// The kernel pair of an elementwise map whose math is `Math<T>` (built from the node by
/// `Math<T>::of(context)`).
template <template <class> class Math>
struct map_kernel {
  static constexpr std::uint32_t assigns = 0b1;
  template <class T, class B>
  static void forward(kernel_context<T, B>& c) {
    for_each_index(c.backend(), c.out_size(),
                   map_forward<Math<T>, T>{Math<T>::of(c), c.in(0), c.out()});
  }
  template <class T, class B>
  static void backward(kernel_context<T, B>& c) {
    for_each_index(c.backend(), c.out_size(),
                   map_backward<Math<T>, T>{Math<T>::of(c), c.in(0), c.out(), c.dout(), c.din(0),
                                            c.assign(0)});
  }
};

/// Math without parameters.
template <class Self>
struct stateless_math {
  template <class C>
  static Self of(const C& /*context*/) {
    return {};
  }
};

template <class T>
struct relu_math : stateless_math<relu_math<T>> {
  HSPMD_HD HSPMD_INLINE T forward(T x) const { return math::select(x > T{0}, x, T{0}); }
  HSPMD_HD HSPMD_INLINE T backward(T x, T /*y*/, T dy) const {
    return math::select(x > T{0}, dy, T{0});
  }
};

/// The standard normal CDF, as erfc(-x / sqrt 2) / 2 so that its lower tail keeps its digits
/// (1 + erf rounds it to 0 below x = -5.4, and GELU's output and derivative with it).
template <class T>
HSPMD_HD HSPMD_INLINE T normal_cdf(T x) {
  return static_cast<T>(0.5) * math::erfc(x * -(std::numbers::sqrt2_v<T> / 2));
}

/// GELU, x Phi(x). In float the forward takes Phi from one `math::normal_tail` at |x| clamped to
/// 13 (one exponential, one division, no branch between a near-0 series and a tail), within 7
/// ulp of x Phi(x); x below -13 gives ~-1e-37 (0 to float precision), +-inf give inf and ~0 (their
/// derivatives 1 and ~0), NaN propagates. In double: the library's erfc.
template <class T>
struct gelu_math : stateless_math<gelu_math<T>> {
  HSPMD_HD HSPMD_INLINE T forward(T x) const {
    if constexpr (std::is_same_v<T, float>) {
      const auto bits = std::bit_cast<std::uint32_t>(x);
      const float a = clamp_magnitude(bits & 0x7fffffffU);
      const float half = 0.5f * math::normal_tail(a).erfc; // Q(|x|): Phi(x) below 0, 1 - Phi above
      // below -13, Phi < 6e-39 and GELU is 0 to float precision: the clamped x keeps -inf * 0 out
      const float y = math::select(negative(bits), with_sign(a, bits) * half, x * (1.0f - half));
      return math::select(math::detail::is_nan(x), x, y);
    } else {
      return x * normal_cdf(x);
    }
  }
  // d/dx x Phi(x) = Phi(x) + x phi(x). Phi is read back from the forward's output as y / x
  // (within 2 ulp of Phi: y is x Phi rounded once; 1/2 where |x| < 1e-30, 0 / 0 included; its
  // limit beyond 13, inf / inf included), so only the density's exponential is computed: in the
  // graph, reading y costs less than a second tail (5.7 vs 8.0 ms a BERT-small step).
  HSPMD_HD HSPMD_INLINE T backward(T x, T y, T dy) const {
    if constexpr (std::is_same_v<T, float>) {
      const auto bits = std::bit_cast<std::uint32_t>(x);
      const std::uint32_t m = bits & 0x7fffffffU;
      const float a = clamp_magnitude(m);
      const float hi = a * a; // e^{-(hi + lo)/2} = g (1 - lo/2), a^2 = hi + lo exactly
      const float lo = math::detail::product_error(a, a, hi);
      float g = math::detail::exp_nonpositive(-0.5f * hi);
      g = g - g * (0.5f * lo);
      const float beyond = math::select(negative(bits), 0.0f, 1.0f);
      const float cdf =
          math::select(m < 0x0d800000U, 0.5f, math::select(m < limit_bits(), y / x, beyond));
      const float d = cdf + with_sign(a, bits) * (inv_sqrt_2pi() * g);
      return math::select(math::detail::is_nan(x), x, dy * d);
    } else {
      const T cdf = math::select(std::abs(x) < static_cast<T>(1e-30), static_cast<T>(0.5), y / x);
      const T density = inv_sqrt_2pi() * math::exp(static_cast<T>(-0.5) * x * x);
      return dy * (cdf + x * density);
    }
  }

private:
  // 13.0f's bits (magnitudes order as integers) and 1 / sqrt(2 pi): functions, not static
  // members, which device code cannot read
  HSPMD_HD static constexpr std::uint32_t limit_bits() { return 0x41500000U; }
  HSPMD_HD static constexpr T inv_sqrt_2pi() { return static_cast<T>(0.3989422804014327); }
  // |x| (its bits m) clamped to 13 (NaN to 13: callers select it back).
  HSPMD_HD HSPMD_INLINE static float clamp_magnitude(std::uint32_t m) {
    return std::bit_cast<float>(m < limit_bits() ? m : limit_bits());
  }
  HSPMD_HD HSPMD_INLINE static bool negative(std::uint32_t bits) { return (bits >> 31U) != 0U; }
  // a >= 0 with the sign bit of `bits`.
  HSPMD_HD HSPMD_INLINE static float with_sign(float a, std::uint32_t bits) {
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(a) | (bits & 0x80000000U));
  }
};

template <class T>
struct tanh_math : stateless_math<tanh_math<T>> {
  HSPMD_HD HSPMD_INLINE T forward(T x) const { return math::tanh(x); }
  HSPMD_HD HSPMD_INLINE T backward(T /*x*/, T y, T dy) const { return dy * (T{1} - y * y); }
};

template <class T>
struct sigmoid_math : stateless_math<sigmoid_math<T>> {
  HSPMD_HD HSPMD_INLINE T forward(T x) const { return math::sigmoid(x); }
  HSPMD_HD HSPMD_INLINE T backward(T /*x*/, T y, T dy) const { return dy * y * (T{1} - y); }
};

/// x * sigmoid(x); the backward recomputes the sigmoid (y / x loses it near 0):
/// d/dx x s(x) = s (1 + x (1 - s)).
template <class T>
struct silu_math : stateless_math<silu_math<T>> {
  HSPMD_HD HSPMD_INLINE T forward(T x) const { return x * math::sigmoid(x); }
  HSPMD_HD HSPMD_INLINE T backward(T x, T /*y*/, T dy) const {
    const T s = math::sigmoid(x);
    return dy * s * (T{1} + x * (T{1} - s));
  }
};

/// x * attrs.scalar.
template <class T>
struct scale_math {
  T factor;
  template <class C>
  static scale_math of(const C& c) {
    return {static_cast<T>(c.attrs().scalar)};
  }
  HSPMD_HD HSPMD_INLINE T forward(T x) const { return factor * x; }
  HSPMD_HD HSPMD_INLINE T backward(T /*x*/, T /*y*/, T dy) const { return factor * dy; }
};

template <>
struct kernel<graph::op::relu> : map_kernel<relu_math> {};
template <>
struct kernel<graph::op::gelu> : map_kernel<gelu_math> {};
template <>
struct kernel<graph::op::tanh> : map_kernel<tanh_math> {};
template <>
struct kernel<graph::op::sigmoid> : map_kernel<sigmoid_math> {};
template <>
struct kernel<graph::op::scale> : map_kernel<scale_math> {};
template <>
struct kernel<graph::op::silu> : map_kernel<silu_math> {};

/// out[i] = silu(a[i]) * b[i].
template <class T>
struct swiglu_forward {
  const T* a;
  const T* b;
  T* out;
  HSPMD_HD HSPMD_INLINE void operator()(std::size_t i) const {
    out[i] = silu_math<T>{}.forward(a[i]) * b[i];
  }
};
/// da[i] += dy b silu'(a); db[i] += dy silu(a).
template <class T>
struct swiglu_backward {
  const T* a;
  const T* b;
  const T* dy;
  T* da;
  T* db;
  bool assign_a = false;
  bool assign_b = false;
  HSPMD_HD HSPMD_INLINE void operator()(std::size_t i) const {
    const T s = math::sigmoid(a[i]);
    contribute(da[i], dy[i] * b[i] * (s * (T{1} + a[i] * (T{1} - s))), assign_a);
    contribute(db[i], dy[i] * (a[i] * s), assign_b);
  }
};

template <>
struct kernel<graph::op::swiglu> {
  static constexpr std::uint32_t assigns = 0b11;
  template <class T, class B>
  static void forward(kernel_context<T, B>& c) {
    for_each_index(c.backend(), c.out_size(), swiglu_forward<T>{c.in(0), c.in(1), c.out()});
  }
  template <class T, class B>
  static void backward(kernel_context<T, B>& c) {
    for_each_index(c.backend(), c.out_size(),
                   swiglu_backward<T>{c.in(0), c.in(1), c.dout(), c.din(0), c.din(1), c.assign(0),
                                      c.assign(1)});
  }
};

} // namespace hspmd::exec

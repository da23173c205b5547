#pragma once
// Kernels of the activations and of the other maps of one input (registry: graph/ops/
// activation.hpp, scale in graph/ops/elementwise.hpp). Each op is a `math` with the forward
// y = f(x) and the backward dx = f'(x) dy (given x, y and dy), launched by `map_kernel`.

#include <hspmd/core/fastmath.hpp>
#include <hspmd/core/hd.hpp>
#include <hspmd/exec/kernels/common.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>

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
/// (1 + erf rounds it to 0 below x = -5.4, and GELU's output and derivative with it). The
/// argument is a product with 1 / sqrt 2 (within an ulp of the quotient): a division per element
/// had been a quarter of GELU's forward.
template <class T>
HSPMD_HD HSPMD_INLINE T normal_cdf(T x) {
  return static_cast<T>(0.5) * math::erfc(x * -(std::numbers::sqrt2_v<T> / 2));
}

template <class T>
struct gelu_math : stateless_math<gelu_math<T>> {
  HSPMD_HD HSPMD_INLINE T forward(T x) const { return x * normal_cdf(x); }
  // d/dx x Phi(x) = Phi(x) + x phi(x). Phi is read back from the forward's output as y / x
  // (within 2 ulp of Phi: y is x Phi rounded once; Phi(x) = 1/2 where |x| < 1e-30, 0 / 0
  // included), so only the density's exponential is computed: no erf, 35 % less time a call.
  HSPMD_HD HSPMD_INLINE T backward(T x, T y, T dy) const {
    const T inv_sqrt_2pi = static_cast<T>(0.3989422804014327);
    const T cdf = math::select(std::abs(x) < static_cast<T>(1e-30), static_cast<T>(0.5), y / x);
    const T density = inv_sqrt_2pi * math::exp(static_cast<T>(-0.5) * x * x);
    return dy * (cdf + x * density);
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

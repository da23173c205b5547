#pragma once
// exp, erf, erfc, tanh and sqrt that a compiler vectorizes: no branches (selects only), no library
// calls, no tables, so a kernel's element loop over them runs at SIMD width on the host and is
// the same arithmetic on a device. In float exp, erf, tanh and sqrt are within 2 ulp of the
// correctly rounded result over every float input whose result is a normal float, erfc as
// below (tests/unit/core/fastmath.test.cpp sweeps them densely against std:: in double); in
// double they are the std:: functions themselves.
//
//   exp : x = n ln2 + r (Cody-Waite, |r| <= ln2 / 2); e^r by a degree-7 polynomial; 2^n built in
//         the exponent bits as two halves, so results down to the subnormal range stay finite.
//   erf : |x| < 0.921875: x P(x^2) (degree 6 in x^2); beyond: 1 - e^{-x^2} R(t), t = 1/(1 + |x|/2)
//         (degree 7), R fitted to erfc(x) e^{x^2} (the form keeps erfc's tail relative).
//   erfc: 1 - x P(x^2) near 0; beyond, e^{-x^2} R(t) itself (2 minus it below 0): within 3 ulp
//         below 0.92 (2 with FMA), 11 ulp below 4; beyond, the relative error grows with x^2 (R's
//         fit and the rounded square) to 6e-5 where erfc underflows, near x = 10.
//   normal_tail (GELU's): erfc(a / sqrt 2) and e^{-a^2/2} for 0 <= a <= 13 from one formula,
//         t S(t) e^{-z^2}, t = 1 / (1 + 0.45 z) (no branch): within 8 and 2 ulp.
//   tanh: |x| < 0.625: x P(x^2) (degree 5 in x^2); beyond: 1 - 2 / (e^{2|x|} + 1).
//   sqrt: 1 / sqrt(x) from the exponent halved in the bit pattern, three Newton steps, then one
//         Newton step on sqrt itself (subnormals scaled by 2^24 first); within 1 ulp of every
//         non-negative float. std::sqrt does not vectorize under the default -fmath-errno (it
//         may set errno), which made Adam's update four times slower than its memory traffic
//         (used with AVX2 or wider, see math::sqrt).
// Selects are bit masks over integer comparisons of the inputs' bit patterns (`select`, `key`):
// a float comparison in a ternary becomes a branch under the default -ftrapping-math, and a
// branch stops the vectorizer.
// The polynomials were fitted for this file (weighted minimax in double, coefficients rounded to
// float); NaN propagates, +-inf give the limits.

#include <hspmd/core/hd.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace hspmd::math {

/// c ? a : b without a branch (a bit mask), for loops the compiler should vectorize.
template <class T>
[[nodiscard]] HSPMD_HD HSPMD_INLINE T select(bool c, T a, T b) {
  using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  const U m = U{0} - static_cast<U>(c);
  return std::bit_cast<T>(static_cast<U>((std::bit_cast<U>(a) & m) | (std::bit_cast<U>(b) & ~m)));
}

namespace detail {

// Floats ordered as integers (for non-NaN x: key(x) < key(y) iff x < y), compared without a
// float comparison.
[[nodiscard]] HSPMD_HD constexpr std::int32_t key(float x) {
  const auto b = std::bit_cast<std::int32_t>(x);
  return b ^ ((b >> 31) & 0x7fffffff);
}
// The float whose key is k (the inverse of `key`).
[[nodiscard]] HSPMD_HD constexpr float from_key(std::int32_t k) {
  return std::bit_cast<float>(k ^ ((k >> 31) & 0x7fffffff));
}
[[nodiscard]] HSPMD_HD constexpr std::uint32_t magnitude(float x) {
  return std::bit_cast<std::uint32_t>(x) & 0x7fffffffU;
}
[[nodiscard]] HSPMD_HD constexpr bool is_nan(float x) {
  return magnitude(x) > 0x7f800000U;
}
// |v| with the sign of x.
[[nodiscard]] HSPMD_HD constexpr float with_sign_of(float x, float v) {
  return std::bit_cast<float>(magnitude(v) | (std::bit_cast<std::uint32_t>(x) & 0x80000000U));
}

[[nodiscard]] HSPMD_HD HSPMD_INLINE float pow2i(std::int32_t n) { // 2^n for -126 <= n <= 127
  return std::bit_cast<float>(static_cast<std::int32_t>((n + 127) << 23));
}

// e^{x - n ln 2} for n = round(x / ln 2) (set): Cody-Waite reduction, |r| <= ln 2 / 2, and the
// degree-7 polynomial; callers scale by 2^n.
[[nodiscard]] HSPMD_HD HSPMD_INLINE float exp_reduced(float x, float& n) {
  constexpr float round = 12582912.0f; // 1.5 * 2^23: adding and subtracting it rounds to integer
  n = (x * 1.44269504088896341f + round) - round;
  float r = x - n * 0.693359375f; // ln 2 = 0.693359375 - 2.12194440e-4 (the first part exact)
  r = r + n * 2.12194440e-4f;
  const float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r2 + r + 1.0f;
}

[[nodiscard]] HSPMD_HD HSPMD_INLINE float exp_f32(float x) {
  constexpr std::int32_t hi = key(88.72283935546875f);   // above: +inf
  constexpr std::int32_t lo = key(-103.97208404541016f); // below: 0
  const std::int32_t k = key(x);
  // Clamped so that n stays within the two halves' exponent range; the ends are selected below.
  const float xc = select(k < key(-104.0f), -104.0f, select(k > key(89.0f), 89.0f, x));
  float n = 0;
  const float p = exp_reduced(xc, n);
  const auto ni = static_cast<std::int32_t>(n);
  const std::int32_t h = ni / 2;
  float y = p * pow2i(h) * pow2i(ni - h);
  y = select(k > hi, std::numeric_limits<float>::infinity(), y);
  y = select(k < lo, 0.0f, y);
  return select(is_nan(x), x, y);
}

// erf(x) - x for |x| < 0.921875: x (P(x^2) - 1), so that the caller's last rounding is of a
// small term.
[[nodiscard]] HSPMD_HD HSPMD_INLINE float erf_small_minus_x(float x) {
  const float z = x * x;
  float s = 8.370135037694126e-5f;
  s = s * z - 8.142714505083859e-4f;
  s = s * z + 5.201033316552639e-3f;
  s = s * z - 2.6859398931264877e-2f;
  s = s * z + 1.1283695697784424e-1f;
  s = s * z - 3.7612634897232056e-1f;
  s = s * z + 1.2837916612625122e-1f;
  return x * s;
}

// erfc(|x|) for |x| >= 0.921875 given g = e^{-x^2}: g R(1 / (1 + |x| / 2)).
[[nodiscard]] HSPMD_HD HSPMD_INLINE float erfc_tail(float ax, float g) {
  const float t = 1.0f / (1.0f + 0.5f * ax);
  float q = 1.1943994462490082e-1f;
  q = q * t - 4.715688228607178e-1f;
  q = q * t + 5.638846755027771e-1f;
  q = q * t - 1.0416415333747864e-1f;
  q = q * t + 3.4809091687202454e-1f;
  q = q * t + 2.596001625061035e-1f;
  q = q * t + 2.849268913269043e-1f;
  q = q * t - 1.5516519488301128e-4f;
  return g * q;
}

// erf(x) given g = e^{-x^2} (computed as exp_f32(-|x| |x|)): callers that need the Gaussian too
// (GELU's derivative) compute it once.
[[nodiscard]] HSPMD_HD HSPMD_INLINE float erf_f32(float x, float g) {
  const float ax = std::bit_cast<float>(magnitude(x));
  const float small = x + erf_small_minus_x(x);
  const float large = with_sign_of(x, 1.0f - erfc_tail(ax, g));
  return select(magnitude(x) < magnitude(0.921875f), small, select(is_nan(x), x, large));
}

// erfc(x) = 1 - erf(x): the tail erfc(x) for x >= 0.921875 is computed as such (relative, not
// 1 minus a rounded erf), so it keeps its digits down to where it underflows.
[[nodiscard]] HSPMD_HD HSPMD_INLINE float erfc_f32(float x) {
  const float ax = std::bit_cast<float>(magnitude(x));
  const float small = (1.0f - x) - erf_small_minus_x(x);
  // (as a magnitude: R is fitted for x < 10, where erfc underflows; at +inf it would give -0)
  const float tail = std::bit_cast<float>(magnitude(erfc_tail(ax, exp_f32(-ax * ax))));
  const float large = select(key(x) < 0, 2.0f - tail, tail);
  return select(magnitude(x) < magnitude(0.921875f), small, select(is_nan(x), x, large));
}

[[nodiscard]] HSPMD_HD HSPMD_INLINE float erf_f32(float x) {
  const float ax = std::bit_cast<float>(magnitude(x));
  return erf_f32(x, exp_f32(-ax * ax));
}

// a * b - round(a * b), exactly (given p = round(a * b)): an FMA where the target has one, else
// Dekker's product of halves (Veltkamp split; the halves' products are exact).
[[nodiscard]] HSPMD_HD HSPMD_INLINE float product_error(float a, float b, float p) {
#if defined(__FMA__) || defined(__CUDA_ARCH__)
  return std::fma(a, b, -p);
#else
  const auto split = [](float v, float& hi, float& lo) {
    const float c = 4097.0f * v; // 2^12 + 1
    hi = c - (c - v);
    lo = v - hi;
  };
  float ah = 0, al = 0, bh = 0, bl = 0;
  split(a, ah, al);
  split(b, bh, bl);
  return ((ah * bh - p) + ah * bl + al * bh) + al * bl;
#endif
}

// e^u for -87 <= u <= 0, no range checks (callers bound u): exp_f32's reduction and polynomial,
// 2^n in one step (the result stays a normal float).
[[nodiscard]] HSPMD_HD HSPMD_INLINE float exp_nonpositive(float u) {
  float n = 0;
  const float p = exp_reduced(u, n);
  return p * pow2i(static_cast<std::int32_t>(n));
}

} // namespace detail

/// The standard normal's upper tail and density at a >= 0, the pair GELU needs.
struct normal_tail_pair {
  float erfc;  ///< erfc(a / sqrt 2) = 2 Q(a), relative to its last digits
  float gauss; ///< e^{-a^2 / 2}
};
/// For 0 <= a <= 13 (callers clamp |x|; beyond, Q(a) < 6e-39 is 0 to any float sum): one branch-
/// free formula over the whole range, erfc(z) = t S(t) e^{-z^2} with z = a / sqrt 2,
/// t = 1 / (1 + 0.45 z) and S of degree 9 fitted (relative, weighted minimax) to erfc(z) e^{z^2} /
/// t over all z >= 0 (3.2e-8). a^2 is split exactly into a rounded square and its error, so the
/// exponential keeps its digits where a^2 is large. One exponential and one division for both
/// values: the cheaper, not the general `erfc`'s two branches (a near-0 series and a tail, both
/// computed per lane). GELU's output within 7 ulp, its derivative as tests/unit/exec/kernels.
[[nodiscard]] HSPMD_HD HSPMD_INLINE normal_tail_pair normal_tail(float a) {
  const float z = a * 0.70710678118654752f;
  const float t = 1.0f / (1.0f + 0.45f * z);
  float s = -4.141016304e-02f;
  s = s * t + 1.907707602e-01f;
  s = s * t - 3.007331192e-01f;
  s = s * t + 1.425494552e-01f;
  s = s * t - 2.244409360e-02f;
  s = s * t + 1.199803129e-01f;
  s = s * t + 1.752461195e-01f;
  s = s * t + 2.282722890e-01f;
  s = s * t + 2.538831234e-01f;
  s = s * t + 2.538853288e-01f;
  const float hi = a * a;
  const float lo = detail::product_error(a, a, hi);
  float g = detail::exp_nonpositive(-0.5f * hi); // e^{-(hi + lo)/2} = g (1 - lo/2)
  g = g - g * (0.5f * lo);
  return {(t * s) * g, g};
}

namespace detail {

[[nodiscard]] HSPMD_HD HSPMD_INLINE float sqrt_f32(float x) {
  const std::int32_t k = key(x);
  const bool tiny = k < 0x00800000; // subnormal, zero or negative
  const float xs = select(tiny, x * 16777216.0f, x);
  // (unsigned: a negative x wraps here harmlessly; its NaN is selected below)
  float r = std::bit_cast<float>(0x5f375a86U - (std::bit_cast<std::uint32_t>(xs) >> 1));
  const float h = 0.5f * xs;
  r = r * (1.5f - h * r * r);
  r = r * (1.5f - h * r * r);
  r = r * (1.5f - h * r * r);
  float y = xs * r;
  y = y + (xs - y * y) * (0.5f * r);
  y = y * select(tiny, 1.0f / 4096.0f, 1.0f);
  y = select(magnitude(x) == 0U || k == 0x7f800000, x, y); // +-0 and +inf are their own roots
  return select(k < 0 && magnitude(x) != 0U, std::numeric_limits<float>::quiet_NaN(),
                select(is_nan(x), x, y));
}

[[nodiscard]] HSPMD_HD HSPMD_INLINE float tanh_f32(float x) {
  const float ax = std::bit_cast<float>(magnitude(x));
  const float z = x * x;
  float s = -5.660028662532568e-3f;
  s = s * z + 2.059103175997734e-2f;
  s = s * z - 5.372108519077301e-2f;
  s = s * z + 1.3331127166748047e-1f;
  s = s * z - 3.333325982093811e-1f;
  const float small = x + x * z * s;
  const float large = with_sign_of(x, 1.0f - 2.0f / (exp_f32(2.0f * ax) + 1.0f));
  return select(magnitude(x) < magnitude(0.625f), small, select(is_nan(x), x, large));
}

} // namespace detail

/// e^x (float: vectorizable, <= 2 ulp; double: std::exp).
template <class T>
[[nodiscard]] HSPMD_HD HSPMD_INLINE T exp(T x) {
  if constexpr (std::is_same_v<T, float>)
    return detail::exp_f32(x);
  else
    return std::exp(x);
}

/// erf(x) (float: vectorizable, <= 2 ulp; double: std::erf).
template <class T>
[[nodiscard]] HSPMD_HD HSPMD_INLINE T erf(T x) {
  if constexpr (std::is_same_v<T, float>)
    return detail::erf_f32(x);
  else
    return std::erf(x);
}

/// erfc(x) = 1 - erf(x) (float: vectorizable; its tail computed as such, not as 1 minus erf, so
/// it keeps its digits to the underflow: see the table at the top; double: std::erfc).
template <class T>
[[nodiscard]] HSPMD_HD HSPMD_INLINE T erfc(T x) {
  if constexpr (std::is_same_v<T, float>)
    return detail::erfc_f32(x);
  else
    return std::erfc(x);
}

/// sqrt(x): in float on a host compiled for AVX2 or wider, the vectorizable Newton form (<= 1
/// ulp, NaN below 0); elsewhere std::sqrt (on SSE2 alone the scalar square root is faster than
/// four lanes of Newton steps, and a device's sqrtf is exact).
template <class T>
[[nodiscard]] HSPMD_HD HSPMD_INLINE T sqrt(T x) {
#if defined(__AVX2__) && !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>)
    return detail::sqrt_f32(x);
  else
    return std::sqrt(x);
#else
  return std::sqrt(x);
#endif
}

/// erf(x) and e^{-x^2} from one exponential: returns erf(x), sets `gauss` to e^{-x^2}.
template <class T>
[[nodiscard]] HSPMD_HD HSPMD_INLINE T erf(T x, T& gauss) {
  if constexpr (std::is_same_v<T, float>) {
    const float ax = std::bit_cast<float>(detail::magnitude(x));
    gauss = detail::exp_f32(-ax * ax);
    return detail::erf_f32(x, gauss);
  } else {
    gauss = std::exp(-x * x);
    return std::erf(x);
  }
}

/// tanh(x) (float: vectorizable, <= 2 ulp; double: std::tanh).
template <class T>
[[nodiscard]] HSPMD_HD HSPMD_INLINE T tanh(T x) {
  if constexpr (std::is_same_v<T, float>)
    return detail::tanh_f32(x);
  else
    return std::tanh(x);
}

/// 1 / (1 + e^-x), from `math::exp`.
template <class T>
[[nodiscard]] HSPMD_HD HSPMD_INLINE T sigmoid(T x) {
  return T{1} / (T{1} + math::exp(-x));
}

} // namespace hspmd::math

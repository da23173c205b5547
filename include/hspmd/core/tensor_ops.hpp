#pragma once
// Reference host ops on typed tensors: plain loops, exact in their order of summation, used by
// examples and as the oracle in tests. Fast kernels (BLAS, CUDA) live in exec/.
//
// Shape rules are checked at compile time where the extents are static (see shape_rules.hpp)
// and at run time otherwise (`shape_error`).

#include <hspmd/core/error.hpp>
#include <hspmd/core/extents.hpp>
#include <hspmd/core/rng.hpp>
#include <hspmd/core/shape_rules.hpp>
#include <hspmd/core/tensor.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace hspmd {

/// C = A x B for A (M, K) and B (K, N); C is (M, N). Throws `shape_error` when runtime inner
/// sizes differ; static ones that differ do not compile.
template <element_type T, extents_type EA, extents_type EB>
[[nodiscard]] tensor<T, matmul_extents_t<EA, EB>> matmul(const tensor<T, EA>& a,
                                                         const tensor<T, EB>& b) {
  using EC = matmul_extents_t<EA, EB>;
  const std::size_t m = a.extent(0);
  const std::size_t k = a.extent(1);
  const std::size_t n = b.extent(1);
  if (b.extent(0) != k)
    throw shape_error("matmul",
                      "inner extents differ: A is " + a.shape().to_string() + " and B is " +
                          b.shape().to_string(),
                      "A's columns must equal B's rows");
  tensor<T, EC> c(EC::from_dims({m, n}, "matmul"));
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t p = 0; p < k; ++p) {
      const T aip = a[i * k + p];
      for (std::size_t j = 0; j < n; ++j)
        c[i * n + j] += aip * b[p * n + j];
    }
  return c;
}

namespace detail {
template <element_type T, extents_type EA, extents_type EB, class F>
[[nodiscard]] tensor<T, elementwise_extents_t<EA, EB>>
elementwise(const char* op, const tensor<T, EA>& a, const tensor<T, EB>& b, F f) {
  using EC = elementwise_extents_t<EA, EB>;
  std::array<std::size_t, EA::rank()> dims{};
  for (std::size_t d = 0; d < EA::rank(); ++d) {
    if (a.extent(d) != b.extent(d))
      throw shape_error(op,
                        "shapes differ: " + a.shape().to_string() + " and " + b.shape().to_string(),
                        "elementwise ops need equal extents");
    dims[d] = a.extent(d);
  }
  tensor<T, EC> c(EC::from_dims(dims, op));
  for (std::size_t i = 0; i < c.size(); ++i)
    c[i] = f(a[i], b[i]);
  return c;
}
} // namespace detail

/// Elementwise a + b.
template <element_type T, extents_type EA, extents_type EB>
[[nodiscard]] auto add(const tensor<T, EA>& a, const tensor<T, EB>& b) {
  return detail::elementwise("add", a, b, [](T x, T y) { return static_cast<T>(x + y); });
}
/// Elementwise a - b.
template <element_type T, extents_type EA, extents_type EB>
[[nodiscard]] auto sub(const tensor<T, EA>& a, const tensor<T, EB>& b) {
  return detail::elementwise("sub", a, b, [](T x, T y) { return static_cast<T>(x - y); });
}
/// Elementwise a * b.
template <element_type T, extents_type EA, extents_type EB>
[[nodiscard]] auto mul(const tensor<T, EA>& a, const tensor<T, EB>& b) {
  return detail::elementwise("mul", a, b, [](T x, T y) { return static_cast<T>(x * y); });
}

/// Fills the slice [offset, offset + t.extent(dim)) along `dim` of a tensor whose full extent
/// along `dim` is `full_extent` with N(0, stddev^2) draws addressed by the element's *global*
/// row-major index: any rank materializes any slice exactly as the whole tensor would be.
/// A whole tensor is the slice with offset 0 and full_extent = t.extent(dim).
template <std::floating_point T, extents_type E>
void fill_normal(tensor<T, E>& t, rng_key key, double stddev, std::size_t dim = 0,
                 std::size_t offset = 0, std::size_t full_extent = 0) {
  static_assert(E::rank() > 0, "hspmd::fill_normal: rank-0 tensors have no dimension to slice");
  if (full_extent == 0)
    full_extent = t.extent(dim);
  if (dim >= E::rank() || offset + t.extent(dim) > full_extent)
    throw shape_error("fill_normal",
                      "slice [" + std::to_string(offset) + ", " +
                          std::to_string(offset + t.extent(dim)) + ") along dimension " +
                          std::to_string(dim) + " does not fit a full extent of " +
                          std::to_string(full_extent),
                      "offset + local extent must not exceed the full extent");
  std::size_t outer = 1; // product of the extents before `dim`
  std::size_t inner = 1; // product of the extents after `dim`
  for (std::size_t d = 0; d < dim; ++d)
    outer *= t.extent(d);
  for (std::size_t d = dim + 1; d < E::rank(); ++d)
    inner *= t.extent(d);
  const std::size_t local = t.extent(dim);
  std::size_t i = 0;
  for (std::size_t o = 0; o < outer; ++o)
    for (std::size_t r = 0; r < local; ++r) {
      const std::size_t global_row = o * full_extent + offset + r;
      for (std::size_t in = 0; in < inner; ++in, ++i)
        t[i] = static_cast<T>(stddev * normal01(key, global_row * inner + in));
    }
}

} // namespace hspmd

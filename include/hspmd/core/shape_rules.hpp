#pragma once
// Compile-time shape rules of the typed ops. When both sizes involved are static, a mismatch is
// a `static_assert` inside a class whose template arguments spell the offending sizes, so the
// compiler's "In instantiation of" line reads like the explanation:
//     In instantiation of 'struct hspmd::detail::matmul_inner_extents_differ<
//         hspmd::detail::a_columns<3>, hspmd::detail::b_rows<4> >'
//     static assertion failed: hspmd::matmul: inner extents differ ...
// Runtime sizes are checked when the op runs and throw `shape_error` instead.

#include <hspmd/core/extents.hpp>

#include <cstddef>
#include <type_traits>
#include <utility>

namespace hspmd::detail {

// Names that make diagnostics readable: a_columns<3> says what the 3 is.
template <std::size_t N>
struct a_columns {};
template <std::size_t N>
struct b_rows {};
template <std::size_t N>
struct at_dimension {};
template <std::size_t N>
struct left_extent {};
template <std::size_t N>
struct right_extent {};
template <std::size_t N>
struct left_rank {};
template <std::size_t N>
struct right_rank {};

template <class ACols, class BRows>
struct matmul_inner_extents_differ {
  static_assert(sizeof(ACols) == 0,
                "hspmd::matmul: inner extents differ: A is (M, K) and B is (K2, N) with K != K2 "
                "(the sizes are in the instantiation above); A's columns must equal B's rows -- "
                "transpose or reshape an operand");
  static constexpr bool value = false;
};

template <extents_type A, extents_type B>
struct matmul_rule {
  static_assert(A::rank() == 2 && B::rank() == 2,
                "hspmd::matmul: both operands must have rank 2, (M, K) and (K, N)");
  static constexpr bool inner_ok = extents_may_match(A::static_extent(1), B::static_extent(0));
  // The failing class is instantiated only when the static inner sizes differ.
  static constexpr bool checked =
      std::conditional_t<inner_ok, std::true_type,
                         matmul_inner_extents_differ<a_columns<A::static_extent(1)>,
                                                     b_rows<B::static_extent(0)>>>::value;
  using type = extents<A::static_extent(0), B::static_extent(1)>;
};

template <class Dim, class Left, class Right>
struct elementwise_extents_differ {
  static_assert(sizeof(Dim) == 0,
                "hspmd: elementwise op on tensors of different shapes: the extents must be equal "
                "dimension by dimension (the differing dimension and sizes are in the "
                "instantiation above) -- reshape or slice an operand first");
  static constexpr bool value = false;
};

template <class LeftRank, class RightRank>
struct elementwise_ranks_differ {
  static_assert(sizeof(LeftRank) == 0,
                "hspmd: elementwise op on tensors of different ranks: the extents must be equal "
                "dimension by dimension (the ranks are in the instantiation above) -- reshape "
                "an operand first");
  static constexpr bool value = false;
};

// A static size wins over a runtime one; `batch` wins over `dynamic_extent`.
[[nodiscard]] constexpr std::size_t merge_extent(std::size_t a, std::size_t b) noexcept {
  if (is_static_extent(a))
    return a;
  if (is_static_extent(b))
    return b;
  return a == batch || b == batch ? batch : dynamic_extent;
}

template <extents_type A, extents_type B, class Seq>
struct elementwise_same_rank;
template <std::size_t... As, std::size_t... Bs, std::size_t... Is>
struct elementwise_same_rank<extents<As...>, extents<Bs...>, std::index_sequence<Is...>> {
  static constexpr std::size_t first_mismatch = [] {
    constexpr std::size_t a[] = {As..., 0};
    constexpr std::size_t b[] = {Bs..., 0};
    for (std::size_t i = 0; i < sizeof...(As); ++i)
      if (!extents_may_match(a[i], b[i]))
        return i;
    return sizeof...(As);
  }();
  static constexpr std::size_t at(const std::size_t (&v)[sizeof...(As) + 1], std::size_t i) {
    return v[i];
  }
  static constexpr std::size_t left = at({As..., 0}, first_mismatch);
  static constexpr std::size_t right = at({Bs..., 0}, first_mismatch);
  static constexpr bool checked =
      std::conditional_t<first_mismatch == sizeof...(As), std::true_type,
                         elementwise_extents_differ<at_dimension<first_mismatch>, left_extent<left>,
                                                    right_extent<right>>>::value;
  using type = extents<merge_extent(As, Bs)...>;
};

template <extents_type A>
struct elementwise_rank_mismatch {
  static constexpr bool checked = true; // the rank error has been reported already
  using type = A;
};

template <extents_type A, extents_type B>
struct elementwise_rule {
  static constexpr bool ranks_ok = A::rank() == B::rank();
  // Compare dimension by dimension only when the ranks agree, so a rank mismatch reports once.
  using same_rank =
      std::conditional_t<ranks_ok, elementwise_same_rank<A, B, std::make_index_sequence<A::rank()>>,
                         elementwise_rank_mismatch<A>>;
  static constexpr bool checked =
      std::conditional_t<
          ranks_ok, std::true_type,
          elementwise_ranks_differ<left_rank<A::rank()>, right_rank<B::rank()>>>::value &&
      same_rank::checked;
  using type = typename same_rank::type;
};

} // namespace hspmd::detail

namespace hspmd {

/// Extents of `A x B` for rank-2 `A` (M, K) and `B` (K, N): (M, N). Fails to compile when both
/// inner sizes are static and differ.
template <extents_type A, extents_type B>
requires(detail::matmul_rule<A, B>::checked) using matmul_extents_t =
    typename detail::matmul_rule<A, B>::type;

/// Extents of an elementwise op on `A` and `B`. Fails to compile when the ranks differ or a
/// dimension is static in both with different sizes.
template <extents_type A, extents_type B>
requires(detail::elementwise_rule<A, B>::checked) using elementwise_extents_t =
    typename detail::elementwise_rule<A, B>::type;

} // namespace hspmd

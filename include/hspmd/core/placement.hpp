#pragma once
// How a tensor is laid out over the ranks of a job.
//   replicated : every rank holds all of it
//   split<D>   : rank r holds the r-th contiguous slice along dimension D (lengths set by ratios)
//   partial    : every rank holds a full-shape addend; the tensor is the sum over ranks
// The types are what manual SPMD code spells; `placement` is the plain descriptor the
// synthesizer and plan files use. The two convert into each other.

#include <hspmd/core/error.hpp>
#include <hspmd/core/extents.hpp>

#include <charconv>
#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>

namespace hspmd {

/// Every rank holds the whole tensor.
struct replicated {};
/// Rank r holds the r-th contiguous slice along dimension `D`.
template <std::size_t D>
struct split {
  static constexpr std::size_t dim = D;
};
/// Every rank holds a full-shape addend; the tensor is their sum.
struct partial {};

/// Kinds of placement.
enum class placement_kind : unsigned char { replicated, split, partial };

/// Runtime descriptor of a placement: a kind, and a dimension for `split`.
class placement {
public:
  /// Replicated.
  constexpr placement() noexcept = default;
  constexpr placement(replicated /*tag*/) noexcept {}
  constexpr placement(partial /*tag*/) noexcept : kind_(placement_kind::partial) {}
  template <std::size_t D>
  constexpr placement(split<D> /*tag*/) noexcept : kind_(placement_kind::split), dim_(D) {}
  /// `split` along a dimension chosen at run time.
  [[nodiscard]] static constexpr placement split_along(std::size_t dim) noexcept {
    placement p{replicated{}};
    p.kind_ = placement_kind::split;
    p.dim_ = dim;
    return p;
  }

  [[nodiscard]] constexpr placement_kind kind() const noexcept { return kind_; }
  /// The split dimension; 0 for the other kinds.
  [[nodiscard]] constexpr std::size_t dim() const noexcept { return dim_; }
  [[nodiscard]] constexpr bool is_replicated() const noexcept {
    return kind_ == placement_kind::replicated;
  }
  [[nodiscard]] constexpr bool is_split() const noexcept { return kind_ == placement_kind::split; }
  [[nodiscard]] constexpr bool is_partial() const noexcept {
    return kind_ == placement_kind::partial;
  }

  /// "replicated", "split(1)" or "partial" (the plan-file spelling).
  [[nodiscard]] std::string to_string() const {
    switch (kind_) {
    case placement_kind::replicated:
      return "replicated";
    case placement_kind::partial:
      return "partial";
    case placement_kind::split:
      break;
    }
    return "split(" + std::to_string(dim_) + ")";
  }

  /// Inverse of `to_string`. Throws `config_error` naming `where` (e.g. "plan.json: field x").
  [[nodiscard]] static placement parse(std::string_view s, const std::string& where = "placement") {
    if (s == "replicated")
      return replicated{};
    if (s == "partial")
      return partial{};
    constexpr std::string_view open = "split(";
    if (s.size() > open.size() + 1 && s.substr(0, open.size()) == open && s.back() == ')') {
      std::string_view digits = s.substr(open.size(), s.size() - open.size() - 1);
      std::size_t d = 0;
      auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), d);
      if (ec == std::errc{} && end == digits.data() + digits.size())
        return split_along(d);
    }
    throw config_error(where, "unknown placement \"" + std::string(s) + "\"",
                       "expected \"replicated\", \"partial\" or \"split(D)\" with D a dimension");
  }

  friend constexpr bool operator==(const placement&, const placement&) noexcept = default;

private:
  placement_kind kind_ = placement_kind::replicated;
  std::size_t dim_ = 0;
};

namespace detail {
template <class P>
inline constexpr bool is_split_v = false;
template <std::size_t D>
inline constexpr bool is_split_v<split<D>> = true;
} // namespace detail

/// `replicated`, `partial` or some `split<D>`.
template <class P>
concept placement_type =
    std::same_as<P, replicated> || std::same_as<P, partial> || detail::is_split_v<P>;

/// The descriptor of a placement type: `placement_of<split<1>> == placement::split_along(1)`.
template <placement_type P>
inline constexpr placement placement_of = placement{P{}};

namespace detail {
template <std::size_t N>
struct tensor_rank {};

// Instantiated only for a split dimension out of range; its template arguments put the split
// and the tensor's rank into the compiler's "In instantiation of" line.
template <class Split, class Rank>
struct split_dimension_out_of_range {
  static_assert(sizeof(Split) == 0,
                "hspmd: split<D> names a dimension the tensor does not have: D must be less than "
                "the tensor's rank (dimensions count from 0; split<0> is the outermost)");
  static constexpr bool value = false;
};

template <class P, extents_type E>
struct placement_check {
  static constexpr bool value = true;
};
template <std::size_t D, extents_type E>
struct placement_check<split<D>, E> {
  static constexpr bool value =
      std::conditional_t<(D < E::rank()), std::true_type,
                         split_dimension_out_of_range<split<D>, tensor_rank<E::rank()>>>::value;
};
} // namespace detail

/// True when placement `P` can apply to a tensor with extents `E`; a `static_assert` explains
/// the error otherwise (a split dimension out of range).
template <placement_type P, extents_type E>
inline constexpr bool placement_fits_v = detail::placement_check<P, E>::value;

} // namespace hspmd

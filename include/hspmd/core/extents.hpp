#pragma once
// Tensor extents that mix static sizes, runtime sizes and one symbolic batch dimension.
//
//     extents<batch, 768>        // (B, 768): B is bound at start-up, 768 is checked at compile
//     time extents<dynamic_extent, 4> // a runtime size (from a config) next to a static one
//
// Static sizes take no storage and let shape rules fail at compile time; runtime sizes are held
// in the object and checked when an op runs. `batch` is a runtime size that also tells the
// synthesizer "this is the data dimension" (the one every model can split).

#include <hspmd/core/error.hpp>

#include <array>
#include <concepts>
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hspmd {

/// A size known only at run time (given when the extents object is built).
inline constexpr std::size_t dynamic_extent = std::numeric_limits<std::size_t>::max();
/// The symbolic batch size: a runtime size that marks the data dimension. At most one per shape.
inline constexpr std::size_t batch = dynamic_extent - 1;

/// True when `e` is a compile-time size (not `dynamic_extent` and not `batch`).
[[nodiscard]] constexpr bool is_static_extent(std::size_t e) noexcept {
  return e != dynamic_extent && e != batch;
}

/// Runtime descriptor of a shape: the extents the synthesizer and the plan files work with.
struct shape {
  std::vector<std::size_t> dims;        ///< one size per dimension, outermost first
  std::optional<std::size_t> batch_dim; ///< which dimension is the symbolic batch, if any

  [[nodiscard]] std::size_t rank() const noexcept { return dims.size(); }
  /// Number of elements (1 for a rank-0 shape).
  [[nodiscard]] std::size_t size() const noexcept {
    std::size_t n = 1;
    for (std::size_t d : dims)
      n *= d;
    return n;
  }
  /// "(batch=32, 768)": the batch dimension is named so messages say which size was bound.
  [[nodiscard]] std::string to_string() const {
    std::string s = "(";
    for (std::size_t i = 0; i < dims.size(); ++i) {
      if (i != 0)
        s += ", ";
      if (batch_dim == i)
        s += "batch=";
      s += std::to_string(dims[i]);
    }
    return s + ")";
  }
  friend bool operator==(const shape&, const shape&) = default;
};

namespace detail {
// The runtime sizes of an extents object; nothing at all for all-static extents.
template <std::size_t N>
struct extents_storage {
  std::array<std::size_t, N> dynamic_{};
};
template <>
struct extents_storage<0> {};

[[nodiscard]] constexpr std::size_t count_runtime(std::initializer_list<std::size_t> es) noexcept {
  std::size_t n = 0;
  for (std::size_t e : es)
    n += is_static_extent(e) ? 0U : 1U;
  return n;
}
} // namespace detail

/// Extents of a tensor: static sizes, `dynamic_extent` and at most one `batch`. All-static
/// extents are an empty class.
template <std::size_t... Es>
class extents : private detail::extents_storage<detail::count_runtime({Es..., 0})> {
  using storage = detail::extents_storage<detail::count_runtime({Es..., 0})>;
  static constexpr std::array<std::size_t, sizeof...(Es)> declared_sizes = {Es...};

  static constexpr std::size_t count_batch() noexcept {
    std::size_t n = 0;
    for (std::size_t e : declared_sizes)
      n += e == batch ? 1U : 0U;
    return n;
  }
  static_assert(count_batch() <= 1,
                "hspmd::extents: at most one dimension may be `batch` (the symbolic batch size); "
                "use `dynamic_extent` for other sizes known only at run time");

public:
  /// Number of dimensions.
  [[nodiscard]] static constexpr std::size_t rank() noexcept { return sizeof...(Es); }
  /// Number of dimensions whose size is given at run time (`dynamic_extent` or `batch`).
  [[nodiscard]] static constexpr std::size_t rank_dynamic() noexcept {
    return detail::count_runtime({Es..., 0});
  }
  /// The template argument for dimension `i` (a size, `dynamic_extent` or `batch`).
  [[nodiscard]] static constexpr std::size_t static_extent(std::size_t i) noexcept {
    return declared_sizes[i];
  }
  /// True when one dimension is `batch`.
  static constexpr bool has_batch = count_batch() == 1;
  /// Index of the batch dimension; `rank()` when there is none.
  static constexpr std::size_t batch_dim = [] {
    for (std::size_t i = 0; i < sizeof...(Es); ++i)
      if (declared_sizes[i] == batch)
        return i;
    return sizeof...(Es);
  }();

  /// All-static extents need no arguments.
  constexpr extents() noexcept requires(rank_dynamic() == 0) = default;

  /// One value per runtime dimension, in order: `extents<batch, 768, dynamic_extent>{32, 12}`.
  /// Throws `shape_error` for a negative value.
  template <std::integral... Ds>
  requires(sizeof...(Ds) == rank_dynamic() &&
           rank_dynamic() > 0) constexpr explicit extents(Ds... ds)
      : storage{{checked(ds)...}} {}

  /// Runtime sizes as an array, in order of the runtime dimensions.
  constexpr explicit extents(const std::array<std::size_t, rank_dynamic()>& ds) noexcept
      requires(rank_dynamic() > 0)
      : storage{ds} {}

  /// Extents from every dimension's size, outermost first: static dimensions are checked
  /// (throws `shape_error` naming `what` on a mismatch), runtime ones are taken as given.
  [[nodiscard]] static constexpr extents from_dims(const std::array<std::size_t, rank()>& dims,
                                                   const char* what = "hspmd::extents") {
    std::array<std::size_t, rank_dynamic()> ds{};
    std::size_t k = 0;
    for (std::size_t i = 0; i < rank(); ++i) {
      if (is_static_extent(declared_sizes[i])) {
        if (dims[i] != declared_sizes[i])
          throw shape_error(what,
                            "dimension " + std::to_string(i) + " is " + std::to_string(dims[i]) +
                                " but the type fixes it at " + std::to_string(declared_sizes[i]),
                            "make the sizes agree or declare the dimension dynamic_extent");
      } else {
        ds[k++] = dims[i];
      }
    }
    if constexpr (rank_dynamic() == 0)
      return extents{};
    else
      return extents{ds};
  }

  /// Size of dimension `i`.
  [[nodiscard]] constexpr std::size_t extent(std::size_t i) const noexcept {
    if (is_static_extent(declared_sizes[i]))
      return declared_sizes[i];
    if constexpr (rank_dynamic() == 0) {
      return 0; // unreachable: every dimension is static
    } else {
      std::size_t k = 0; // position of dimension i among the runtime dimensions
      for (std::size_t j = 0; j < i; ++j)
        k += is_static_extent(declared_sizes[j]) ? 0U : 1U;
      return this->dynamic_[k];
    }
  }
  /// Number of elements.
  [[nodiscard]] constexpr std::size_t size() const noexcept {
    std::size_t n = 1;
    for (std::size_t i = 0; i < rank(); ++i)
      n *= extent(i);
    return n;
  }
  /// The runtime descriptor, with the batch dimension marked.
  [[nodiscard]] hspmd::shape shape() const {
    hspmd::shape s;
    s.dims.reserve(rank());
    for (std::size_t i = 0; i < rank(); ++i)
      s.dims.push_back(extent(i));
    if constexpr (has_batch)
      s.batch_dim = batch_dim;
    return s;
  }

  /// Equal when the ranks match and every dimension has the same size (static or not).
  template <std::size_t... Fs>
  [[nodiscard]] friend constexpr bool operator==(const extents& a,
                                                 const extents<Fs...>& b) noexcept {
    if constexpr (sizeof...(Es) != sizeof...(Fs)) {
      return false;
    } else {
      for (std::size_t i = 0; i < sizeof...(Es); ++i)
        if (a.extent(i) != b.extent(i))
          return false;
      return true;
    }
  }

private:
  template <std::integral D>
  static constexpr std::size_t checked(D d) {
    if constexpr (std::signed_integral<D>) {
      if (d < 0)
        throw shape_error("hspmd::extents", "negative size " + std::to_string(d),
                          "sizes are element counts >= 0");
    }
    return static_cast<std::size_t>(d);
  }
};

namespace detail {
template <class E>
inline constexpr bool is_extents_v = false;
template <std::size_t... Es>
inline constexpr bool is_extents_v<extents<Es...>> = true;
} // namespace detail

/// Any `hspmd::extents<...>`.
template <class E>
concept extents_type = detail::is_extents_v<E>;

/// True when sizes `a` and `b` may be equal: both static and equal, or at least one runtime.
[[nodiscard]] constexpr bool extents_may_match(std::size_t a, std::size_t b) noexcept {
  return a == b || !is_static_extent(a) || !is_static_extent(b);
}

namespace detail {
template <extents_type E, std::size_t D, class Seq>
struct with_runtime_dim;
template <std::size_t... Es, std::size_t D, std::size_t... Is>
struct with_runtime_dim<extents<Es...>, D, std::index_sequence<Is...>> {
  // A static size along D becomes a runtime size; `batch` stays `batch` (it is still the batch).
  using type = extents<(Is == D && is_static_extent(Es) ? dynamic_extent : Es)...>;
};
} // namespace detail

/// `E` with dimension `D` turned into a runtime size: the extents of one uneven shard along D.
template <extents_type E, std::size_t D>
using with_runtime_dim_t =
    typename detail::with_runtime_dim<E, D, std::make_index_sequence<E::rank()>>::type;

} // namespace hspmd

#pragma once
// Manual SPMD: one rank's part of a tensor laid out by a placement type.
//
//     // 256 rows split 2:1 between two ranks; this is rank 1's part: rows [171, 256)
//     auto x = sharded<float, extents<batch, 64>, split<0>>::zeros({256}, ratios, 1);
//     x.local()   // tensor<float, extents<batch, 64>> of 85 rows
//
// The placement is checked against the extents at compile time (`split<D>` needs D < rank).

#include <hspmd/core/extents.hpp>
#include <hspmd/core/partition.hpp>
#include <hspmd/core/placement.hpp>
#include <hspmd/core/rng.hpp>
#include <hspmd/core/tensor.hpp>
#include <hspmd/core/tensor_ops.hpp>

#include <array>
#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <utility>

namespace hspmd {

namespace detail {
template <placement_type P, extents_type E>
struct local_extents {
  using type = E;
};
template <std::size_t D, extents_type E>
struct local_extents<split<D>, E> {
  using type = with_runtime_dim_t<E, D>;
};
} // namespace detail

/// One rank's part of a global tensor with extents `E` laid out by placement `P`.
template <element_type T, extents_type E, placement_type P>
class sharded {
  static_assert(placement_fits_v<P, E>, "hspmd::sharded: the placement does not fit the extents");

public:
  /// Extents of the part this rank holds: `E`, with the split dimension a runtime size.
  using local_extents_type = typename detail::local_extents<P, E>::type;
  using local_type = tensor<T, local_extents_type>;
  /// The descriptor of `P`.
  static constexpr hspmd::placement placement = placement_of<P>;

  /// This rank's zero-filled part of a tensor of extents `global` split by `ratios` (one per
  /// rank; `rank` < ratios.size()). For `replicated` and `partial` the ratios are ignored.
  [[nodiscard]] static sharded zeros(const E& global, std::span<const double> ratios,
                                     std::size_t rank) {
    if constexpr (placement.is_split()) {
      const auto lengths = shard_lengths(global.extent(P::dim), ratios);
      if (rank >= lengths.size())
        throw plan_error("sharded::zeros",
                         "rank " + std::to_string(rank) + " has no ratio (" +
                             std::to_string(lengths.size()) + " given)",
                         "pass one ratio per rank");
      auto dims = dims_of(global);
      dims[P::dim] = lengths[rank];
      return sharded(global, shard_offsets(lengths)[rank],
                     local_type(local_extents_type::from_dims(dims, "sharded::zeros")));
    } else {
      (void)ratios;
      (void)rank;
      return sharded(global, 0, local_type(local_extents_type::from_dims(dims_of(global))));
    }
  }

  /// Extents of the whole tensor.
  [[nodiscard]] const E& global_extents() const noexcept { return global_; }
  /// Where this rank's slice starts along the split dimension (0 unless split).
  [[nodiscard]] std::size_t offset() const noexcept { return offset_; }
  /// Length of this rank's slice along the split dimension (may be 0).
  [[nodiscard]] std::size_t length() const noexcept {
    if constexpr (placement.is_split())
      return local_.extent(P::dim);
    else
      return 0;
  }
  [[nodiscard]] local_type& local() noexcept { return local_; }
  [[nodiscard]] const local_type& local() const noexcept { return local_; }

  /// Fills this rank's part with the values a whole tensor drawn from `key` has there
  /// (N(0, stddev^2) by global index). Not defined for `partial`, whose parts are addends.
  template <class U = T>
  requires std::floating_point<U>
  void fill_normal(rng_key key, double stddev) {
    static_assert(!placement.is_partial(),
                  "hspmd::sharded::fill_normal: a partial tensor's parts are addends, not slices; "
                  "materialize it replicated and scale instead");
    if constexpr (placement.is_split())
      hspmd::fill_normal(local_, key, stddev, P::dim, offset_, global_.extent(P::dim));
    else
      hspmd::fill_normal(local_, key, stddev);
  }

private:
  sharded(const E& global, std::size_t offset, local_type local)
      : global_(global), offset_(offset), local_(std::move(local)) {}

  static std::array<std::size_t, E::rank()> dims_of(const E& e) {
    std::array<std::size_t, E::rank()> dims{};
    for (std::size_t d = 0; d < E::rank(); ++d)
      dims[d] = e.extent(d);
    return dims;
  }

  E global_;
  std::size_t offset_ = 0;
  local_type local_;
};

} // namespace hspmd

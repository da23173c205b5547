#pragma once
// The communication instructions of a program: what a transfer does to its tensor (and its
// backward dual), fused into the op that needs the tensor at another placement. The cost model
// (synth/cost.hpp) prices them; the distributed executor (exec/transfers.hpp) runs them.

#include <hspmd/core/collectives.hpp>
#include <hspmd/core/placement.hpp>
#include <hspmd/graph/ir.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace hspmd::synth {

/// What a transfer does to its tensor.
enum class transfer_kind : std::uint8_t {
  load,           ///< an input or parameter first used: read at the placement the op needs
  slice,          ///< replicated -> split: free (backward: the gradient is a partial sum)
  all_gather,     ///< split -> replicated (backward: reduce-scatter)
  reduce_scatter, ///< partial -> split (backward: all-gather)
  all_reduce,     ///< partial -> replicated (backward: all-reduce)
  all_to_all,     ///< split(i) -> split(j) (backward: all-to-all back)
  to_partial,     ///< replicated or split -> partial: one rank keeps it / zero padding (free)
};
inline constexpr std::size_t transfer_kind_count = 7;

[[nodiscard]] constexpr std::string_view name(transfer_kind k) noexcept {
  constexpr std::array<std::string_view, transfer_kind_count> names = {
      "load", "slice", "all_gather", "reduce_scatter", "all_reduce", "all_to_all", "to_partial"};
  return names.at(static_cast<std::size_t>(k));
}
[[nodiscard]] constexpr std::optional<transfer_kind> parse_transfer_kind(std::string_view s) {
  for (std::size_t i = 0; i < transfer_kind_count; ++i)
    if (name(static_cast<transfer_kind>(i)) == s)
      return static_cast<transfer_kind>(i);
  return std::nullopt;
}

/// The kind of transfer `k`'s backward (its dual): an all-gather's gradient is reduce-scattered
/// and the other way round; every other kind's dual is of its own kind.
[[nodiscard]] constexpr transfer_kind dual(transfer_kind k) noexcept {
  return k == transfer_kind::all_gather       ? transfer_kind::reduce_scatter
         : k == transfer_kind::reduce_scatter ? transfer_kind::all_gather
                                              : k;
}
/// Whether transfer kind `k` moves data between devices (load, slice and to_partial are local).
[[nodiscard]] constexpr bool is_collective(transfer_kind k) noexcept {
  return k != transfer_kind::load && k != transfer_kind::slice && k != transfer_kind::to_partial;
}

/// One communication or load instruction, fused into the op that needs it.
struct transfer {
  transfer_kind kind = transfer_kind::load;
  graph::node_id tensor = 0;
  placement from;
  placement to;
  uneven_algorithm algorithm = uneven_algorithm::native; ///< all-gather / reduce-scatter
  bool sfb = false; ///< a replicated parameter whose gradient comes by SFB, not all-reduce
  friend bool operator==(const transfer&, const transfer&) = default;
};

} // namespace hspmd::synth

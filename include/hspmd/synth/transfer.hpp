#pragma once
// The communication instructions of a program: what a transfer does to its tensor (and its
// backward dual), fused into the op that needs the tensor at another placement. The cost model
// (synth/cost.hpp) prices them; the distributed executor (exec/transfers.hpp) runs them.

#include <hspmd/core/collectives.hpp>
#include <hspmd/core/placement.hpp>
#include <hspmd/graph/ir.hpp>

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>

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

/// The facts of transfer kind K, one specialization per kind: every layer reads them from here
/// (the cost model, the step program, the executor's transfers and trace, the simulator, the
/// plan's explain table), and `transfer_facts_complete` below checks at compile time that every
/// kind states every fact.
///   dual        the kind of its backward (an all-gather's gradient is reduce-scattered)
///   collective  it moves data between devices (load, slice and to_partial are local)
///   forward, backward   the communicator collective of its forward and of its dual (none: local)
///   algorithm   an uneven algorithm (padded, grouped, native) chooses how it runs
///   dual_stores its dual can store the source's whole gradient instead of adding into it
///   converts(from, to)  whether the search proposes it to take a tensor from placement `from`
///               to `to` (never for a load: a first use is read where the op needs it); for
///               every pair of distinct placements exactly one kind does (checked below)
///   opt_in      the search proposes it only where search_options::allow_all_to_all allows
/// A kind's price is its specialization of cost_model::comm_of_kind (synth/cost.hpp) and its
/// run its specialization of exec::transfer_run (exec/transfers.hpp): a new kind is its enum
/// value and name here and those three specializations, each checked complete at compile time.
template <transfer_kind K>
struct transfer_traits;

template <>
struct transfer_traits<transfer_kind::load> {
  static constexpr transfer_kind dual = transfer_kind::load;
  static constexpr bool collective = false; // (a parameter's gradient: a bucket or SFB)
  static constexpr std::optional<hspmd::collective> forward{}, backward{};
  static constexpr bool algorithm = false;
  static constexpr bool dual_stores = false;
  static constexpr bool converts(placement, placement) noexcept { return false; }
  static constexpr bool opt_in = false;
};
template <>
struct transfer_traits<transfer_kind::slice> {
  static constexpr transfer_kind dual = transfer_kind::slice; // the piece's gradient, zero-padded
  static constexpr bool collective = false;
  static constexpr std::optional<hspmd::collective> forward{}, backward{};
  static constexpr bool algorithm = false;
  static constexpr bool dual_stores = false;
  static constexpr bool converts(placement from, placement to) noexcept {
    return from.is_replicated() && to.is_split();
  }
  static constexpr bool opt_in = false;
};
template <>
struct transfer_traits<transfer_kind::all_gather> {
  static constexpr transfer_kind dual = transfer_kind::reduce_scatter;
  static constexpr bool collective = true;
  static constexpr std::optional<hspmd::collective> forward = hspmd::collective::all_gather_v;
  static constexpr std::optional<hspmd::collective> backward = hspmd::collective::reduce_scatter_v;
  static constexpr bool algorithm = true;
  static constexpr bool dual_stores = true;
  static constexpr bool converts(placement from, placement to) noexcept {
    return from.is_split() && to.is_replicated();
  }
  static constexpr bool opt_in = false;
};
template <>
struct transfer_traits<transfer_kind::reduce_scatter> {
  static constexpr transfer_kind dual = transfer_kind::all_gather;
  static constexpr bool collective = true;
  static constexpr std::optional<hspmd::collective> forward = hspmd::collective::reduce_scatter_v;
  static constexpr std::optional<hspmd::collective> backward = hspmd::collective::all_gather_v;
  static constexpr bool algorithm = true;
  static constexpr bool dual_stores = true;
  static constexpr bool converts(placement from, placement to) noexcept {
    return from.is_partial() && to.is_split();
  }
  static constexpr bool opt_in = false;
};
template <>
struct transfer_traits<transfer_kind::all_reduce> {
  static constexpr transfer_kind dual = transfer_kind::all_reduce;
  static constexpr bool collective = true;
  static constexpr std::optional<hspmd::collective> forward = hspmd::collective::all_reduce;
  static constexpr std::optional<hspmd::collective> backward = hspmd::collective::all_reduce;
  static constexpr bool algorithm = false;
  static constexpr bool dual_stores = false; // each rank's whole partial sum is added
  static constexpr bool converts(placement from, placement to) noexcept {
    return from.is_partial() && to.is_replicated();
  }
  static constexpr bool opt_in = false;
};
template <>
struct transfer_traits<transfer_kind::all_to_all> {
  static constexpr transfer_kind dual = transfer_kind::all_to_all;
  static constexpr bool collective = true;
  static constexpr std::optional<hspmd::collective> forward = hspmd::collective::all_to_all_v;
  static constexpr std::optional<hspmd::collective> backward = hspmd::collective::all_to_all_v;
  static constexpr bool algorithm = false;
  static constexpr bool dual_stores = true;
  static constexpr bool converts(placement from, placement to) noexcept {
    return from.is_split() && to.is_split() && from.dim() != to.dim();
  }
  static constexpr bool opt_in = true;
};
template <>
struct transfer_traits<transfer_kind::to_partial> {
  static constexpr transfer_kind dual = transfer_kind::to_partial;
  static constexpr bool collective = false;
  static constexpr std::optional<hspmd::collective> forward{}, backward{};
  static constexpr bool algorithm = false;
  static constexpr bool dual_stores = false;
  static constexpr bool converts(placement from, placement to) noexcept {
    return !from.is_partial() && to.is_partial();
  }
  static constexpr bool opt_in = false;
};

/// A kind's facts as a value (see `transfer_traits`).
struct transfer_facts {
  transfer_kind dual = transfer_kind::load;
  bool collective = false;
  std::optional<hspmd::collective> forward, backward;
  bool algorithm = false;
  bool dual_stores = false;
  bool (*converts)(placement, placement) noexcept = nullptr;
  bool opt_in = false;
};

namespace detail {
template <transfer_kind K>
concept complete_transfer_traits = requires {
  { transfer_traits<K>::dual } -> std::convertible_to<transfer_kind>;
  { transfer_traits<K>::collective } -> std::convertible_to<bool>;
  { transfer_traits<K>::forward } -> std::convertible_to<std::optional<hspmd::collective>>;
  { transfer_traits<K>::backward } -> std::convertible_to<std::optional<hspmd::collective>>;
  { transfer_traits<K>::algorithm } -> std::convertible_to<bool>;
  { transfer_traits<K>::dual_stores } -> std::convertible_to<bool>;
  { transfer_traits<K>::converts(placement{}, placement{}) } -> std::same_as<bool>;
  { transfer_traits<K>::opt_in } -> std::convertible_to<bool>;
};
template <std::size_t... I>
constexpr bool transfer_facts_complete(std::index_sequence<I...>) {
  return (complete_transfer_traits<static_cast<transfer_kind>(I)> && ...);
}
template <std::size_t... I>
constexpr std::array<transfer_facts, transfer_kind_count>
transfer_fact_table(std::index_sequence<I...>) {
  return {transfer_facts{transfer_traits<static_cast<transfer_kind>(I)>::dual,
                         transfer_traits<static_cast<transfer_kind>(I)>::collective,
                         transfer_traits<static_cast<transfer_kind>(I)>::forward,
                         transfer_traits<static_cast<transfer_kind>(I)>::backward,
                         transfer_traits<static_cast<transfer_kind>(I)>::algorithm,
                         transfer_traits<static_cast<transfer_kind>(I)>::dual_stores,
                         &transfer_traits<static_cast<transfer_kind>(I)>::converts,
                         transfer_traits<static_cast<transfer_kind>(I)>::opt_in}...};
}
} // namespace detail

static_assert(detail::transfer_facts_complete(std::make_index_sequence<transfer_kind_count>{}),
              "every transfer kind states every fact in its transfer_traits specialization");

/// The facts of kind `k` (see `transfer_traits`).
[[nodiscard]] constexpr transfer_facts facts(transfer_kind k) noexcept {
  constexpr auto table =
      detail::transfer_fact_table(std::make_index_sequence<transfer_kind_count>{});
  return table[static_cast<std::size_t>(k)];
}
/// The kind of transfer `k`'s backward (its dual).
[[nodiscard]] constexpr transfer_kind dual(transfer_kind k) noexcept {
  return facts(k).dual;
}
/// Whether transfer kind `k` moves data between devices (load, slice and to_partial are local).
[[nodiscard]] constexpr bool is_collective(transfer_kind k) noexcept {
  return facts(k).collective;
}
/// Whether an uneven algorithm chooses how a transfer of kind `k` runs.
[[nodiscard]] constexpr bool takes_algorithm(transfer_kind k) noexcept {
  return facts(k).algorithm;
}
/// Whether the dual of a transfer of kind `k` can store the source's whole gradient instead of
/// adding into it (exec/transfers.hpp `transfer_runner::backward` with `add` false).
[[nodiscard]] constexpr bool dual_can_store(transfer_kind k) noexcept {
  return facts(k).dual_stores;
}

/// Calls `f.template operator()<K>()` with K the compile-time kind of `k` (a generic lambda
/// `[&]<transfer_kind K>() {...}`): how a layer runs the specialization of a kind's own.
template <class F>
constexpr void visit_kind(transfer_kind k, F&& f) {
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (void)((k == static_cast<transfer_kind>(I)
                ? (f.template operator()<static_cast<transfer_kind>(I)>(), true)
                : false) ||
           ...);
  }
  (std::make_index_sequence<transfer_kind_count>{});
}

/// The kinds that take a tensor from placement `from` to `to` (see `transfer_traits`).
[[nodiscard]] constexpr std::size_t converting_kinds(placement from, placement to) noexcept {
  std::size_t n = 0;
  for (std::size_t k = 0; k < transfer_kind_count; ++k)
    n += facts(static_cast<transfer_kind>(k)).converts(from, to) ? 1U : 0U;
  return n;
}

namespace detail {
// Every pair of distinct placements (splits along dimensions 0-3) has exactly one kind that
// converts it, and no placement converts to itself.
constexpr bool conversions_unique() noexcept {
  std::array<placement, 6> all = {placement{replicated{}},   placement{partial{}},
                                  placement::split_along(0), placement::split_along(1),
                                  placement::split_along(2), placement::split_along(3)};
  for (const placement& a : all)
    for (const placement& b : all)
      if (converting_kinds(a, b) != (a == b ? 0U : 1U))
        return false;
  return true;
}
} // namespace detail
static_assert(detail::conversions_unique(),
              "exactly one transfer kind converts each pair of distinct placements");

static_assert(dual(transfer_kind::all_gather) == transfer_kind::reduce_scatter &&
              dual(dual(transfer_kind::all_gather)) == transfer_kind::all_gather &&
              !is_collective(transfer_kind::slice) && is_collective(transfer_kind::all_to_all));

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

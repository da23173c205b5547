#pragma once
// Names of the collectives and of the uneven algorithms (how an uneven all-gather or
// reduce-scatter is carried out); their alpha-beta cost model is in core/collective_cost.hpp.
//
// On mixed devices every split is uneven, and there is more than one way to all-gather uneven
// shards:
//   padded  : pad every shard to the largest, run the regular collective, trim
//   grouped : one broadcast (all-gather) or reduce (reduce-scatter) per non-empty shard, in one
//             group of non-blocking calls
//   native  : the library's v-collective (MPI_Allgatherv / MPI_Reduce_scatter; on NCCL, grouped
//             send/recv)

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace hspmd {

/// The collectives of a communicator.
enum class collective : std::uint8_t {
  barrier,
  broadcast,
  all_reduce,
  all_gather_v,
  reduce_scatter_v,
  all_to_all_v,
};
inline constexpr std::size_t collective_count = 6;

/// "all_gather_v", ...
[[nodiscard]] constexpr std::string_view name(collective c) noexcept {
  constexpr std::array<std::string_view, collective_count> names = {
      "barrier", "broadcast", "all_reduce", "all_gather_v", "reduce_scatter_v", "all_to_all_v"};
  return names.at(static_cast<std::size_t>(c));
}

/// How an uneven all-gather or reduce-scatter is carried out (see the file comment).
enum class uneven_algorithm : std::uint8_t { automatic, padded, grouped, native };
inline constexpr std::size_t uneven_algorithm_count = 4;
/// The algorithms `automatic` chooses among, in tie-breaking order.
inline constexpr std::array<uneven_algorithm, 3> concrete_algorithms = {
    uneven_algorithm::native, uneven_algorithm::padded, uneven_algorithm::grouped};

/// "automatic", "padded", "grouped" or "native".
[[nodiscard]] constexpr std::string_view name(uneven_algorithm a) noexcept {
  constexpr std::array<std::string_view, uneven_algorithm_count> names = {"automatic", "padded",
                                                                          "grouped", "native"};
  return names.at(static_cast<std::size_t>(a));
}

/// Inverse of `name`; empty for an unknown name.
[[nodiscard]] constexpr std::optional<uneven_algorithm> parse_uneven_algorithm(std::string_view s) {
  for (std::size_t i = 0; i < uneven_algorithm_count; ++i)
    if (name(static_cast<uneven_algorithm>(i)) == s)
      return static_cast<uneven_algorithm>(i);
  return std::nullopt;
}

/// True for the collectives that take an `uneven_algorithm`.
[[nodiscard]] constexpr bool has_algorithms(collective c) noexcept {
  return c == collective::all_gather_v || c == collective::reduce_scatter_v;
}

} // namespace hspmd

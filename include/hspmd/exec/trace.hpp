#pragma once
// Execution traces: the trace-event format and its recorder live in sim/trace.hpp, shared by
// the executor's measured traces and the simulator's predicted ones; `gather_trace` collects
// every rank's events into one trace.

#include <hspmd/core/collectives.hpp>
#include <hspmd/sim/trace.hpp>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

namespace hspmd::exec {
using sim::chrome_trace;
using sim::trace_kind;
using sim::trace_recorder;

/// Collective over `comm`: gathers every rank's events of `recorder`; rank 0 returns the whole
/// trace (a track per rank, named by `devices[rank]` or "rank R"), the other ranks an empty
/// object.
template <class Comm>
[[nodiscard]] nlohmann::json gather_trace(Comm& comm, const trace_recorder& recorder,
                                          const std::vector<std::string>& devices) {
  const auto me = comm.rank();
  const auto n = static_cast<std::size_t>(comm.size());
  const std::string mine = recorder
                               .events_json(me, static_cast<std::size_t>(me) < devices.size()
                                                    ? devices[static_cast<std::size_t>(me)]
                                                    : "rank " + std::to_string(me))
                               .dump();
  std::vector<std::uint64_t> sizes(n);
  const std::uint64_t my_size = mine.size();
  comm.all_gather_v(std::span<const std::uint64_t>(&my_size, 1), std::span<std::uint64_t>(sizes),
                    std::vector<std::size_t>(n, 1), uneven_algorithm::native);
  std::vector<std::size_t> counts(sizes.begin(), sizes.end());
  std::vector<char> all(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
  comm.all_gather_v(std::span<const char>(mine.data(), mine.size()), std::span<char>(all),
                    std::span<const std::size_t>(counts), uneven_algorithm::native);
  if (me != 0)
    return nlohmann::json::object();
  std::vector<nlohmann::json> ranks;
  std::size_t at = 0;
  for (std::size_t c : counts) {
    ranks.push_back(nlohmann::json::parse(all.begin() + static_cast<std::ptrdiff_t>(at),
                                          all.begin() + static_cast<std::ptrdiff_t>(at + c)));
    at += c;
  }
  return chrome_trace(ranks);
}

} // namespace hspmd::exec

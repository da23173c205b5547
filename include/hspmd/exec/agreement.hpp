#pragma once
// What the ranks of a job must agree on before training: the same model, cluster, ratios and
// plan, compared by hash over the communicator so that a difference ends every rank with a
// message naming it instead of a hang or silently wrong numbers.

#include <hspmd/comm/reduce_op.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/core/hash.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/program/lower.hpp>
#include <hspmd/synth/plan.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hspmd::exec {

/// Collective, before any training collective: every rank compares its model, cluster, ratios
/// and plan with rank 0's; a difference throws `plan_error` on every rank naming the first rank
/// and what differs.
template <class Comm>
void agree_on_plan(const graph::graph& g, const synth::plan& p, Comm& comm) {
  std::string ratios;
  for (const auto& seg : p.ratios)
    for (double r : seg)
      ratios += std::to_string(r) + " ";
  const std::array<std::pair<const char*, const char*>, 4> what = {{
      {"model (traced graph)", "trace the same model with the same sizes and batch"},
      {"cluster file", "give every rank the same cluster file"},
      {"sharding ratios", "synthesize once, or from the same inputs, on every rank"},
      {"plan", "give every rank the same plan file or synthesis options"},
  }};
  const std::array<std::uint64_t, 4> mine = {synth::graph_hash(g), p.cluster_fingerprint,
                                             fnv1a64(ratios), p.hash()};
  const auto n = static_cast<std::size_t>(comm.size());
  std::vector<std::uint64_t> all(4 * n);
  comm.all_gather_v(std::span<const std::uint64_t>(mine), std::span<std::uint64_t>(all),
                    std::vector<std::size_t>(n, 4));
  for (std::size_t k = 0; k < what.size(); ++k)
    for (std::size_t r = 1; r < n; ++r)
      if (all[4 * r + k] != all[k])
        throw plan_error("rank " + std::to_string(r),
                         std::string("its ") + what[k].first + " differs from rank 0's (hash " +
                             to_hex(all[4 * r + k]) + " vs " + to_hex(all[k]) +
                             "); no training step was run",
                         what[k].second);
}

/// Collective: every rank compares its values of the named options (name, value as text) with
/// every other rank's, by hash; the first difference throws `config_error` on every rank naming
/// the option, rank 0's value and the first differing rank's value. Every rank passes the same
/// names in the same order.
template <class Comm>
void agree_on_options(std::span<const std::pair<std::string, std::string>> options, Comm& comm) {
  const auto n = static_cast<std::size_t>(comm.size());
  const std::size_t k = options.size();
  std::vector<std::uint64_t> mine;
  mine.reserve(k);
  for (const auto& [name, value] : options)
    mine.push_back(fnv1a64(name + "=" + value));
  std::vector<std::uint64_t> all(k * n);
  comm.all_gather_v(std::span<const std::uint64_t>(mine), std::span<std::uint64_t>(all),
                    std::vector<std::size_t>(n, k));
  for (std::size_t i = 0; i < k; ++i)
    for (std::size_t r = 1; r < n; ++r) {
      if (all[k * r + i] == all[i])
        continue;
      // Every rank found the same (option, rank): fetch both values for the message.
      const auto value_of = [&](int from) {
        std::string v = options[i].second;
        auto size = static_cast<std::uint64_t>(v.size());
        comm.broadcast(std::span<std::uint64_t>(&size, 1), from);
        v.resize(static_cast<std::size_t>(size));
        comm.broadcast(std::span<char>(v), from);
        return v;
      };
      const std::string first = value_of(0);
      const std::string other = value_of(static_cast<int>(r));
      throw config_error("option " + options[i].first,
                         "differs between ranks: rank 0 has " + first + ", rank " +
                             std::to_string(r) + " has " + other +
                             (comm.rank() == 0 || static_cast<std::size_t>(comm.rank()) == r
                                  ? std::string()
                                  : " (this rank: " + options[i].second + ")") +
                             "; no training step was run",
                         "give every rank the same options");
    }
}

/// Checks the rank count, agrees on the plan (`agree_on_plan`) and lowers it for this rank.
template <class Comm>
[[nodiscard]] program::local_program lower_agreed(const graph::graph& g, const synth::plan& p,
                                                  Comm& comm) {
  if (p.device_names.size() != static_cast<std::size_t>(comm.size()))
    throw plan_error("plan " + p.strategy + " for " + p.cluster_name,
                     "has " + std::to_string(p.device_names.size()) + " devices but " +
                         std::to_string(comm.size()) + " ranks run it",
                     "launch one rank per device of the cluster (mpirun -np " +
                         std::to_string(p.device_names.size()) + ")");
  agree_on_plan(g, p, comm);
  return program::lower(g, p, static_cast<std::size_t>(comm.rank()));
}

/// Every rank must feed the same whole batch: a rank whose data differs would silently train on
/// a mixture of batches. Collective, at every feed of input `name` in `step`: a hash at memory
/// speed (10.7 GB/s here: 8 KiB of tokens in 0.8 us, a 10 MiB image batch in 1 ms) and two
/// collectives of one number; a difference throws `plan_error` on every rank naming the first
/// rank that differs.
template <class Comm>
void check_same_input(Comm& comm, std::string_view name, std::span<const std::byte> bytes,
                      std::uint64_t step) {
  const std::uint64_t mine = hash_bulk(bytes);
  std::uint64_t first = mine;
  comm.broadcast(std::span<std::uint64_t>(&first, 1), 0);
  const std::int64_t differs = comm.all_reduce(
      static_cast<std::int64_t>(mine == first ? comm.size() : comm.rank()), reduce_op::min);
  if (differs < comm.size())
    throw plan_error("input \"" + std::string(name) + "\" of step " + std::to_string(step),
                     "rank " + std::to_string(differs) + " fed a different whole batch than rank 0",
                     "feed every rank the same whole batch (same data order and seed); each "
                     "rank keeps its piece");
}

} // namespace hspmd::exec

#pragma once
// Whole tensors of a distributed run from its ranks' versions, for a driver that hands them on
// (exec/pipeline.hpp adds up a boundary value its stage plan keeps as partial sums): a value
// assembled from its pieces or summed from its partial sums (collective over the executor's
// communicator), and the versions an input is loaded into.

#include <hspmd/core/error.hpp>
#include <hspmd/exec/distributed.hpp>

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace hspmd::exec {

/// The whole value of tensor `name` on every rank: as `gather`, or, where the plan keeps only
/// partial sums of it (a stage's output that its plan never needs whole), their sum.
template <class DX>
[[nodiscard]] auto whole_value(DX& dx, std::string_view name) {
  const program::local_program& prog = dx.program();
  const graph::graph& g = dx.graph();
  const auto gid = g.find(name);
  if (!gid)
    throw plan_error("distributed executor", "no tensor named \"" + std::string(name) + "\"",
                     "use the graph's node names");
  std::optional<graph::node_id> partial;
  for (graph::node_id i = 0; i < prog.local.size(); ++i)
    if (prog.global[i] == *gid) {
      if (!prog.where[i].is_partial())
        return dx.gather(name);
      partial = partial ? partial : std::optional<graph::node_id>(i);
    }
  if (!partial)
    throw plan_error("distributed executor", "the plan keeps no version of " + std::string(name),
                     "ask for a tensor of the rank's graph");
  const auto local = dx.local().value(*partial);
  std::vector<std::remove_cvref_t<decltype(local[0])>> whole(local.begin(), local.end());
  dx.communicator().all_reduce(std::span(whole), reduce_op::sum);
  return whole;
}

/// The local versions that input `name` is loaded into (its pieces, or replicas).
template <class DX>
[[nodiscard]] std::vector<graph::node_id> loaded_versions(const DX& dx, std::string_view name) {
  const auto gid = dx.graph().find(name);
  std::vector<graph::node_id> out;
  if (gid)
    for (const program::lowered_transfer& t : dx.program().transfers)
      if (t.what.kind == synth::transfer_kind::load && t.what.tensor == *gid)
        out.push_back(t.target);
  return out;
}

} // namespace hspmd::exec

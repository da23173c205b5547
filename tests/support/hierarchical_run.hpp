#pragma once
// Training under a two-level plan (exec/hierarchical.hpp) for the MPI equivalence tests: this
// rank's node runs `node_graph` (the model at its node's rows), the data is the whole batch's
// (equivalence.hpp's data_for, each node reading its rows), SGD with momentum and clipping as the
// single-process reference does.
#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/exec/hierarchical.hpp>

#include "equivalence.hpp"

#include <array>
#include <cstddef>
#include <span>

namespace hspmd::test {

/// `steps` steps of plan `p` on `world`; `ways` (may be null) gets the parameters that went
/// across nodes each way added (hierarchical_executor::cross_node_ways).
template <class T>
result<T> run_two_level(const graph::graph& node_graph, const graph::graph& whole,
                        const synth::hierarchical_plan& p, mpi_communicator& world,
                        std::size_t id_limit, std::size_t steps,
                        std::array<std::size_t, 3>* ways = nullptr) {
  exec::hierarchical_executor<T, mpi_communicator> hx(node_graph, p, world, 7);
  if (ways != nullptr)
    for (std::size_t k = 0; k < 3; ++k)
      (*ways)[k] += hx.cross_node_ways()[k];
  hx.inner().set_bucket_bytes(256);
  hx.set_cross_node_bytes(512); // several cross-node calls of a few parameters each
  exec::sgd opt(0.05, 0.9);
  result<T> r;
  for (std::size_t s = 0; s < steps; ++s) {
    const auto b = data_for<T>(whole, s, id_limit);
    for (const auto& [name, v] : b.values)
      hx.set_input(name, std::span<const T>(v));
    for (const auto& [name, v] : b.ids)
      hx.set_input(name, std::span<const std::int64_t>(v));
    hx.set_step(s);
    r.losses.push_back(static_cast<double>(hx.forward()));
    hx.backward();
    hx.clip_grad_norm(clip);
    opt.step(hx.local());
  }
  for (graph::node_id q : whole.parameters())
    r.params[whole[q].name] = hx.gather(whole[q].name);
  return r;
}

} // namespace hspmd::test

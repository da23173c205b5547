#pragma once
// A pipeline plan's step simulated device by device: each stage's plan simulated as one
// micro-batch's step on its group (sim/step.hpp: the executor's order, whole shards, its
// gradients in one bucket after the backward) gives the stage's pass -- until its last device
// ends the backward's compute -- and its once-a-step tail -- the gradient all-reduce and the
// optimizer after it; the schedule is then simulated over those (program::simulate), boundary sends
// priced as program::predicted_costs prices them.
//
//     const program::stage_costs s = sim::pipeline_costs(plan, micro_graph, cluster);
//     program::simulate(plan.make(), s).step;   // beside predicted_costs's

#include <hspmd/cluster/cluster.hpp>
#include <hspmd/program/pipeline.hpp>
#include <hspmd/program/pipeline_plan.hpp>
#include <hspmd/sim/step.hpp>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>

namespace hspmd::sim {

/// See the file comment. A two-level stage (program/two_level_stage.hpp) is simulated node by
/// node -- each node's program on its rows of the micro-batch, the slowest node's passes --
/// with `trace` (the whole model at a row count: the node programs' graphs), its once-a-step
/// sync being the slowest node's own plus the cross-node all-reduce; without `trace`, as it was
/// priced when planned.
[[nodiscard]] inline program::stage_costs
pipeline_costs(const program::pipeline_plan& p, const graph::graph& g, const cluster& c,
               const std::function<graph::graph(std::size_t)>& trace = {}) {
  program::stage_costs out = program::predicted_costs(p, g, c); // (its boundary sends)
  const auto cuts = p.cuts(g);
  // (one gradient bucket: the stage's all-reduce starts after its backward, once a step, as the
  // pipeline executor reduces the accumulated gradients)
  options o;
  o.bucket_bytes = 1e18; // (every gradient in the one bucket)
  const auto passes_of = [&](const synth::plan& sp, const graph::graph& sg, const cluster& on) {
    const synth::cost_model m(sg, on, synth::segment_map(sg, sp.segments));
    const result r = simulate(sp, m, o);
    const double pass = std::min(r.backward, r.step_time);
    return std::pair{pass, r.step_time - pass};
  };
  synth::graphs_by_rows traced(trace);
  for (std::size_t k = 0; k < p.stages.size(); ++k) {
    const std::size_t d = k % p.devices();
    const cluster group = program::sub_cluster(c, p.first_rank(d), p.group_sizes[d]);
    double pass = 0.0, sync = 0.0;
    if (const program::two_level_stage* t = p.two_level_at(k)) {
      if (!trace)
        continue;                  // (as priced)
      std::set<std::string> alike; // (nodes alike simulate alike: once)
      for (std::size_t n = 0; n < t->plan.nodes.size(); ++n) {
        if (!t->plan.active(n) || !alike.insert(program::alike_node_key(*t, group, n)).second)
          continue;
        const graph::graph& whole = traced(t->plan.node_batch[n]);
        const graph::graph sg =
            graph::extract_stage(whole,
                                 graph::stages_at_blocks(whole, p.first_blocks, p.block_prefix), k)
                .g;
        const auto [np, ns] =
            passes_of(t->plan.node_plan(n), sg, program::node_of_group(*t, group, n));
        pass = std::max(pass, np);
        sync = std::max(sync, ns);
      }
      sync += t->plan.cross_time;
    } else {
      const graph::stage_graph sg = graph::extract_stage(g, cuts, k);
      std::tie(pass, sync) = passes_of(p.stages[k], sg.g, group);
    }
    out.stage_forward[k] = pass / 3.0;
    out.stage_backward[k] = 2.0 * pass / 3.0;
    out.stage_sync[k] = sync;
  }
  return out;
}

} // namespace hspmd::sim

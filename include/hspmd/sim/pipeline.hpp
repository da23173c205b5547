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

namespace hspmd::sim {

/// See the file comment.
[[nodiscard]] inline program::stage_costs pipeline_costs(const program::pipeline_plan& p,
                                                         const graph::graph& g, const cluster& c) {
  program::stage_costs out = program::predicted_costs(p, g, c); // (its boundary sends)
  const auto cuts = p.cuts(g);
  for (std::size_t k = 0; k < p.stages.size(); ++k) {
    const std::size_t d = k % p.devices();
    const graph::stage_graph sg = graph::extract_stage(g, cuts, k);
    const cluster group = program::sub_cluster(c, p.first_rank(d), p.group_sizes[d]);
    const synth::cost_model m(sg.g, group, synth::segment_map(sg.g, p.stages[k].segments));
    // (one gradient bucket: the stage's all-reduce starts after its backward, once a step,
    // as the pipeline executor reduces the accumulated gradients)
    options o;
    o.bucket_bytes = 1e18; // (every gradient in the one bucket)
    const result r = simulate(p.stages[k], m, o);
    const double pass = std::min(r.backward, r.step_time);
    out.stage_forward[k] = pass / 3.0;
    out.stage_backward[k] = 2.0 * pass / 3.0;
    out.stage_sync[k] = r.step_time - pass;
  }
  return out;
}

} // namespace hspmd::sim

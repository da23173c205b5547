#pragma once
// The pipeline depth chosen: pipelines of P = 2, 4, 8, ... equal groups of consecutive devices
// (whole nodes where the cluster has several and P does not exceed them), each with m = 4P
// micro-batches where the batch splits so (else the most micro-batches up to 4P that split it,
// at least P), planned (program/pipeline_plan.hpp: cuts on the groups' speeds, each stage
// synthesized over its group, memory checked under the schedule) and simulated with its
// boundary sends priced; the fastest wins. A depth that cannot be planned (too few blocks, a
// device out of memory, no stage plan) is reported with its reason, not fatal.
//
//     const auto at = [&](std::size_t rows) { return models::trace_model<float>("llama", o, rows);
//     }; const program::pipeline_choice ch = program::choose_pipeline(at, 256, cluster, options);
//     ch.tried[ch.best].plan;   // the fastest depth's plan
//
// The groups are equal and consecutive and the schedule is the options': the joint search of
// depth, uneven groups, device-to-stage mapping and schedule is still to come.

#include <hspmd/cluster/cluster.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/graph/blocks.hpp>
#include <hspmd/program/pipeline_plan.hpp>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace hspmd::program {

/// One depth `choose_pipeline` tried.
struct pipeline_candidate {
  std::size_t stages = 0, micro = 0;
  std::optional<pipeline_plan> plan; ///< none: refused (see `refused`)
  double step = 0.0, bubble = 0.0;   ///< simulated, boundary sends priced
  double seconds = 0.0;              ///< planning time
  std::string refused;
};

/// What `choose_pipeline` found: every depth it tried, and the fastest planned one.
struct pipeline_choice {
  std::vector<pipeline_candidate> tried;
  std::optional<std::size_t> best; ///< index in `tried`; none: no depth could be planned
};

/// See the file comment. `trace_at(rows)`: the model traced for a micro-batch of `rows`;
/// `batch`: the step's rows; `o`: the options each depth is planned with (its group sizes,
/// micro-batch count and first blocks are chosen here).
template <class TraceAt>
[[nodiscard]] pipeline_choice choose_pipeline(TraceAt&& trace_at, std::size_t batch,
                                              const cluster& c, pipeline_options o) {
  const std::size_t n = c.size(), nodes = c.nodes().size();
  pipeline_choice out;
  for (std::size_t p = 2; p <= n; p *= 2) {
    if (n % p != 0 || (nodes > 1 && p <= nodes && nodes % p != 0))
      continue; // (equal groups; whole nodes where there are enough)
    pipeline_candidate k;
    k.stages = p * o.chunks;
    for (std::size_t m = 4 * p; m >= p && k.micro == 0; --m)
      if (batch % m == 0)
        k.micro = m;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      if (k.micro == 0)
        throw config_error("batch " + std::to_string(batch),
                           "splits into no count of micro-batches from " + std::to_string(p) +
                               " to " + std::to_string(4 * p));
      const graph::graph g = trace_at(batch / k.micro);
      if (graph::block_ranges(g, o.block_prefix).size() < k.stages)
        throw config_error("the model",
                           "has fewer blocks than " + std::to_string(k.stages) + " stages");
      pipeline_options po = o;
      po.group_sizes.assign(p, n / p);
      po.micro = k.micro;
      po.first_blocks.clear();
      pipeline_plan plan = make_pipeline_plan(g, c, po);
      const pipeline_timeline t = simulate(plan.make(), predicted_costs(plan, g, c));
      k.step = t.step;
      k.bubble = t.bubble;
      k.plan = std::move(plan);
    } catch (const error& e) { // (a depth that cannot be planned: said, not fatal)
      k.refused = e.what();
    }
    k.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (k.plan && (!out.best || k.step < out.tried[*out.best].step))
      out.best = out.tried.size();
    out.tried.push_back(std::move(k));
  }
  return out;
}

} // namespace hspmd::program

#pragma once
// The pipeline chosen: for each depth P = 2, 4, 8, ... the devices are grouped two ways --
//
//   equal   P groups of as many consecutive devices (whole nodes where there are enough), the
//           cuts then giving a faster group more blocks;
//   speed   P groups of consecutive whole nodes (devices, on one node) whose summed speeds are
//           as equal as the nodes allow, so a group of slow devices gets more of them -- and as
//           much memory -- and the cuts come out near even;
//
// each with the most micro-batches up to m = 4P that split the batch into micro-batches of at
// least a group's devices in rows (else the most up to 4P that split it, at least P), planned
// (program/pipeline_plan.hpp: cuts on the groups' speeds -- refined on the stage plans' reached
// speeds for the three fastest candidates --, each stage synthesized over its group counting its
// micro-batches in flight, on a budget of states (stage_search_expansions), a stage that is the
// same problem as one planned before planned once) and simulated with its boundary sends and
// gradient syncs priced -- over the stage costs the cost model predicts and, given a judge (the
// tool's: sim::pipeline_costs, each stage simulated device by device at whole shards), over the
// judge's, which rank the candidates; the fastest wins. Beside them, at each depth, the
// pipeline-only baseline: equal groups, even cuts, data parallel inside each stage (DP-EV). A
// candidate that cannot be planned (too few blocks, a device out of memory, no stage plan) is
// reported with its reason, not fatal; the search stops at the first depth with more stages than
// the model has blocks.
//
//     const auto at = [&](std::size_t rows) {
//       return models::trace_model<float>("llama", mo, rows);
//     };
//     const program::pipeline_choice ch = program::choose_pipeline(at, 256, cluster, options);
//     ch.tried[*ch.best].plan;   // the fastest candidate's plan
//
// The candidates are planned at once on the options' `threads` (default: the hardware's); the
// pick, its plan and the table do not depend on the thread count (the counts of stage plans
// made and reused may: two threads that meet one new stage problem both solve it).
//
// Not yet searched: the schedule (the options'), kinds mapped to stages in another order than
// the cluster's, two-level programs inside a stage.

#include <hspmd/cluster/cluster.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/core/parallel.hpp>
#include <hspmd/graph/blocks.hpp>
#include <hspmd/program/pipeline_plan.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

namespace hspmd::program {

/// How a candidate groups the devices (see the file comment).
enum class grouping : std::uint8_t { equal, speed, pipeline_only };
[[nodiscard]] constexpr std::string_view name(grouping g) noexcept {
  return g == grouping::equal ? "equal" : g == grouping::speed ? "speed" : "pipeline-only";
}

/// One candidate `choose_pipeline` tried.
struct pipeline_candidate {
  std::size_t stages = 0, micro = 0;
  grouping groups = grouping::equal;
  /// Stages on groups of whole nodes run two-level programs (two_level_stage.hpp).
  bool two_level = false;
  std::vector<std::size_t> group_sizes;
  std::optional<pipeline_plan> plan; ///< none: refused (see `refused`)
  double step = 0.0, bubble = 0.0;   ///< predicted: the schedule over predicted_costs
  /// The same over the judge's stage costs (`choose_pipeline`'s `judge`; without one, the
  /// predicted): what candidates are ranked by.
  double simulated = 0.0, simulated_bubble = 0.0;
  double imbalance = 1.0; ///< the slowest group's passes over the mean
  double seconds = 0.0;   ///< planning time
  std::string refused;
};

/// What `choose_pipeline` found: every candidate it tried, and the fastest planned one (of the
/// equal and speed groupings; the pipeline-only baselines are beside them, never chosen).
struct pipeline_choice {
  std::vector<pipeline_candidate> tried;
  std::optional<std::size_t> best; ///< index in `tried`; none: no candidate could be planned
  std::size_t stage_plans_made = 0, stage_plans_reused = 0; ///< (stage_planner)
};

/// `p` groups of consecutive devices of `c` with summed speeds as equal as whole nodes allow
/// (whole devices where the cluster has fewer nodes than `p`); empty where that cannot be done.
[[nodiscard]] inline std::vector<std::size_t> speed_groups(const cluster& c, std::size_t p) {
  std::vector<std::size_t> units; // devices per unit, in order
  std::vector<double> speed;
  for (std::size_t r = 0; r < c.size();) {
    std::size_t e = r + 1;
    if (c.nodes().size() >= p)
      while (e < c.size() && c.devices[e].node == c.devices[r].node)
        ++e;
    units.push_back(e - r);
    double s = 0.0;
    for (std::size_t x = r; x < e; ++x)
      s += c.devices[x].speed;
    speed.push_back(s);
    r = e;
  }
  if (units.size() < p)
    return {};
  std::vector<double> prefix{0.0};
  for (double s : speed)
    prefix.push_back(prefix.back() + s);
  std::vector<std::size_t> sizes;
  std::size_t at = 0; // units taken
  for (std::size_t k = 1; k <= p; ++k) {
    std::size_t end = units.size();
    if (k < p) { // the boundary nearest k / p of the speed, leaving a unit for each group after
      const double target = prefix.back() * static_cast<double>(k) / static_cast<double>(p);
      end = at + 1;
      for (std::size_t e = at + 1; e <= units.size() - (p - k); ++e)
        if (std::abs(prefix[e] - target) < std::abs(prefix[end] - target))
          end = e;
    }
    std::size_t devices = 0;
    for (std::size_t u = at; u < end; ++u)
      devices += units[u];
    sizes.push_back(devices);
    at = end;
  }
  return sizes;
}

/// The budget of each stage plan's search in `choose_pipeline`, in states expanded (the full
/// budget; a budget-cut search completes its program by repeating its blocks' programs, see
/// synth/search.hpp).
inline constexpr std::size_t stage_search_expansions = 10'000;
/// The budget of the stage and node program searches while `choose_pipeline` screens the
/// candidates, in states expanded.
inline constexpr std::size_t screening_expansions = 2'500;
/// How many of the fastest screened candidates `choose_pipeline` plans again on the full budget
/// with their cuts refined, at most: those within `refine_margin` of the fastest.
inline constexpr std::size_t refined_candidates = 2;
inline constexpr double refine_margin = 0.10;

/// See the file comment. `trace_at(rows)`: the model traced for a micro-batch of `rows`;
/// `batch`: the step's rows; `o`: the options each candidate is planned with (its group sizes,
/// micro-batch count and first blocks are chosen here).
/// `judge` (may be empty): a second opinion on a plan's stage costs -- sim::pipeline_costs,
/// which simulates each stage device by device at whole shards -- by which the candidates are
/// ranked; the cost model's (`predicted_costs`) stands beside it.
/// Its last argument: the whole model at a row count (two-level stages' node graphs).
using stage_judge =
    std::function<stage_costs(const pipeline_plan&, const graph::graph&, const cluster&,
                              const std::function<graph::graph(std::size_t)>&)>;

template <class TraceAt>
[[nodiscard]] pipeline_choice choose_pipeline(TraceAt&& trace_at, std::size_t batch,
                                              const cluster& c, pipeline_options o,
                                              const stage_judge& judge = {}) {
  const std::size_t n = c.size(), nodes = c.nodes().size();
  pipeline_choice out;
  stage_planner planner;
  // Each stage's search gets a budget in states expanded, as a two-level plan's node programs
  // do (synth/hierarchical.hpp): a count, not a time, so every rank plans alike. Llama-7B on
  // 1024 devices, P = 2 by speed: 4.9 s -> 0.7 s a candidate, its step 1 % slower.
  o.synth.search.max_expansions =
      std::min<std::size_t>(o.synth.search.max_expansions, stage_search_expansions);
  // Candidates are planned in two rounds: every one with the cuts on the groups' speeds on the
  // screening budget (`screen`), then the fastest few on the full budget with their cuts
  // refined (`refine`) -- most of the search's time is the stage searches; a quarter of their
  // budget ranks the candidates as the full one does on the bench clusters (docs/benchmarks.md).
  const bool screening = o.refine > 0;
  enum class round { screen, refine, schedule };
  const auto plan_candidate = [&](pipeline_candidate& k, round r) {
    const auto t0 = std::chrono::steady_clock::now();
    const graph::graph g = trace_at(batch / k.micro);
    pipeline_options po = o;
    po.group_sizes = k.group_sizes;
    po.micro = k.micro;
    po.two_level = k.two_level;
    po.rows = batch / k.micro;
    po.trace = [&](std::size_t rows) { return graph::graph(trace_at(rows)); };
    po.first_blocks.clear();
    po.refine = r == round::refine ? o.refine : 0;
    if (r == round::schedule) { // (the pick's cuts under the other schedule)
      po.first_blocks = k.plan->first_blocks;
      po.schedule = schedule_kind::zero_bubble;
    }
    if (screening && r == round::screen && k.groups != grouping::pipeline_only) {
      po.synth.search.max_expansions =
          std::min(o.synth.search.max_expansions, screening_expansions);
      po.node_expansions = std::min(o.node_expansions, screening_expansions);
    }
    // (the screen plans candidates at once, each its stages one after another; the refined
    // few are planned at once, each its stages at once too: a deep candidate's stages keep the
    // threads busy where a shallow one's would not)
    po.threads = 1;
    po.stage_threads = r == round::screen ? 1 : o.threads;
    // (the cuts' passes ranked as the candidates are; each cut's timeline kept for the one
    // that stays)
    std::map<std::vector<std::size_t>, pipeline_timeline> judged_at;
    if (judge)
      po.rank = [&](const pipeline_plan& q) {
        return judged_at
            .insert_or_assign(q.first_blocks, simulate(q.make(), judge(q, g, c, po.trace)))
            .first->second.step;
      };
    if (k.groups == grouping::pipeline_only) {
      const std::size_t blocks = graph::block_ranges(g, o.block_prefix).size();
      po.strategy = "dp-ev";
      po.refine = 0;
      for (std::size_t s = 0; s < k.stages; ++s)
        po.first_blocks.push_back(s * blocks / k.stages);
    }
    pipeline_plan plan = make_pipeline_plan(g, c, po, &planner);
    const stage_costs costs = predicted_costs(plan, g, c);
    const pipeline_timeline t = simulate(plan.make(), costs);
    const auto seen = judged_at.find(plan.first_blocks);
    const pipeline_timeline judged = seen != judged_at.end() ? seen->second
                                     : judge ? simulate(plan.make(), judge(plan, g, c, po.trace))
                                             : t;
    if (!k.plan || judged.step < k.simulated) {
      k.imbalance = imbalance(group_busy(plan, costs));
      k.step = t.step;
      k.bubble = t.bubble;
      k.simulated = judged.step;
      k.simulated_bubble = judged.bubble;
      k.plan = std::move(plan);
    }
    k.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Each candidate: its depth, grouping, group sizes and micro-batch count; planned below.
  const auto candidate = [&](std::size_t p, grouping how, std::vector<std::size_t> sizes) {
    pipeline_candidate k;
    k.stages = p * o.chunks;
    k.groups = how;
    k.group_sizes = std::move(sizes);
    const std::size_t widest = *std::ranges::max_element(k.group_sizes);
    // the most micro-batches up to 4P whose rows still cover a group's devices (a batch split
    // over more devices than rows leaves whole rows on a few); else the most that split it
    for (std::size_t m = 4 * p; m >= p && k.micro == 0; --m)
      if (batch % m == 0 && batch / m >= widest)
        k.micro = m;
    for (std::size_t m = 4 * p; m >= p && k.micro == 0; --m)
      if (batch % m == 0)
        k.micro = m;
    out.tried.push_back(k);
    // With two-level stages where the groups span whole nodes: a micro-batch needs a row per
    // node of a group, not per device (each node's program may split the model, not the rows).
    if (!o.two_level || how == grouping::pipeline_only)
      return;
    std::size_t widest_nodes = 0;
    bool spans = false;
    for (std::size_t d = 0, first = 0; d < k.group_sizes.size(); first += k.group_sizes[d++]) {
      const cluster group = sub_cluster(c, first, k.group_sizes[d]);
      spans = spans || spans_whole_nodes(group);
      widest_nodes = std::max(widest_nodes, group.nodes().size());
    }
    if (!spans)
      return;
    k.two_level = true;
    k.micro = 0;
    for (std::size_t m = 4 * p; m >= p && k.micro == 0; --m)
      if (batch % m == 0 && batch / m >= widest_nodes)
        k.micro = m;
    if (k.micro != 0)
      out.tried.push_back(std::move(k));
  };
  std::optional<std::size_t> blocks; // the model's (the same at every micro-batch size)
  for (std::size_t p = 2; p <= n; p *= 2) {
    if (!blocks && !out.tried.empty() && out.tried.back().micro > 0)
      blocks = graph::block_ranges(trace_at(batch / out.tried.back().micro), o.block_prefix).size();
    if (blocks && p * o.chunks > *blocks) { // (the first depth past the blocks, said once)
      candidate(p, grouping::equal, std::vector<std::size_t>(p, n / p));
      break;
    }
    const bool equal = n % p == 0 && !(nodes > 1 && p <= nodes && nodes % p != 0);
    if (equal)
      candidate(p, grouping::equal, std::vector<std::size_t>(p, n / p));
    if (const std::vector<std::size_t> s = speed_groups(c, p);
        !s.empty() && (!equal || s != std::vector<std::size_t>(p, n / p)))
      candidate(p, grouping::speed, s);
    if (equal && o.strategy == "synth")
      candidate(p, grouping::pipeline_only, std::vector<std::size_t>(p, n / p));
  }
  if (!blocks)
    for (const pipeline_candidate& k : out.tried)
      if (k.micro > 0 && !blocks)
        blocks = graph::block_ranges(trace_at(batch / k.micro), o.block_prefix).size();
  // Candidates are independent problems: planned at once on `o.threads` threads (each
  // candidate's plan does not depend on which thread or when; stage plans one candidate made
  // are reused by the others).
  parallel_for(out.tried.size(), o.threads, [&](std::size_t i) {
    pipeline_candidate& k = out.tried[i];
    const auto t0 = std::chrono::steady_clock::now();
    try {
      if (k.micro == 0)
        throw config_error("batch " + std::to_string(batch),
                           "splits into no count of micro-batches from " +
                               std::to_string(k.stages / o.chunks) + " to " +
                               std::to_string(4 * k.stages / o.chunks));
      if (blocks && *blocks < k.stages)
        throw config_error("the model",
                           "has fewer blocks than " + std::to_string(k.stages) + " stages");
      plan_candidate(k, round::screen);
    } catch (const error& e) { // (a candidate that cannot be planned: said, not fatal)
      k.refused = e.what();
      k.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  });
  for (std::size_t i = 0; i < out.tried.size(); ++i)
    if (const pipeline_candidate& k = out.tried[i];
        k.plan && k.groups != grouping::pipeline_only &&
        (!out.best || k.simulated < out.tried[*out.best].simulated))
      out.best = i;
  // The fastest (up to `refined_candidates`, within `refine_margin` of the fastest) planned on
  // the full budget, their cuts refined (o.refine times): a candidate that the screen leaves
  // far behind is not made up by moving its cuts.
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < out.tried.size(); ++i)
    if (out.tried[i].plan && out.tried[i].groups != grouping::pipeline_only)
      order.push_back(i);
  std::ranges::stable_sort(order, [&](std::size_t a, std::size_t b) {
    return out.tried[a].simulated < out.tried[b].simulated;
  });
  if (order.size() > refined_candidates)
    order.resize(refined_candidates);
  if (!order.empty())
    std::erase_if(order, [&, lead = out.tried[order.front()].simulated](std::size_t i) {
      return out.tried[i].simulated > lead * (1.0 + refine_margin);
    });
  if (o.refine > 0) {
    parallel_for(order.size(), o.threads, [&](std::size_t j) {
      try {
        plan_candidate(out.tried[order[j]], round::refine);
      } catch (const error&) { // (the screened plan stands)
      }
    });
    for (std::size_t i : order)
      if (out.tried[i].simulated < out.tried[*out.best].simulated)
        out.best = i;
  }
  // The schedule: the pick under ZB-H1 too (its backward split, the weight gradients filling
  // the bubble; its stages re-planned where it holds more micro-batches at once), kept where
  // that is faster.
  if (o.choose_schedule && out.best && o.schedule == schedule_kind::one_f_one_b && o.chunks == 1)
    try {
      plan_candidate(out.tried[*out.best], round::schedule);
    } catch (const error&) { // (1F1B's plan stands)
    }
  out.stage_plans_made = planner.made();
  out.stage_plans_reused = planner.reused();
  return out;
}

} // namespace hspmd::program

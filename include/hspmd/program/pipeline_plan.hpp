#pragma once
// A pipeline plan: the model cut into stages at block boundaries (graph/stages.hpp), the
// cluster's devices grouped into pipeline devices (consecutive ranks; a group may be one device
// or several of different speeds), each stage's own SPMD program over its group -- the
// synthesizer's (or a baseline's) plan of the stage's graph on the group's devices, with its
// uneven ratios -- the micro-batch count and the schedule (program/pipeline.hpp).
//
//     program::pipeline_options o;
//     o.group_sizes = {1, 2};          // stage 0 on rank 0, stage 1 on ranks 1-2
//     o.micro = 4;
//     o.schedule = program::schedule_kind::one_f_one_b;
//     const auto p = program::make_pipeline_plan(micro_graph, cluster, o);
//     std::cout << program::explain(p, micro_graph);
//     const nlohmann::json j = program::to_json(p);   // and pipeline_plan_from_json
//
// Stages go round the groups: stage k runs on group k mod p (with v chunks a group, the
// interleaved schedule's stages k, k + p, ...). Cuts not given are balanced against the groups'
// summed speeds (graph::balanced_stages): a faster group takes more layers.
//
// The graph is the model traced for one micro-batch; the step's batch is m of them.

#include <hspmd/cluster/cluster.hpp>
#include <hspmd/core/dtype.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/core/hash.hpp>
#include <hspmd/core/parallel.hpp>
#include <hspmd/graph/blocks.hpp>
#include <hspmd/graph/stages.hpp>
#include <hspmd/program/pipeline.hpp>
#include <hspmd/program/pipeline_stages.hpp>
#include <hspmd/program/two_level_stage.hpp>
#include <hspmd/synth/plan.hpp>
#include <hspmd/synth/synthesize.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace hspmd::program {

/// See the file comment.
struct pipeline_plan {
  std::string model = "model";
  std::string block_prefix = "layers.";
  std::vector<std::size_t> first_blocks; ///< per stage, its first block
  std::vector<std::size_t> group_sizes;  ///< per pipeline device, its ranks (consecutive)
  /// per stage, its SPMD plan over its group; for a two-level stage (`two_level`), the program
  /// of its first node that trains (a node's, not the group's)
  std::vector<synth::plan> stages;
  /// per stage (empty: none is): its two-level program, where it has one (two_level_stage.hpp)
  std::vector<std::optional<two_level_stage>> two_level;
  schedule_kind schedule = schedule_kind::one_f_one_b;
  std::size_t micro = 1;  ///< m
  std::size_t chunks = 1; ///< v (interleaved)

  [[nodiscard]] std::size_t devices() const noexcept { return group_sizes.size(); }
  [[nodiscard]] std::size_t ranks() const {
    return std::accumulate(group_sizes.begin(), group_sizes.end(), std::size_t{0});
  }
  /// The first rank of pipeline device `d`'s group.
  [[nodiscard]] std::size_t first_rank(std::size_t d) const {
    return std::accumulate(group_sizes.begin(),
                           group_sizes.begin() + static_cast<std::ptrdiff_t>(d), std::size_t{0});
  }
  /// The pipeline device whose group holds `rank`.
  [[nodiscard]] std::size_t group_of(std::size_t rank) const {
    for (std::size_t d = 0, first = 0; d < group_sizes.size(); first += group_sizes[d++])
      if (rank < first + group_sizes[d])
        return d;
    throw config_error("pipeline plan",
                       "rank " + std::to_string(rank) + " is in no group: the plan has " +
                           std::to_string(ranks()) + " ranks",
                       "run as many ranks as the plan's groups hold");
  }
  [[nodiscard]] pipeline_schedule make() const {
    return make_schedule(schedule, devices(), micro, chunks);
  }
  /// The stages of micro-batch graph `g` (node ranges).
  [[nodiscard]] std::vector<graph::node_range> cuts(const graph::graph& g) const {
    return graph::stages_at_blocks(g, first_blocks, block_prefix);
  }
  [[nodiscard]] std::uint64_t hash() const;
  /// Stage `k`'s two-level program, or null where it runs one program over its group.
  [[nodiscard]] const two_level_stage* two_level_at(std::size_t k) const {
    return k < two_level.size() && two_level[k] ? &*two_level[k] : nullptr;
  }
  [[nodiscard]] bool has_two_level() const {
    return std::ranges::any_of(two_level, [](const auto& t) { return t.has_value(); });
  }
};

/// The devices of each pipeline group from option `flag`'s `text`: "P" (P equal groups of
/// consecutive devices) or the groups' sizes ("2,1,1"), for `devices` devices (`ranks`: a job's
/// ranks, so named). Throws `config_error` naming the option, its text and the fix.
[[nodiscard]] inline std::vector<std::size_t> parse_group_sizes(const std::string& flag,
                                                                const std::string& text,
                                                                std::size_t devices,
                                                                bool ranks = false) {
  const auto bad = [&](const std::string& why, const std::string& fix) {
    return config_error(flag + " " + text, why, fix);
  };
  const std::string held = ranks ? "the job runs " + std::to_string(devices) + " ranks"
                                 : "the cluster has " + std::to_string(devices) + " devices";
  std::vector<std::size_t> sizes;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    std::size_t v = 0;
    const auto r = std::from_chars(text.data() + begin, text.data() + end, v);
    if (r.ec != std::errc{} || r.ptr != text.data() + end || v == 0)
      throw bad("is not a list of positive device counts", "give e.g. 2 or 1,1 or 2,1,1");
    sizes.push_back(v);
    begin = end + 1;
  }
  if (sizes.size() == 1) { // P equal groups
    const std::size_t p = sizes[0];
    if (p < 2 || devices % p != 0)
      throw bad(std::to_string(devices) + (ranks ? " ranks" : " devices") + " do not form " +
                    std::to_string(p) +
                    " equal groups of at least one (a pipeline needs 2 or more)",
                "give the groups' sizes, e.g. 2,1,1");
    return std::vector<std::size_t>(p, devices / p);
  }
  std::size_t sum = 0;
  for (std::size_t s : sizes)
    sum += s;
  if (sum != devices)
    throw bad("holds " + std::to_string(sum) + " devices and " + held,
              ranks ? "give group sizes that add up to the ranks (mpirun -np " +
                          std::to_string(sum) + ")"
                    : "give group sizes that add up to the cluster's devices");
  return sizes;
}

/// How to make one.
struct pipeline_options {
  std::vector<std::size_t> group_sizes;  ///< per pipeline device, its devices (required)
  std::vector<std::size_t> first_blocks; ///< per stage (empty: balanced on the groups' speeds)
  schedule_kind schedule = schedule_kind::one_f_one_b;
  std::size_t micro = 1;
  std::size_t chunks = 1;
  /// Each stage's plan: "synth" (the synthesizer), or a baseline: "dp-ev", "dp-cp", "tp".
  std::string strategy = "synth";
  synth::synth_options synth;
  std::string model = "model";
  std::string block_prefix = "layers.";
  /// Cuts not given: how many times the cuts are made again on the speeds the stage plans
  /// reached (see make_pipeline_plan); 0: the groups' summed speeds only.
  std::size_t refine = 2;
  /// choose_pipeline: candidates planned at once (0: as many as the hardware runs threads; 1:
  /// one after another). The pick is the same for every count.
  std::size_t threads = 0;
  /// make_pipeline_plan: a candidate's stages planned at once (the same counting; the plan is
  /// the same for every count).
  std::size_t stage_threads = 1;
  /// choose_pipeline with `schedule` 1F1B: its pick also planned under ZB-H1, kept where faster.
  bool choose_schedule = false;
  /// A stage whose group spans two whole nodes or more runs a two-level program
  /// (two_level_stage.hpp) where one fits; needs `trace`. choose_pipeline tries both.
  bool two_level = false;
  /// The whole model traced for a micro-batch of so many rows (two-level stages' node rows).
  std::function<graph::graph(std::size_t)> trace;
  std::size_t rows = 0; ///< a micro-batch's rows (the graph's; with two_level)
  /// The budget of two-level stages' node program searches, in states expanded.
  std::size_t node_expansions = two_level_node_expansions;
  /// Refining the cuts: a plan's step by which the passes are ranked (empty: simulated on the
  /// cost model's stage costs, `predicted_costs`). choose_pipeline ranks by its judge's.
  std::function<double(const pipeline_plan&)> rank;
};

/// `text` (a message about a group's devices) with each "rank N" or "rank N-M" counted from
/// the cluster's rank `first`, where the group starts.
[[nodiscard]] inline std::string cluster_ranks(std::string_view text, std::size_t first) {
  std::string out;
  std::size_t at = 0;
  const std::string_view word = "rank ";
  for (std::size_t hit = text.find(word); hit != std::string_view::npos;
       hit = text.find(word, at)) {
    out.append(text.substr(at, hit + word.size() - at));
    at = hit + word.size();
    for (int part = 0; part < 2; ++part) { // N, then -M
      std::size_t end = at;
      while (end < text.size() && text[end] >= '0' && text[end] <= '9')
        ++end;
      if (end == at)
        break;
      out += std::to_string(std::stoull(std::string(text.substr(at, end - at))) + first);
      at = end;
      if (part == 0 && at + 1 < text.size() && text[at] == '-' && text[at + 1] >= '0' &&
          text[at + 1] <= '9')
        out += text[at++];
      else
        break;
    }
  }
  out.append(text.substr(at));
  return out;
}

/// The first block of each of `cuts` (stage 0: block 0).
[[nodiscard]] inline std::vector<std::size_t>
first_blocks_of(const graph::graph& g, std::span<const graph::node_range> cuts,
                std::string_view prefix) {
  const std::vector<graph::node_range> blocks = graph::block_ranges(g, prefix);
  std::vector<std::size_t> out{0};
  for (std::size_t k = 1; k < cuts.size(); ++k) {
    std::size_t b = 0;
    while (b < blocks.size() && blocks[b].first != cuts[k].first)
      ++b;
    if (b == blocks.size())
      throw plan_error("pipeline plan", "stage " + std::to_string(k) + " does not start at a block",
                       "cut the model at block boundaries");
    out.push_back(b);
  }
  return out;
}

namespace detail {
inline void check_groups(const pipeline_plan& p, std::size_t devices, const std::string& where) {
  if (p.group_sizes.empty() ||
      std::ranges::any_of(p.group_sizes, [](std::size_t n) { return n == 0; }))
    throw config_error(where, "every pipeline device needs a group of at least one device",
                       "give group sizes like 1,2,1");
  if (p.ranks() != devices)
    throw config_error(where,
                       "the groups hold " + std::to_string(p.ranks()) + " devices, the cluster " +
                           std::to_string(devices),
                       "make the group sizes add up to the cluster's devices");
}
} // namespace detail

/// Devices [first, first + n) of `c` in words: "32 x H100 (h100-0.0 .. h100-3.7)" per kind of `c`,
/// or the names themselves where there are few.
[[nodiscard]] inline std::string devices_text(const cluster& c, std::size_t first, std::size_t n) {
  if (n <= 3) {
    std::string out;
    for (std::size_t r = first; r < first + n; ++r)
      out += (r > first ? "," : "") + c.devices[r].name;
    return out;
  }
  std::string out;
  for (std::size_t r = first; r < first + n;) {
    std::size_t e = r;
    while (e + 1 < first + n && c.devices[e + 1].kind == c.devices[r].kind)
      ++e;
    out += (out.empty() ? "" : " + ") + std::to_string(e - r + 1) + " x " + c.devices[r].kind +
           " (" + c.devices[r].name + ".." + c.devices[e].name + ")";
    r = e + 1;
  }
  return out;
}

/// What the stages of a pipeline plan hold at their peak under its schedule, in bytes as the
/// stage plans' memory model counts them (synth::plan::memory, synth::visit_memory).
struct pipeline_memory {
  /// Per stage, per device of its group: one micro-batch's activations -- the kept values of
  /// the nodes that depend on the data (recomputed ones only while their block runs), what an
  /// activation slot holds.
  std::vector<std::vector<double>> activations;
  /// Per stage, per device of its group: the plan's memory with the activations of every
  /// micro-batch the schedule holds on the stage at once (cost_model::set_activation_copies).
  std::vector<std::vector<double>> peak;
  /// Per pipeline device, per device of its group: its chunks' peaks added.
  std::vector<std::vector<double>> device;
  /// Per stage: the micro-batches it holds at once (program::in_flight_per_chunk).
  std::vector<std::size_t> in_flight;
};

/// The memory of plan `p` of micro-batch graph `g` on cluster `c` (see pipeline_memory).
[[nodiscard]] inline pipeline_memory memory_of(const pipeline_plan& p, const graph::graph& g,
                                               const cluster& c) {
  const pipeline_schedule s = p.make();
  const auto cuts = p.cuts(g);
  pipeline_memory out;
  for (std::size_t d = 0; d < p.devices(); ++d)
    out.device.emplace_back(p.group_sizes[d], 0.0);
  for (std::size_t k = 0; k < p.stages.size(); ++k) {
    const std::size_t d = k % p.devices(), n = p.group_sizes[d];
    const std::size_t held = std::max<std::size_t>(in_flight_per_chunk(s, d)[k / p.devices()], 1);
    stage_memory_use use;
    if (const two_level_stage* t = p.two_level_at(k)) { // (priced where it was planned)
      use.activations = t->activations;
      use.peak = t->peak;
    } else {
      const graph::stage_graph sg = graph::extract_stage(g, cuts, k);
      use = stage_memory(p.stages[k], sg.g, sub_cluster(c, p.first_rank(d), n), held);
    }
    for (std::size_t r = 0; r < n; ++r)
      out.device[d][r] += use.peak[r];
    out.activations.push_back(std::move(use.activations));
    out.peak.push_back(std::move(use.peak));
    out.in_flight.push_back(held);
  }
  return out;
}

/// Throws `config_error` naming the device, its stages and the fix where plan `p` needs more
/// memory at its peak than a device of `c` has (a device of memory 0: unknown, not checked).
inline void check_memory(const pipeline_plan& p, const graph::graph& g, const cluster& c) {
  const pipeline_memory mem = memory_of(p, g, c);
  for (std::size_t d = 0; d < p.devices(); ++d)
    for (std::size_t r = 0; r < p.group_sizes[d]; ++r) {
      const device_spec& dev = c.devices.at(p.first_rank(d) + r);
      if (dev.memory == 0 || mem.device[d][r] <= static_cast<double>(dev.memory))
        continue;
      const auto mb = [](double bytes) {
        char v[32];
        std::snprintf(v, sizeof v, "%.3g MB", bytes / 1e6);
        return std::string(v);
      };
      std::string stages;
      for (std::size_t k = d; k < p.stages.size(); k += p.devices())
        stages += (stages.empty() ? "stage " : ", stage ") + std::to_string(k) + " holds " +
                  std::to_string(mem.in_flight[k]) + " micro-batches of " +
                  mb(mem.activations[k][r]) + " activations";
      throw config_error(
          "pipeline plan: device " + dev.name + " (group " + std::to_string(d) + ")",
          "needs " + mb(mem.device[d][r]) + " at its peak under " + std::string(name(p.schedule)) +
              " (" + stages + ") and has " + mb(static_cast<double>(dev.memory)),
          "hold fewer micro-batches at once (1f1b holds at most p, gpipe m), recompute "
          "activations, give the pipeline more stages or the group more devices");
    }
}

/// Turns on activation recomputation in every stage plan of `p` that has blocks and lacks it,
/// re-priced on its group of `c` (a plan file made without it, for a run that recomputes).
inline void recompute_stages(pipeline_plan& p, const graph::graph& g, const cluster& c) {
  const auto cuts = p.cuts(g);
  for (std::size_t k = 0; k < p.stages.size(); ++k) {
    if (p.two_level_at(k) != nullptr) // (its node programs chose recomputation when planned)
      continue;
    const graph::stage_graph sg = graph::extract_stage(g, cuts, k);
    synth::plan& sp = p.stages[k];
    const std::size_t d = k % p.devices();
    const cluster sub = sub_cluster(c, p.first_rank(d), p.group_sizes[d]);
    const synth::cost_model m(sg.g, sub, synth::segment_map(sg.g, sp.segments));
    if (sp.recompute || !m.has_blocks())
      continue;
    sp.recompute = true;
    synth::evaluate(sp, m, sp.ratios);
  }
}

[[nodiscard]] inline stage_costs predicted_costs(const pipeline_plan& p, const graph::graph& g,
                                                 const cluster& c);

/// How stage `k` (graph `sg`) of `p` on `c` prices loading the values it receives -- an
/// earlier stage's outputs, a later one's gradients (synth_options::received): over the link
/// to its neighbour's group, which its devices on one node share.
[[nodiscard]] inline synth::synth_options::received_values
received_pricing(const pipeline_plan& p, const graph::stage_graph& sg, const cluster& c,
                 std::size_t k) {
  synth::synth_options::received_values out;
  for (const auto& [local, global] : sg.received)
    out.inputs.push_back(local);
  for (graph::node_id t : sg.gradient_inputs)
    out.inputs.push_back(t);
  const std::size_t d = k % p.devices();
  const std::size_t next = k > 0 ? (k - 1) % p.devices() : (k + 1) % p.devices();
  out.link = c.link_between(p.first_rank(d), p.first_rank(next));
  if (c.devices[p.first_rank(d)].node != c.devices[p.first_rank(next)].node) {
    std::map<std::int64_t, double> per_node;
    for (std::size_t r = p.first_rank(d); r < p.first_rank(d) + p.group_sizes[d]; ++r)
      out.sharing = std::max(out.sharing, per_node[c.devices[r].node] += 1.0);
  }
  return out;
}

/// Plans each stage of micro-batch graph `g` over its group of `c`'s devices (see the file
/// comment). Throws `config_error` naming the option at fault, or the device that would not hold
/// its stages' micro-batches in flight (`check_memory`). `planner` (may be null): the stage
/// plans made so far in a search, reused for a stage that is the same problem.
[[nodiscard]] inline pipeline_plan make_pipeline_plan(const graph::graph& g, const cluster& c,
                                                      const pipeline_options& o,
                                                      stage_planner* planner = nullptr) {
  pipeline_plan p;
  p.model = o.model;
  p.block_prefix = o.block_prefix;
  p.group_sizes = o.group_sizes;
  p.schedule = o.schedule;
  p.micro = o.micro;
  p.chunks = o.chunks;
  detail::check_groups(p, c.size(), "pipeline plan");
  (void)p.make(); // the schedule's own bounds (m, v) first
  const stage_strategy strategy = parse_stage_strategy(o.strategy);
  stage_planner own;
  stage_planner& sp = planner != nullptr ? *planner : own;
  const std::size_t stages = p.devices() * p.chunks;
  // The stages at `cuts` planned with `so`, each holding its micro-batches in flight: the
  // synthesizer counts that many copies of the activations it keeps.
  const std::vector<std::size_t> held = [&] {
    const pipeline_schedule sched = p.make();
    std::vector<std::size_t> out;
    for (std::size_t k = 0; k < stages; ++k)
      out.push_back(
          std::max<std::size_t>(in_flight_per_chunk(sched, k % p.devices())[k / p.devices()], 1));
    return out;
  }();
  if (o.two_level && (!o.trace || o.rows == 0))
    throw config_error("pipeline plan", "two-level stages asked for without the model's trace",
                       "set pipeline_options::trace and rows, or two_level false");
  // The whole model at a micro-batch's row count (two-level stages' node rows), traced once
  // (stages planned at once share it: a graph stays where it is as others are added).
  synth::graphs_by_rows traced(o.trace);
  std::mutex traced_mutex;
  const auto model_at = [&](std::size_t rows) -> const graph::graph& {
    const std::scoped_lock lock(traced_mutex);
    return traced(rows);
  };
  struct planned_stages {
    std::vector<synth::plan> plans;
    std::vector<std::optional<two_level_stage>> two_level;
  };
  // (each stage's plan depends on its own problem only: planned on `o.stage_threads` at once)
  const auto plan_stages_with = [&](const std::vector<graph::node_range>& cuts,
                                    const synth::synth_options& options) {
    const std::vector<std::size_t> first = first_blocks_of(g, cuts, p.block_prefix);
    std::vector<std::optional<synth::plan>> plans(stages);
    std::vector<std::optional<two_level_stage>> two_level(stages);
    parallel_for(stages, o.stage_threads, [&](std::size_t k) {
      synth::synth_options so = options;
      const std::size_t d = k % p.devices();
      const graph::stage_graph sg = graph::extract_stage(g, cuts, k);
      so.activation_copies = static_cast<double>(held[k]);
      so.received = received_pricing(p, sg, c, k);
      const cluster group = sub_cluster(c, p.first_rank(d), p.group_sizes[d]);
      if (o.two_level && spans_whole_nodes(group)) {
        const stage_graph_at at = [&](std::size_t rows) {
          const graph::graph& whole = model_at(rows);
          return graph::extract_stage(whole, graph::stages_at_blocks(whole, first, p.block_prefix),
                                      k)
              .g;
        };
        std::optional<two_level_stage> t =
            sp.plan_two_level(at, o.rows, sg.g, group, so, held[k],
                              o.model + ".stage" + std::to_string(k), o.node_expansions);
        if (t) {
          plans[k] = t->first_program();
          two_level[k] = std::move(t);
          return;
        }
      }
      try {
        plans[k] = sp.plan(sg.g, group, so, strategy, o.model + ".stage" + std::to_string(k));
      } catch (const plan_error& e) {
        const std::string where = "pipeline plan: stage " + std::to_string(k) + " on group " +
                                  std::to_string(d) + " (" +
                                  devices_text(c, p.first_rank(d), p.group_sizes[d]) + ")";
        // (the stage's synthesis counts ranks within its group: named as the cluster's)
        const std::string what = cluster_ranks(e.what(), p.first_rank(d));
        if (held[k] <= 1)
          throw plan_error(where, what,
                           "give the group more devices or memory, or the pipeline "
                           "more stages");
        throw config_error(where,
                           what + "; the stage holds " + std::to_string(held[k]) +
                               " micro-batches at once under " + std::string(name(p.schedule)),
                           "hold fewer micro-batches at once (1f1b holds at most p, gpipe m), "
                           "recompute activations, give the pipeline more stages or the group "
                           "more devices");
      }
    });
    planned_stages out;
    for (std::size_t k = 0; k < stages; ++k) {
      out.plans.push_back(std::move(*plans[k]));
      if (two_level[k]) {
        out.two_level.resize(stages);
        out.two_level[k] = std::move(two_level[k]);
      }
    }
    return out;
  };
  const auto fits = [&](const pipeline_plan& q) {
    try {
      check_memory(q, g, c);
      return true;
    } catch (const config_error&) {
      return false;
    }
  };
  // The stages at `cuts` (returns whether they fit; the synthesizer, counting the micro-batches
  // in flight, recomputes blocks where the options let it and nothing fits without).
  const auto plan_stages = [&](pipeline_plan& q, const std::vector<graph::node_range>& cuts) {
    planned_stages planned = plan_stages_with(cuts, o.synth);
    q.stages = std::move(planned.plans);
    q.two_level = std::move(planned.two_level);
    return fits(q);
  };
  if (!o.first_blocks.empty()) {
    if (o.first_blocks.size() != stages)
      throw config_error("pipeline plan",
                         std::to_string(o.first_blocks.size()) + " first blocks for " +
                             std::to_string(stages) + " stages (devices x chunks)",
                         "give one first block per stage");
    p.first_blocks = o.first_blocks;
    if (!plan_stages(p, p.cuts(g)))
      check_memory(p, g, c); // (throws, naming the device)
    return p;
  }
  // Cut on the groups' summed speeds and plan the stages; then cut again on the speeds the
  // stage plans reach -- a stage's FLOPs over its predicted time, communication and the
  // plan's overheads included -- while that moves a cut (at most `refine` times): the fastest
  // simulated step of those that fit in memory stays.
  std::vector<double> speeds;
  for (std::size_t k = 0; k < stages; ++k) {
    const std::size_t d = k % p.devices(), first = p.first_rank(d);
    double s = 0.0;
    for (std::size_t r = first; r < first + p.group_sizes[d]; ++r)
      s += c.devices[r].speed > 0.0 ? c.devices[r].speed : 1.0;
    speeds.push_back(s);
  }
  std::optional<pipeline_plan> best;
  double best_step = 0.0;
  bool best_fits = false;
  std::vector<std::vector<std::size_t>> tried;
  for (std::size_t pass = 0; pass <= o.refine; ++pass) {
    const std::vector<graph::node_range> cuts = graph::balanced_stages(g, speeds, p.block_prefix);
    pipeline_plan q = p;
    q.first_blocks = first_blocks_of(g, cuts, p.block_prefix);
    if (std::ranges::find(tried, q.first_blocks) != tried.end())
      break;
    tried.push_back(q.first_blocks);
    bool q_fits = false;
    try {
      q_fits = plan_stages(q, cuts);
    } catch (const config_error&) { // (a stage that cannot hold its micro-batches)
      if (!best)
        throw;
      break;
    }
    const stage_costs costs = predicted_costs(q, g, c);
    const double step = o.rank ? o.rank(q) : simulate(q.make(), costs).step;
    for (std::size_t k = 0; k < stages; ++k) {
      double flops = 0.0;
      for (graph::node_id i = cuts[k].first; i <= cuts[k].second; ++i)
        flops += graph::cost_of(g, i).forward_flops + graph::cost_of(g, i).backward_flops;
      const double passes = costs.stage_forward[k] + costs.stage_backward[k];
      if (flops > 0.0 && passes > 0.0)
        speeds[k] = flops / passes;
    }
    if (!best || (q_fits && !best_fits) || (q_fits == best_fits && step < best_step)) {
      best = std::move(q);
      best_step = step;
      best_fits = q_fits;
    }
  }
  p = std::move(*best);
  if (!best_fits)
    check_memory(p, g, c); // (throws, naming the device)
  return p;
}

/// The plan as JSON (its stages' plans as synth::to_json writes them).
[[nodiscard]] inline nlohmann::json to_json(const pipeline_plan& p, bool with_stats = true) {
  nlohmann::json stages = nlohmann::json::array();
  for (std::size_t k = 0; k < p.stages.size(); ++k)
    stages.push_back(p.two_level_at(k) != nullptr ? to_json(*p.two_level_at(k), with_stats)
                                                  : synth::to_json(p.stages[k], with_stats));
  return {{"kind", "pipeline"},
          {"model", p.model},
          {"block_prefix", p.block_prefix},
          {"first_blocks", p.first_blocks},
          {"group_sizes", p.group_sizes},
          {"schedule", std::string(name(p.schedule))},
          {"micro", p.micro},
          {"chunks", p.chunks},
          {"stages", stages}};
}

inline std::uint64_t pipeline_plan::hash() const {
  return fnv1a64(to_json(*this, false).dump());
}

/// Reads a plan written by `to_json` for micro-batch graph `g`; throws `config_error` naming
/// `source`, the field and the fix. A plan with two-level stages needs `trace` (the whole model
/// at a row count: their node programs' graphs); without it, it is refused so saying.
[[nodiscard]] inline pipeline_plan
pipeline_plan_from_json(const nlohmann::json& j, const graph::graph& g,
                        const std::string& source = "plan",
                        const std::function<graph::graph(std::size_t)>& trace = {}) {
  const auto fail = [&](const std::string& field, const std::string& why,
                        const std::string& fix) -> void {
    throw config_error(source + ": field \"" + field + "\"", why, fix);
  };
  if (!j.is_object() || !j.contains("kind") || j["kind"] != "pipeline")
    fail("kind", "is not \"pipeline\"", "give a pipeline plan (hspmd's pipeline plan JSON)");
  const auto sizes = [&](const char* key) {
    if (!j.contains(key) || !j[key].is_array())
      fail(key, "is missing or not an array", "an array of non-negative integers");
    std::vector<std::size_t> v;
    for (const auto& x : j[key]) {
      if (!x.is_number_integer() || x.get<std::int64_t>() < 0)
        fail(key, "holds " + x.dump(), "non-negative integers");
      v.push_back(x.get<std::size_t>());
    }
    return v;
  };
  const auto count = [&](const char* key) {
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<std::int64_t>() <= 0)
      fail(key, "is missing or not a positive integer", "a positive integer");
    return j[key].get<std::size_t>();
  };
  const auto text = [&](const char* key) {
    if (!j.contains(key) || !j[key].is_string())
      fail(key, "is missing or not a string", "a string");
    return j[key].get<std::string>();
  };
  pipeline_plan p;
  p.model = text("model");
  p.block_prefix = text("block_prefix");
  p.first_blocks = sizes("first_blocks");
  p.group_sizes = sizes("group_sizes");
  p.schedule = parse_schedule(text("schedule"));
  p.micro = count("micro");
  p.chunks = count("chunks");
  (void)p.make();
  const std::size_t stages = p.devices() * p.chunks;
  if (p.first_blocks.size() != stages)
    fail("first_blocks", "has " + std::to_string(p.first_blocks.size()) + " entries",
         "one per stage: " + std::to_string(stages));
  const auto cuts = p.cuts(g);
  if (!j.contains("stages") || !j["stages"].is_array() || j["stages"].size() != stages)
    fail("stages", "is missing or does not hold one plan per stage",
         std::to_string(stages) + " stage plans");
  for (std::size_t k = 0; k < stages; ++k) {
    const graph::stage_graph sg = graph::extract_stage(g, cuts, k);
    if (j["stages"][k].is_object() && j["stages"][k].contains("two_level")) {
      if (!trace)
        fail("stages",
             "stage " + std::to_string(k) +
                 " runs a two-level program (its nodes' "
                 "programs with the gradients all-reduced across them), which the "
                 "pipeline executor does not run yet",
             "plan with hspmd-plan --stage-programs one-level");
      const stage_graph_at at = [&](std::size_t rows) {
        const graph::graph whole = trace(rows);
        return graph::extract_stage(
                   whole, graph::stages_at_blocks(whole, p.first_blocks, p.block_prefix), k)
            .g;
      };
      two_level_stage t = two_level_from_json(j["stages"][k], at, p.group_sizes[k % p.devices()],
                                              source + " stage " + std::to_string(k));
      p.stages.push_back(t.first_program());
      p.two_level.resize(stages);
      p.two_level[k] = std::move(t);
      continue;
    }
    synth::plan s =
        synth::plan_from_json(j["stages"][k], sg.g, source + " stage " + std::to_string(k));
    const std::size_t group = p.group_sizes[k % p.devices()];
    if (s.device_names.size() != group)
      fail("stages",
           "stage " + std::to_string(k) + "'s plan has " + std::to_string(s.device_names.size()) +
               " devices, its group " + std::to_string(group),
           "plan each stage over its group's devices");
    p.stages.push_back(std::move(s));
  }
  return p;
}

/// The predicted per-stage pass times of `p` (seconds; each stage's plan predicts a step of one
/// micro-batch, split one third forward, two thirds backward -- the FLOPs' split of a GEMM
/// model), for `simulate`.
[[nodiscard]] inline stage_costs predicted_costs(const pipeline_plan& p) {
  stage_costs c;
  for (std::size_t k = 0; k < p.stages.size(); ++k) {
    const two_level_stage* t = p.two_level_at(k);
    const double step = t != nullptr ? t->passes + t->sync : p.stages[k].step_time;
    c.stage_forward.push_back(step / 3.0);
    c.stage_backward.push_back(2.0 * step / 3.0);
  }
  return c;
}

/// The same on cluster `c` (micro-batch graph `g`), with what a stage does once a step apart:
/// each stage's exposed gradient all-reduce (synth::exposed_gradient_sync) is its `stage_sync`,
/// after its last pass, and its passes split the rest of its plan's step. `transfer` is the
/// slowest send between two stages on different groups, box to box as the executor sends
/// (exec/pipeline_transfers.hpp): each receiving device takes its box of each value (its share
/// of a value its plan splits, all of one it holds whole) from the devices that hold it (their
/// shares; a value held whole, from every holder in turn), and the node that sends or receives
/// the most bytes sets the time over the link between the groups (latency + bytes over its
/// bandwidth, one link a node: a node's devices share it).
[[nodiscard]] inline stage_costs predicted_costs(const pipeline_plan& p, const graph::graph& g,
                                                 const cluster& c) {
  stage_costs out;
  const auto cuts = p.cuts(g);
  std::vector<std::size_t> stage_of(g.size(), 0);
  for (std::size_t k = 0; k < cuts.size(); ++k) {
    for (graph::node_id i = cuts[k].first; i <= cuts[k].second; ++i)
      stage_of[i] = k;
    if (const two_level_stage* t = p.two_level_at(k)) { // (priced where it was planned)
      out.stage_forward.push_back(t->passes / 3.0);
      out.stage_backward.push_back(2.0 * t->passes / 3.0);
      out.stage_sync.push_back(t->sync);
      continue;
    }
    const synth::plan& sp = p.stages[k];
    const std::size_t d = k % p.devices();
    const graph::stage_graph sg = graph::extract_stage(g, cuts, k);
    const cluster group = sub_cluster(c, p.first_rank(d), p.group_sizes[d]);
    const synth::cost_model m(sg.g, group, synth::segment_map(sg.g, sp.segments));
    // (evaluated again without the price its search gave the received values' loads: the
    // boundary sends are `transfer`'s)
    synth::plan q = sp;
    synth::evaluate(q, m, sp.ratios);
    const double sync = std::min(q.step_time, synth::exposed_gradient_sync(q, m));
    out.stage_forward.push_back((q.step_time - sync) / 3.0);
    out.stage_backward.push_back(2.0 * (q.step_time - sync) / 3.0);
    out.stage_sync.push_back(sync);
  }
  // Per stage: its graph, and for each of its nodes whether its plan holds it whole
  // (replicated, partial) on every device or split by its shares.
  std::vector<graph::stage_graph> graphs;
  std::vector<std::vector<bool>> whole(cuts.size());
  for (std::size_t k = 0; k < cuts.size(); ++k) {
    graphs.push_back(graph::extract_stage(g, cuts, k));
    whole[k].assign(graphs[k].g.size(), true);
    // (a two-level stage: as its first training node's program places it -- a value held
    // whole inside a node is still split across the nodes by their rows)
    const two_level_stage* two = p.two_level_at(k);
    for (const synth::plan_step& st : (two != nullptr ? two->first_program() : p.stages[k]).steps) {
      whole[k][st.node] = !st.rule.out.is_split();
      for (const synth::transfer& t : st.transfers)
        if (t.kind == synth::transfer_kind::load && graphs[k].g[t.tensor].kind == graph::op::input)
          whole[k][t.tensor] = !t.to.is_split() && whole[k][t.tensor];
    }
  }
  const auto share = [&](std::size_t k, std::size_t r) {
    if (const two_level_stage* two = p.two_level_at(k))
      return two->row_share(r);
    const synth::ratio_table& t = p.stages[k].ratios;
    return t.empty() || t[0].size() <= r ? 1.0 / static_cast<double>(p.group_sizes[k % p.devices()])
                                         : t[0][r];
  };
  for (std::size_t r = 0; r < cuts.size(); ++r)
    for (std::size_t k = 0; k < cuts.size(); ++k) {
      const std::size_t a = k % p.devices(), b = r % p.devices();
      if (a == b)
        continue;
      // bytes each node of the sending group sends and each of the receiving one receives:
      // a receiving device takes its box (all of a value its plan loads whole), split values
      // come from the devices that hold them, a whole one from its holders in turn
      std::map<std::int64_t, double> sent, received;
      for (const auto& [local, global] : graphs[r].received) {
        if (stage_of[global] != k)
          continue;
        const double bytes = static_cast<double>(g[global].out.size() * size_of(g[global].type));
        double needed = 0.0;
        const two_level_stage* rt = p.two_level_at(r);
        for (std::size_t x = 0; x < p.group_sizes[b]; ++x) {
          const double box = whole[r][local] ? bytes * (rt != nullptr ? rt->node_share(x) : 1.0)
                                             : bytes * share(r, x);
          received[c.devices[p.first_rank(b) + x].node] += box;
          needed += box;
        }
        const auto at = std::ranges::find(graphs[k].global, global);
        const std::size_t producer = static_cast<std::size_t>(at - graphs[k].global.begin());
        const bool held_whole = producer < whole[k].size() && whole[k][producer];
        const two_level_stage* kt = p.two_level_at(k);
        for (std::size_t x = 0; x < p.group_sizes[a]; ++x) {
          // what device x sends of it: its share; of a whole value, a turn among its holders
          // (on a two-level stage, the holders of its node's rows)
          double part = share(k, x);
          if (held_whole)
            part = kt != nullptr
                       ? kt->node_share(x) /
                             static_cast<double>(kt->plan.nodes[kt->node_of(x).first].size())
                       : 1.0 / static_cast<double>(p.group_sizes[a]);
          sent[c.devices[p.first_rank(a) + x].node] += needed * part;
        }
      }
      if (sent.empty())
        continue;
      double most = 0.0;
      for (const auto& [node, bytes] : sent)
        most = std::max(most, bytes);
      for (const auto& [node, bytes] : received)
        most = std::max(most, bytes);
      const link_spec& l = c.link_between(p.first_rank(a), p.first_rank(b));
      out.transfer = std::max(out.transfer, l.latency + most / l.bandwidth);
    }
  return out;
}

/// Per group of `p`, its stages' passes of one micro-batch (forward + backward, `costs`): the
/// slowest over their mean is the plan's stage imbalance.
[[nodiscard]] inline std::vector<double> group_busy(const pipeline_plan& p,
                                                    const stage_costs& costs) {
  std::vector<double> busy(p.devices(), 0.0);
  for (std::size_t k = 0; k < p.stages.size(); ++k)
    busy[k % p.devices()] += costs.stage_forward[k] + costs.stage_backward[k];
  return busy;
}

/// The slowest of `busy` (group_busy) over their mean; 1 where all are 0.
[[nodiscard]] inline double imbalance(const std::vector<double>& busy) {
  const double mean =
      std::accumulate(busy.begin(), busy.end(), 0.0) / static_cast<double>(busy.size());
  return mean > 0.0 ? *std::ranges::max_element(busy) / mean : 1.0;
}

/// The idle share of device time an ideal pipeline of equal stages has under schedule `kind`
/// with `p` devices, `m` micro-batches and `v` chunks a device (forward, input and weight
/// gradient passes equally long): (p - 1) / (m + p - 1) for GPipe and 1F1B, m v for
/// interleaved, 3 m for ZB-H1 (whose weight passes fill two thirds of the 1F1B bubble).
[[nodiscard]] inline double theory_bubble(schedule_kind kind, std::size_t p, std::size_t m,
                                          std::size_t v = 1) {
  const double idle = static_cast<double>(p - 1);
  const double work = kind == schedule_kind::interleaved   ? static_cast<double>(m * v)
                      : kind == schedule_kind::zero_bubble ? 3.0 * static_cast<double>(m)
                                                           : static_cast<double>(m);
  return idle / (work + idle);
}

/// The stage table on cluster `c`: blocks, group, devices, shares, each stage's predicted
/// micro-batch pass (forward + backward) and once-a-step gradient sync, the micro-batches each
/// stage holds at once under the schedule and its peak memory with them (`memory_of`); then why
/// the step is what it is: the slowest group against the mean, the simulated step and bubble
/// against the schedule's ideal bubble, and the slowest stage's binding rows.
[[nodiscard]] inline std::string explain(const pipeline_plan& p, const graph::graph& g,
                                         const cluster& c) {
  const pipeline_memory mem = memory_of(p, g, c);
  const pipeline_schedule s = p.make();
  const stage_costs costs = predicted_costs(p, g, c);
  const auto blocks = graph::block_ranges(g, p.block_prefix);
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line,
                "pipeline plan: %zu stages on %zu groups (%zu devices), schedule %s, %zu "
                "micro-batches%s\n",
                p.stages.size(), p.devices(), p.ranks(), std::string(name(p.schedule)).c_str(),
                p.micro,
                p.chunks > 1 ? (", " + std::to_string(p.chunks) + " chunks a group").c_str() : "");
  out += line;
  std::snprintf(line, sizeof line, "%-6s %-8s %-6s %-11s %-11s %-10s %-9s %-12s %s\n", "stage",
                "blocks", "group", "pass (s)", "sync (s)", "peak (MB)", "in flight", "shares",
                "devices");
  out += line;
  for (std::size_t k = 0; k < p.stages.size(); ++k) {
    const synth::plan& sp = p.stages[k];
    const std::size_t d = k % p.devices();
    const std::size_t last_block =
        k + 1 < p.first_blocks.size() ? p.first_blocks[k + 1] - 1 : blocks.size() - 1;
    std::string shares;
    if (const two_level_stage* t = p.two_level_at(k)) { // rows a node: "2L 3+5"
      shares = "2L ";
      for (std::size_t n = 0; n < t->plan.node_batch.size(); ++n)
        shares += (n == 0 ? "" : "+") + std::to_string(t->plan.node_batch[n]);
      if (shares.size() > 12)
        shares = "2L " + std::to_string(t->plan.nodes.size()) + " nodes";
    } else if (!sp.ratios.empty()) {
      const auto [lo, hi] = std::ranges::minmax(sp.ratios[0]);
      char share[48];
      std::snprintf(share, sizeof share, lo == hi ? "%.3g" : "%.3g-%.3g", lo, hi);
      shares = share;
    }
    const double memory = *std::ranges::max_element(mem.peak[k]);
    std::snprintf(line, sizeof line, "%-6zu %-8s %-6zu %-11.4g %-11.4g %-10.1f %-9zu %-12s %s\n", k,
                  (std::to_string(p.first_blocks[k]) + "-" + std::to_string(last_block)).c_str(), d,
                  costs.stage_forward[k] + costs.stage_backward[k], costs.stage_sync[k],
                  memory / 1e6, mem.in_flight[k], shares.c_str(),
                  devices_text(c, p.first_rank(d), p.group_sizes[d]).c_str());
    out += line;
  }
  const std::vector<double> busy = group_busy(p, costs);
  std::size_t slowest_stage = 0;
  for (std::size_t k = 0; k < p.stages.size(); ++k)
    if (costs.stage_forward[k] + costs.stage_backward[k] >
        costs.stage_forward[slowest_stage] + costs.stage_backward[slowest_stage])
      slowest_stage = k;
  const double mean =
      std::accumulate(busy.begin(), busy.end(), 0.0) / static_cast<double>(busy.size());
  const auto slowest = std::ranges::max_element(busy);
  std::snprintf(line, sizeof line,
                "stage balance: group %zu's stages take %.4g s a micro-batch (the slowest), the "
                "mean %.4g s: imbalance %.3fx\n",
                static_cast<std::size_t>(slowest - busy.begin()), *slowest, mean,
                mean > 0.0 ? *slowest / mean : 1.0);
  out += line;
  const pipeline_timeline t = simulate(s, costs);
  std::snprintf(line, sizeof line,
                "predicted step %.4g s, bubble %.1f %% of device time (the schedule's ideal with "
                "equal stages: %.1f %%; boundary send %.3g ms; gradient sync after the last "
                "micro-batch up to %.4g s)\n",
                t.step, 100.0 * t.bubble,
                100.0 * theory_bubble(p.schedule, p.devices(), p.micro, p.chunks),
                1e3 * costs.transfer, *std::ranges::max_element(costs.stage_sync));
  out += line;
  if (p.has_two_level())
    out += "2L: a two-level stage (its nodes' own programs on their rows of each micro-batch, "
           "the gradients all-reduced across the nodes once a step); its binding rows are its "
           "first node's\n";
  const synth::plan& sp = p.stages[slowest_stage];
  if (!sp.binding.empty()) {
    out += "slowest stage " + std::to_string(slowest_stage) + "'s binding rows:";
    for (const std::string& b : sp.binding)
      out += " " + b + ";";
    out += "\n";
  }
  return out;
}

} // namespace hspmd::program

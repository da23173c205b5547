#pragma once
// Synthesis: the search <-> ratio-LP loop, and the baselines built by the same machinery.
//
//   ratios <- speed-proportional
//   repeat: program <- A* at ratios; ratios' <- LP for program; stop unless the cost strictly
//           improves (search at fixed ratios is optimal, the LP is optimal for a fixed program,
//           so the cost never increases).
//
// The LP sees the program as a sum over instructions of max-over-devices of linear functions.
// Instructions whose per-device functions are proportional (all split compute of a segment,
// every padded all-gather, every native one, ...) are merged first: the sum of their maxima is
// the maximum of their sum, so the LP stays small (tens of rows per device, not thousands).
//
// Baselines (same rules, costs and search, restricted):
//   dp-ev : data parallel -- every op split along the batch or replicated, parameters
//           replicated (gradients all-reduced), even ratios
//   dp-cp : the same program with speed-proportional ratios
//   tp    : tensor (Megatron-style) parallel -- no batch split; column / row / head / vocabulary
//           parallel rules, even ratios
//
// A second opinion (synth_options::judge, e.g. sim::judge: the simulated step with overlap,
// link sharing and whole rows, which the additive model leaves out). Where it is set, the
// loop's plans (each round's program at its ratios and re-balanced), and the data-parallel
// program of the same space at speed-proportional ratios (DP-CP's), are weighed by it too;
// the cost model's pick stands unless the judge puts another at least `judge_margin` faster.
// The judge must be deterministic: every rank synthesizes alone and must agree.

#include <hspmd/synth/plan.hpp>
#include <hspmd/synth/ratio_lp.hpp>
#include <hspmd/synth/shards.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hspmd::synth {

/// What to synthesize and how hard to try.
struct synth_options {
  search_options search;
  segment_policy segments = segment_policy::one;
  std::size_t max_rounds = 8; ///< search <-> LP rounds at most
  bool solve_lp = true;       ///< false: keep the starting ratios
  /// Measured compute times of the graph (train/profile.hpp); FLOPs / speed when absent.
  std::optional<compute_profile> profile;
  /// bf16 or f16: a mixed-precision run, its GEMMs priced at the devices' `bf16_speed`.
  dtype gemm_type = dtype::f32;
  /// A second opinion on a plan's step time in seconds (sim::judge); see the file comment.
  std::function<double(const plan&, const cost_model&)> judge;
  double judge_margin = 0.01; ///< how much faster the judge must find a plan to overrule
  /// Copies of the data's kept values a device holds at once (a pipeline stage's micro-batches
  /// in flight; cost_model::set_activation_copies): memory is checked with them.
  double activation_copies = 1.0;
  /// A pipeline stage's received values and their link (cost_model::set_received).
  struct received_values {
    std::vector<graph::node_id> inputs;
    link_spec link;
    double sharing = 1.0;
  };
  std::optional<received_values> received;
};

/// The baselines.
enum class baseline : std::uint8_t { dp_ev, dp_cp, tp };
[[nodiscard]] constexpr std::string_view name(baseline b) noexcept {
  return b == baseline::dp_ev ? "dp-ev" : b == baseline::dp_cp ? "dp-cp" : "tp";
}

/// Ratios proportional to the devices' speeds (every segment alike).
[[nodiscard]] inline ratio_table proportional_ratios(const cluster& c, std::size_t segments) {
  double total = 0.0;
  for (const auto& d : c.devices)
    total += d.speed;
  std::vector<double> r;
  for (const auto& d : c.devices)
    r.push_back(d.speed / total);
  return ratio_table(segments, r);
}

/// Even ratios.
[[nodiscard]] inline ratio_table even_ratios(const cluster& c, std::size_t segments) {
  return ratio_table(segments, std::vector<double>(c.size(), 1.0 / static_cast<double>(c.size())));
}

namespace detail {

// Per device: constant c_d and coefficients a_d (one segment), for grouping.
struct shape_key {
  int kind = 0; // 0 compute, 1 comm
  std::size_t segment = 0;
  std::vector<long long> g; // normalized coefficient vector, quantized
  friend bool operator<(const shape_key& a, const shape_key& b) {
    return std::tie(a.kind, a.segment, a.g) < std::tie(b.kind, b.segment, b.g);
  }
};

struct merged_step {
  ratio_step step;
  std::size_t members = 0;
  std::string largest;
  double largest_value = -1.0;
};

} // namespace detail

/// The ratio LP of a program (instructions merged where exact) with the cluster's memory.
[[nodiscard]] inline ratio_problem ratio_problem_of(const plan& p, const cost_model& m,
                                                    const ratio_table& at) {
  const std::size_t n = m.devices();
  ratio_problem q;
  q.segments = m.segments().names();
  for (const auto& d : m.cluster().devices) {
    q.devices.push_back(d.name);
    q.capacity.push_back(static_cast<double>(d.memory));
  }
  // FSDP-gathered copies: at most this many bytes of them at once, on every device; what is
  // kept, and the recomputation block that holds the most at `at` (blocks alike, as a model's
  // layers are: one block's values stand for the largest).
  {
    memory_terms mem = memory_terms_of(p, m, gathered_parameter_peak(p.steps, m));
    const linear_cost* largest = nullptr;
    double most = -1.0;
    for (const auto& b : mem.blocks)
      if (b)
        if (const double v = max_at(device_costs(n, *b), at).first; v > most) {
          most = v;
          largest = &*b;
        }
    if (largest != nullptr) {
      mem.kept.constant += largest->constant;
      for (const auto& term : largest->terms)
        mem.kept.terms.push_back(term);
    }
    term_list merged; // per segment (once, not per device)
    for (const auto& [seg, v] : mem.kept.terms) {
      auto it =
          std::find_if(merged.begin(), merged.end(), [&](const auto& x) { return x.first == seg; });
      if (it == merged.end())
        merged.emplace_back(seg, v);
      else
        it->second += v;
    }
    mem.kept.terms = std::move(merged);
    q.memory.assign(n, mem.kept);
  }
  std::map<detail::shape_key, detail::merged_step> groups;
  double constant = 0.0;
  std::vector<ratio_step> kept;
  const auto consider = [&](device_costs c, int kind, const std::string& what) {
    if (c.empty())
      return;
    // One segment, device-independent constant, coefficients f * g_d?
    std::optional<std::size_t> seg;
    bool simple = true;
    for (const auto& x : c) {
      if (x.constant != c[0].constant && !x.terms.empty())
        simple = false;
      for (const auto& [s, a] : x.terms) {
        if (a == 0.0)
          continue;
        if (seg && *seg != s)
          simple = false;
        seg = s;
      }
    }
    if (!seg) { // constants only: the maximum is a constant
      double mx = 0.0;
      for (std::size_t d = 0; d < n; ++d)
        mx = std::max(mx, c[d].constant);
      constant += mx;
      return;
    }
    if (!simple) {
      ratio_step st;
      st.name = what;
      (kind == 0 ? st.compute : st.comm) = std::move(c);
      kept.push_back(std::move(st));
      return;
    }
    std::vector<double> a(n);
    double amax = 0.0;
    for (std::size_t d = 0; d < n; ++d) {
      for (const auto& [s, v] : c[d].terms)
        if (s == *seg)
          a[d] += v;
      amax = std::max(amax, std::abs(a[d]));
    }
    detail::shape_key key{kind, *seg, {}};
    for (double v : a)
      key.g.push_back(std::llround(v / amax * 1e9));
    auto& grp = groups[key];
    if (grp.members == 0) {
      grp.step.name = what;
      auto& list = kind == 0 ? grp.step.compute : grp.step.comm;
      list.assign(n, linear_cost{0.0, {{*seg, 0.0}}});
    }
    auto& list = kind == 0 ? grp.step.compute : grp.step.comm;
    for (std::size_t d = 0; d < n; ++d) {
      list[d].constant += c[0].constant;
      list[d].terms[0].second += a[d];
    }
    const double v = max_at(c, at).first;
    if (v > grp.largest_value) {
      grp.largest_value = v;
      grp.largest = what;
    }
    ++grp.members;
  };
  for (const plan_step& s : p.steps) {
    consider(m.compute(s.node, s.rule), 0, s.name);
    consider(m.rule_comm(s.node, s.rule, at), 1, s.name + " (vocabulary all-reduce)");
    for (const transfer& t : s.transfers) {
      const std::string what = std::string(name(t.kind)) + " " + m.graph()[t.tensor].name;
      consider(m.comm(t, at), 1, what);
      consider(m.transfer_compute(t), 0,
               t.sfb ? "SFB weight gradient of " + m.graph()[t.tensor].name
                     : "optimizer of " + m.graph()[t.tensor].name);
      if (p.recompute)
        consider(m.replay_comm(t, s.node, at), 1, what + " (replayed)");
    }
    if (p.recompute)
      consider(m.replay_compute(s.node, s.rule), 0, s.name + " (replayed)");
  }
  for (auto& [key, grp] : groups) {
    if (grp.members > 1)
      grp.step.name = std::to_string(grp.members) + " steps (largest: " + grp.largest + ")";
    else
      grp.step.name = grp.largest;
    q.steps.push_back(std::move(grp.step));
  }
  for (auto& st : kept)
    q.steps.push_back(std::move(st));
  if (constant > 0.0) {
    ratio_step st;
    st.name = "replicated work and fixed-size collectives";
    st.compute.assign(n, linear_cost{constant, {}});
    q.steps.push_back(std::move(st));
  }
  return q;
}

namespace detail {

[[nodiscard]] inline std::string where_no_plan(const cost_model& m, const search_result& r) {
  return "synthesis for cluster " + m.cluster().name +
         (m.cluster().source.empty() ? "" : " (" + m.cluster().source + ")");
  (void)r;
}

[[noreturn]] inline void fail_no_plan(const cost_model& m, const search_result& r) {
  if (!r.memory_message.empty())
    throw plan_error(where_no_plan(m, r), "no plan fits in memory: " + r.memory_message,
                     "use devices with more memory, more devices, or a smaller batch or model");
  // Pins are the usual cause: a pinned input or parameter is only loaded in its pinned
  // placement, and a pinned value only comes from rules that yield its pin.
  std::string pins;
  std::size_t count = 0;
  for (const graph::node& n : m.graph().nodes())
    if (n.pin && count++ < 8)
      pins += (pins.empty() ? "" : ", ") + n.name + " " + n.pin->to_string();
  if (count > 8)
    pins += ", ... (" + std::to_string(count) + " in all)";
  if (!pins.empty())
    throw plan_error(where_no_plan(m, r),
                     "the search found no plan that keeps the model's pins: " + pins,
                     "a pinned input is only loaded in its pinned placement: put an op between "
                     "it and a redistribution, or unpin one of the values");
  throw plan_error(where_no_plan(m, r), "the search found no plan",
                   "allow more rules or raise the search budget");
}

/// Sets `p.memory` to what lowering's whole shards keep (`whole_shard_memory`). A device that
/// cannot hold its whole shards (a whole row where its ratio is a fraction of one) gets none:
/// its ratios go to 0 in every segment and the others are scaled up, a few times; throws
/// `plan_error` naming the device when that does not help.
inline void fit_whole_shards(plan& p, const cost_model& m) {
  const auto& devs = m.cluster().devices;
  for (int attempt = 0;; ++attempt) {
    p.memory = whole_shard_memory(p, m, p.ratios);
    std::vector<std::size_t> over;
    for (std::size_t d = 0; d < devs.size(); ++d)
      if (p.memory[d] > static_cast<double>(devs[d].memory))
        over.push_back(d);
    if (over.empty())
      return;
    ratio_table r = p.ratios;
    bool movable = attempt < 4;
    for (auto& seg : r) {
      for (std::size_t d : over)
        seg[d] = 0.0;
      double sum = 0.0;
      for (double x : seg)
        sum += x;
      movable = movable && sum > 0.0;
      for (double& x : seg)
        x = sum > 0.0 ? x / sum : x;
    }
    if (!movable) {
      const std::size_t d = over.front();
      throw plan_error("synthesis for cluster " + m.cluster().name,
                       "at the whole shards lowering cuts (" + std::to_string(over.size()) +
                           " device(s) over), device " + devs[d].name + " (rank " +
                           std::to_string(d) + ") needs " + bytes_text(p.memory[d]) + " but has " +
                           bytes_text(static_cast<double>(devs[d].memory)),
                       "more rows than devices (a larger batch), more memory, or a smaller model");
    }
    evaluate(p, m, r);
  }
}

/// `fit_whole_shards`, or false where it fails and planning again with activations recomputed
/// may fit (the options leave it to the planner and the plan does not recompute yet).
[[nodiscard]] inline bool fits_whole_shards(plan& p, const cost_model& m,
                                            const synth_options& opt) {
  const bool may_recompute = opt.search.recompute == search_options::recomputation::when_needed &&
                             !p.recompute && m.has_blocks();
  try {
    fit_whole_shards(p, m);
  } catch (const plan_error&) {
    if (!may_recompute)
      throw;
    return false;
  }
  return true;
}
[[nodiscard]] inline synth_options recomputing(synth_options o) {
  o.search.recompute = search_options::recomputation::always;
  return o;
}

/// The search options of a baseline (see the file comment): data parallel (split along the
/// batch only, parameters whole or, where memory needs it, kept in shards and gathered for use:
/// FSDP) or tensor parallel (no batch split).
[[nodiscard]] inline search_options baseline_search(const graph::graph& g, const segment_map& seg,
                                                    baseline b, search_options so) {
  so.allow_sfb = false;
  so.allow_all_to_all = b == baseline::tp;
  const bool dp = b != baseline::tp;
  so.allow_rule = [&g, &seg, dp](graph::node_id id, const graph::rule& r) {
    if (r.kind == graph::rule::family::replicated)
      return true;
    if (r.kind != graph::rule::family::split)
      return !dp; // linear (partial) and expert rules: tensor parallelism only
    const graph::node& n = g[id];
    bool batch = false;
    if (r.out.is_split())
      batch = seg.is_batch(id, r.out.dim());
    for (std::size_t k = 0; k < r.arity; ++k)
      if (r.in[k].is_split())
        batch = batch || seg.is_batch(n.inputs[k], r.in[k].dim());
    return dp == batch;
  };
  // A sharded load is only ever followed by its gather (search_options::shard_parameters).
  so.allow_load = [&g, &seg, dp](graph::node_id t, placement p) {
    if (p.is_partial())
      return false;
    if (g[t].kind == graph::op::parameter && dp)
      return !p.is_partial();
    if (!p.is_split())
      return true;
    return dp == seg.is_batch(t, p.dim());
  };
  return so;
}

/// The judge's pick among `weighed` (the loop's plans) and the data-parallel program of the
/// same space (`so`) at speed-proportional ratios; replaces `best` where the judge
/// finds one at least `judge_margin` faster than it (see the file comment).
inline void weigh(plan& best, std::vector<plan>& weighed, const graph::graph& g, const cluster& c,
                  const cost_model& m, const search_options& so, const synth_options& opt,
                  const std::string& model) {
  if (c.size() > 1) {
    search_options dp = baseline_search(g, m.segments(), baseline::dp_cp, so);
    dp.pareto_retry = false;
    // A count, not a time, so every rank finds the same program; where the budget ends first
    // the search's best so far is the candidate.
    dp.max_expansions = std::min<std::size_t>(dp.max_expansions, 20'000);
    const ratio_table start = proportional_ratios(c, m.segments().count());
    // A model that pins a placement the data-parallel rules cannot give (a column-split weight,
    // say) has no such program: then there is no candidate, not an error.
    std::optional<search_result> res;
    try {
      res = search(m, start, dp);
    } catch (const plan_error&) {
    }
    // (not re-balanced by the LP: its LP from cold is most of synthesis at thousands of
    // devices, e.g. 10 of 12.6 s for Llama-70B at 4 096)
    if (res && res->found)
      weighed.push_back(make_plan(*res, m, start, model, "synth"));
  }
  // Candidates the same as `best` or as one before (in program and ratios; the LP's binding
  // rows aside) are weighed once.
  const auto program = [](plan p) {
    p.binding.clear();
    return p.hash();
  };
  std::vector<std::uint64_t> seen{program(best)};
  // A plan lowering would refuse is no candidate, and any candidate lowering takes replaces it
  // (a guard: the search pairs what lowering checks, e.g. an MoE layer's dispatch and combine).
  const auto lowers = [&g](const plan& p) {
    try {
      const shard_classes classes(g, p);
      return true;
    } catch (const plan_error&) {
      return false;
    }
  };
  const bool best_lowers = lowers(best);
  const double mine = opt.judge(best, m);
  best.stats.judged = 0;
  best.stats.judged_step = mine;
  best.stats.model_pick_step = best.step_time;
  best.stats.model_pick_judged = mine;
  const plan* pick = nullptr;
  double pick_time =
      best_lowers ? mine * (1.0 - opt.judge_margin) : std::numeric_limits<double>::infinity();
  for (plan& p : weighed) {
    if (opt.search.check_memory) {
      try {
        fit_whole_shards(p, m);
      } catch (const plan_error&) {
        continue; // whole rows do not fit: not a candidate
      }
    }
    if (const std::uint64_t k = program(p); std::ranges::find(seen, k) != seen.end())
      continue;
    else
      seen.push_back(k);
    if (!lowers(p))
      continue;
    const double t = opt.judge(p, m);
    ++best.stats.judged;
    if (t < pick_time) {
      pick_time = t;
      pick = &p;
    }
  }
  if (pick == nullptr)
    return;
  // The candidate keeps the binding rows its loop's LP named (none for the data-parallel
  // program at speed-proportional ratios): solving its LP again only to name them is a cold
  // solve, seconds at thousands of devices.
  plan chosen = *pick;
  chosen.stats = best.stats;
  chosen.stats.reranked = true;
  chosen.stats.judged_step = pick_time;
  best = std::move(chosen);
}

} // namespace detail

/// Synthesizes a plan for `g` on cluster `c`: the search <-> LP loop from speed-proportional
/// ratios.
[[nodiscard]] inline plan synthesize(const graph::graph& g, const cluster& c,
                                     const synth_options& opt = {}, std::string model = "model") {
  cost_model m(g, c, segment_map(g, opt.segments), opt.profile, opt.gemm_type);
  m.set_activation_copies(opt.activation_copies);
  if (opt.received)
    m.set_received(opt.received->inputs, opt.received->link, opt.received->sharing);
  ratio_table r = proportional_ratios(c, m.segments().count());
  plan best;
  bool have = false;
  plan_stats stats;
  search_options so = opt.search;
  bool fell_back = false;
  std::vector<plan> weighed; // the plans the judge weighs (where there is one)
  const auto weigh_later = [&](const plan& p) {
    if (opt.judge)
      weighed.push_back(p);
  };
  for (std::size_t round = 0; round < std::max<std::size_t>(opt.max_rounds, 1); ++round) {
    // Round 0 tries the fast search first (no memory-Pareto retry) and, where nothing fits, the
    // data-parallel FSDP space below before the slow retries.
    const bool may_fall_back =
        !have && opt.search.check_memory &&
        opt.search.shard_parameters != search_options::parameter_sharding::never &&
        !opt.search.allow_rule && !opt.search.allow_load;
    const auto add_counts = [](search_result& to, const search_result& from) {
      to.expanded += from.expanded;
      to.generated += from.generated;
      to.seconds += from.seconds;
    };
    // The fast search; where nothing fits, the FSDP space; then the slow retries.
    const auto with_fallback = [&](const search_options& base) {
      search_options first = base;
      first.pareto_retry = false;
      search_result res = search(m, r, first);
      if (res.found || res.memory_message.empty())
        return res;
      // The search spends its budget on cheap partial plans that keep activations whole and
      // run out of memory layers later (deep models on small devices). Data parallelism with
      // sharded parameters (FSDP) keeps the least per device: search that space, which the
      // full one contains, so the result is still a plan of the synthesizer's space.
      search_options dp = detail::baseline_search(g, m.segments(), baseline::dp_cp, base);
      dp.shard_parameters = search_options::parameter_sharding::always;
      search_result fallback = search(m, r, dp);
      add_counts(fallback, res);
      if (fallback.found) {
        so = dp; // later rounds search the same space at the LP's ratios
        fell_back = true;
        return fallback;
      }
      if (!base.pareto_retry) {           // the first search's answer (and why), all of the work
        res.expanded = fallback.expanded; // (the fallback's counts include the first's)
        res.generated = fallback.generated;
        res.seconds = fallback.seconds;
        return res;
      }
      search_result full = search(m, r, base);
      add_counts(full, fallback);
      return full;
    };
    search_result res;
    using recomputation = search_options::recomputation;
    if (!may_fall_back) {
      res = search(m, r, so);
    } else if (so.recompute != recomputation::when_needed || !m.has_blocks()) {
      res = with_fallback(so);
    } else {
      // Activations recomputed only where nothing fits without (the FSDP space included).
      search_options keep = so;
      keep.recompute = recomputation::never;
      res = with_fallback(keep);
      if (!res.found && !res.memory_message.empty()) {
        search_options again = so;
        again.recompute = recomputation::always;
        search_result rc = with_fallback(again);
        add_counts(rc, res);
        if (!rc.found && rc.memory_message.empty())
          rc.memory_message = res.memory_message;
        res = std::move(rc);
      }
    }
    if (res.sharded_parameters) // later rounds need not find out again
      so.shard_parameters = search_options::parameter_sharding::always;
    if (res.recomputed)
      so.recompute = search_options::recomputation::always;
    stats.expanded += res.expanded;
    stats.generated += res.generated;
    stats.search_seconds += res.seconds;
    stats.rounds = round + 1;
    if (!res.found) {
      if (have)
        break; // keep the best so far (the LP's ratios squeezed memory too far)
      detail::fail_no_plan(m, res);
    }
    plan cur = make_plan(res, m, r, model, "synth");
    cur.stats = stats;
    cur.stats.fsdp_fallback = fell_back;
    cur.stats.optimal = res.optimal;
    cur.stats.gap = res.cost > 0.0 ? (res.cost - res.lower_bound) / res.cost : 0.0;
    const double tol = 1e-9 * std::max(cur.step_time, 1e-300);
    weigh_later(cur);
    if (have && !(cur.step_time < best.step_time - tol))
      break;
    best = std::move(cur);
    have = true;
    if (!opt.solve_lp || c.size() == 1)
      break;
    const auto lp_start = std::chrono::steady_clock::now();
    const ratio_problem q = ratio_problem_of(best, m, r);
    const ratio_solution sol = solve_ratios(q);
    stats.lp_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - lp_start).count();
    best.stats.lp_seconds = stats.lp_seconds;
    if (sol.status != lp::status::optimal)
      break;
    best.binding.clear(); // the LP's view of this program, moved or not
    for (const auto& b : sol.bottlenecks)
      if (best.binding.size() < 6)
        best.binding.push_back(b.text);
    if (opt.judge) // the candidate weighed above is this program at these ratios
      weighed.back().binding = best.binding;
    plan moved = best;
    evaluate(moved, m, sol.ratios);
    weigh_later(moved);
    if (!(moved.step_time < best.step_time - tol))
      break;
    best = std::move(moved);
    r = sol.ratios;
  }
  if (opt.search.check_memory && !detail::fits_whole_shards(best, m, opt)) {
    // Whole rows do not fit where continuous shares did: plan again recomputing activations.
    plan again = synthesize(g, c, detail::recomputing(opt), std::move(model));
    again.stats.expanded += stats.expanded;
    again.stats.generated += stats.generated;
    again.stats.search_seconds += stats.search_seconds;
    again.stats.lp_seconds += stats.lp_seconds;
    return again;
  }
  if (opt.judge)
    detail::weigh(best, weighed, g, c, m, so, opt, model);
  best.stats.rounds = stats.rounds;
  best.stats.expanded = stats.expanded;
  best.stats.generated = stats.generated;
  best.stats.search_seconds = stats.search_seconds;
  best.stats.lp_seconds = stats.lp_seconds;
  return best;
}

/// A baseline plan built by the same search, restricted (see the file comment).
[[nodiscard]] inline plan make_baseline(const graph::graph& g, const cluster& c, baseline b,
                                        const synth_options& opt = {},
                                        std::string model = "model") {
  cost_model m(g, c, segment_map(g, opt.segments), opt.profile, opt.gemm_type);
  m.set_activation_copies(opt.activation_copies);
  if (opt.received)
    m.set_received(opt.received->inputs, opt.received->link, opt.received->sharing);
  const search_options so = detail::baseline_search(g, m.segments(), b, opt.search);
  const ratio_table r = b == baseline::dp_cp ? proportional_ratios(c, m.segments().count())
                                             : even_ratios(c, m.segments().count());
  const search_result res = search(m, r, so);
  if (!res.found)
    detail::fail_no_plan(m, res);
  plan p = make_plan(res, m, r, model, std::string(name(b)));
  if (opt.search.check_memory && !detail::fits_whole_shards(p, m, opt)) {
    plan again = make_baseline(g, c, b, detail::recomputing(opt), std::move(model));
    again.stats.expanded += res.expanded;
    again.stats.generated += res.generated;
    again.stats.search_seconds += res.seconds;
    return again;
  }
  p.stats.expanded = res.expanded;
  p.stats.generated = res.generated;
  p.stats.search_seconds = res.seconds;
  p.stats.rounds = 1;
  p.stats.optimal = res.optimal;
  p.stats.gap = res.cost > 0.0 ? (res.cost - res.lower_bound) / res.cost : 0.0;
  return p;
}

} // namespace hspmd::synth

#pragma once
// A distributed run's plan and what the trainer does with it, as plain functions of the graph,
// the options and the ranks (train/world.hpp), with no tensors: choosing the plan (synthesized,
// a baseline, a file, or through the plan cache on rank 0), the start-up lines that report it,
// the simulated step and trace next to the measured ones, and re-balancing after a step (the
// straggler monitor, the warm ratio re-solve on rank 0, the report). Moving the tensors is the
// engine's; train/trainer_impl.hpp passes it in.

#include <hspmd/cluster/cluster.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/graph/ir.hpp>
#include <hspmd/lp/standard_form.hpp>
#include <hspmd/sim/step.hpp>
#include <hspmd/synth/plan.hpp>
#include <hspmd/synth/plan_cache.hpp>
#include <hspmd/synth/synthesize.hpp>
#include <hspmd/train/metrics_log.hpp>
#include <hspmd/train/namespace.hpp>
#include <hspmd/train/profile.hpp>
#include <hspmd/train/rebalance.hpp>
#include <hspmd/train/report.hpp>
#include <hspmd/train/results.hpp>
#include <hspmd/train/train_options.hpp>
#include <hspmd/train/world.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace hspmd::train {

/// A distributed run's plan with what prices it: the cluster (with measured collectives and
/// overlap where it was calibrated), the synthesizer's options, how calibration measured, and
/// the plan's ops measured at every rank's pieces.
struct planned_run {
  cluster c;
  synth::synth_options so;
  synth::plan plan;
  std::optional<profile_options> calibration;
  std::optional<sim::shard_times> shard_times;
  sim::options priced;       ///< how the simulator prices this run's step program (`priced_like`)
  double plan_seconds = 0.0; ///< planning it at start (synthesis, or the plan cache)

  [[nodiscard]] synth::cost_model cost_model(const graph::graph& g, const cluster& at) const {
    return synth::cost_model(g, at, synth::segment_map(g, plan.segments), so.profile, so.gemm_type);
  }
  /// Plan `p` (its program at its ratios) with its predictions for cluster `at`.
  [[nodiscard]] synth::plan evaluated(const graph::graph& g, synth::plan p,
                                      const cluster& at) const {
    synth::evaluate(p, cost_model(g, at), p.ratios);
    return p;
  }
  /// `priced` with the plan's ops measured at every rank's pieces, where they were.
  [[nodiscard]] sim::options sim_options() const {
    sim::options o = priced;
    o.measured = shard_times ? &*shard_times : nullptr;
    return o;
  }
  [[nodiscard]] double simulated_step(const graph::graph& g) const {
    return sim::simulate(plan, cost_model(g, c), sim_options()).step_time;
  }
};

/// How the simulator prices a run of `o` in elements of `element_bytes` (sim/step.hpp): the
/// run's gradient buckets.
[[nodiscard]] inline sim::options priced_like(const train_options& o, std::size_t element_bytes) {
  sim::options priced;
  priced.element_bytes = element_bytes;
  if (o.bucket_mb > 0.0)
    priced.bucket_bytes = o.bucket_mb * 1024.0 * 1024.0;
  return priced;
}

/// The synthesizer's options for a run of `o` in elements of `element_bytes`.
[[nodiscard]] inline synth::synth_options planning_options(const train_options& o,
                                                           std::size_t element_bytes) {
  synth::synth_options so;
  so.gemm_type = o.precision == exec::precision::bf16  ? dtype::bf16
                 : o.precision == exec::precision::f16 ? dtype::f16
                                                       : dtype::f32;
  if (o.recompute) // planned with it: its replays priced, its memory counted
    so.search.recompute = synth::search_options::recomputation::always;
  if (!o.rank_by_cost) // candidates weighed by the simulated step, priced as the run
    so.judge = sim::judge(priced_like(o, element_bytes));
  return so;
}

/// Refuses, before any training, an output file (trace, plan, graph, metrics) rank 0 cannot
/// write. Collective.
inline void check_output_files(const train_options& o, world& w) {
  for (const auto& [what, path] : {std::pair<const char*, const std::string*>{"trace", &o.trace},
                                   {"plan", &o.save_plan},
                                   {"graph", &o.save_graph},
                                   {"metrics", &o.metrics}})
    if (!path->empty()) {
      std::vector<double> ok{1.0};
      if (w.root())
        ok[0] = std::ofstream(*path, std::ios::app).good() ? 1.0 : 0.0;
      w.broadcast(ok);
      if (ok[0] == 0.0)
        throw config_error(std::string(what) + " file " + *path, "cannot be written",
                           "give a path in an existing, writable directory");
    }
}

/// The plan through the plan cache: rank 0 looks up, re-solves or synthesizes (ranks may see
/// different directories) and every rank gets its JSON; `note` (rank 0) says what the cache did.
/// Collective.
[[nodiscard]] inline synth::plan cached_plan(const graph::graph& g, const train_options& o,
                                             const planned_run& run, world& w, std::string& note) {
  std::string text;
  if (w.root()) {
    const auto c = synth::synthesize_cached(g, run.c, run.so, o.name, o.plan_cache);
    text = synth::to_json(c.p).dump();
    char b[160];
    switch (c.outcome) {
    case synth::cache_outcome::hit:
      note = ", from the plan cache: synthesis skipped";
      break;
    case synth::cache_outcome::resolved:
      std::snprintf(b, sizeof b,
                    ", from the plan cache: the cluster's numbers changed, ratios re-solved "
                    "for the cached program in %zu LP iterations%s",
                    c.lp_iterations, c.warm ? " from its basis" : "");
      note = b;
      break;
    case synth::cache_outcome::miss:
      note = ", synthesized and stored in the plan cache";
      break;
    case synth::cache_outcome::uncached:
      note = ", calibrated: not cached";
      break;
    }
    if (!c.file.empty())
      note += " (" + c.file.string() + ")";
  }
  w.broadcast_text(text);
  return synth::plan_from_json(nlohmann::json::parse(text), g, "the plan from rank 0");
}

/// The plan `o.plan` names for `run.c`: synthesized (through the cache when one is given), a
/// baseline, or a plan file; priced with recomputation when the run recomputes. Sets
/// `o.recompute` when the plan was made with it. Returns the seconds planning took; `note`
/// (rank 0) says what the plan cache did. Collective.
inline double choose_plan(const graph::graph& g, train_options& o, planned_run& run, world& w,
                          std::string& note) {
  const std::string which = o.plan.empty() ? "synth" : o.plan;
  const auto t0 = std::chrono::steady_clock::now();
  if (which == "synth" && !o.plan_cache.empty())
    run.plan = cached_plan(g, o, run, w, note);
  else if (which == "synth")
    run.plan = synth::synthesize(g, run.c, run.so, o.name);
  else if (which == "dp-ev")
    run.plan = synth::make_baseline(g, run.c, synth::baseline::dp_ev, run.so, o.name);
  else if (which == "dp-cp")
    run.plan = synth::make_baseline(g, run.c, synth::baseline::dp_cp, run.so, o.name);
  else if (which == "tp")
    run.plan = synth::make_baseline(g, run.c, synth::baseline::tp, run.so, o.name);
  else
    run.plan = synth::load_plan(which, g);
  if (o.recompute && !run.plan.recompute && !scope_segments(g).empty()) {
    run.plan.recompute = true; // a plan file made without it: priced with it
    synth::evaluate(run.plan, run.cost_model(g, run.c), run.plan.ratios);
  }
  o.recompute = o.recompute || run.plan.recompute; // the plan's memory counts on it
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Rank 0's start-up lines of the plan: cluster, strategy, planning time, prediction, shares,
/// whether the simulated step re-ranked it, and `explain`'s table when asked.
inline void announce_plan(std::ostream& out, const graph::graph& g, const train_options& o,
                          const planned_run& run, double plan_seconds, const std::string& note) {
  const synth::plan& p = run.plan;
  print(out, "cluster \"%s\" (%zu ranks); plan %s (%.0f ms%s): predicted step %s; shares",
        run.c.name.c_str(), run.c.size(), p.strategy.c_str(), 1e3 * plan_seconds, note.c_str(),
        synth::milliseconds_text(p.step_time).c_str());
  for (std::size_t d = 0; d < p.device_names.size(); ++d)
    print(out, " %s %.1f%%", p.device_names[d].c_str(), 100.0 * p.ratios[0][d]);
  out << "\n";
  if (p.stats.reranked)
    print(out,
          "(picked by the simulated step: the cost model's own pick, predicted %s, simulates "
          "to %s; this plan to %s; --rank-by-cost keeps the cost model's)\n",
          synth::seconds_text(p.stats.model_pick_step).c_str(),
          synth::seconds_text(p.stats.model_pick_judged).c_str(),
          synth::seconds_text(p.stats.judged_step).c_str());
  if (o.print_graph)
    graph::print(out, g);
  if (o.explain)
    out << synth::explain(p, run.cost_model(g, run.c));
}

/// The tensor-parallel baseline of the model on two devices like device 0 of `c` (for the
/// weight-fixed shares, train/profile.hpp); none where that baseline finds no plan.
[[nodiscard]] inline std::optional<synth::plan>
weight_splitting_plan(const graph::graph& g, const cluster& c, const synth::synth_options& so) {
  cluster two = c;
  two.devices = {c.devices.at(0), c.devices.at(0)};
  two.devices[1].name += "'";
  two.inter_node.reset();
  two.devices[1].node = two.devices[0].node;
  two.collective_costs.clear();
  synth::synth_options opt;
  opt.segments = so.segments;
  opt.search.check_memory = false; // measured on the host, one piece at a time
  opt.search.max_seconds = 1.0;
  try {
    return synth::make_baseline(g, two, synth::baseline::tp, opt);
  } catch (const plan_error&) {
    return std::nullopt;
  }
}

/// Re-balancing's state, the same on every rank but the basis (rank 0's).
struct rebalancing {
  straggler_monitor monitor;
  lp::basis basis;        ///< rank 0: the ratio LP's last basis
  double min_gain = 0.05; ///< rebalance_options::min_gain
};

/// Starts re-balancing: the plan's predictions per device, and (rank 0) the ratio LP's basis
/// for the first warm re-solve.
[[nodiscard]] inline rebalancing start_rebalancing(const graph::graph& g, const train_options& o,
                                                   const planned_run& run, const world& w) {
  const rebalance_options ro{o.rebalance, o.rebalance_window, o.rebalance_persist,
                             o.rebalance_min_gain};
  rebalancing r{
      straggler_monitor(ro, run.evaluated(g, run.plan, run.c).device_compute), {}, ro.min_gain};
  if (w.root())
    if (auto res = synth::resolve_ratios(run.plan, run.cost_model(g, run.c), run.c))
      r.basis = std::move(res->basis);
  return r;
}

/// What re-balancing needs of the engine: moving the run's state to a plan's pieces (returns
/// the slowest rank's seconds) and recording an event on the trace.
struct rebalance_hooks {
  std::function<double(const synth::plan&)> move;
  std::function<void(const std::string& name, std::chrono::steady_clock::time_point begin,
                     std::chrono::steady_clock::time_point end, const nlohmann::json& args)>
      trace;
};

/// After step `s` (0-based), with this rank's compute seconds of it: the ranks share them; when
/// the monitor sees a device off its modelled speed, rank 0 re-solves the ratios at the measured
/// speeds (warm), every rank takes that plan and `hooks.move`s its state to the new pieces.
/// Returns the report when it re-balanced. Collective.
inline std::optional<rebalance_report>
rebalance_after_step(const graph::graph& g, planned_run& run, rebalancing& rb, world& w,
                     std::size_t s, double compute_seconds, const rebalance_hooks& hooks,
                     std::ostream* out, metrics_log& metrics) {
  using clock = std::chrono::steady_clock;
  const auto factors = rb.monitor.observe(w.all_gather(compute_seconds));
  if (!factors)
    return std::nullopt;
  w.set_phase("re-balancing after step " + std::to_string(s + 1));
  const auto t0 = clock::now();
  cluster measured = measured_cluster(run.c, *factors);
  rebalance_report rep;
  rep.after_step = s + 1;
  rep.factors = *factors;
  rep.shares_before = run.plan.ratios.at(0);
  std::string text;
  if (w.root()) {
    const auto l0 = clock::now();
    auto res = synth::resolve_ratios(run.plan, run.cost_model(g, measured), measured,
                                     rb.basis.variables.empty() ? nullptr : &rb.basis);
    rep.solve_seconds = std::chrono::duration<double>(clock::now() - l0).count();
    if (res) {
      rep.lp_iterations = res->iterations;
      rep.warm = res->warm;
      rb.basis = std::move(res->basis);
      text = synth::to_json(res->p).dump();
    }
  }
  std::vector<double> facts{rep.solve_seconds, static_cast<double>(rep.lp_iterations),
                            rep.warm ? 1.0 : 0.0};
  w.broadcast(facts);
  rep.solve_seconds = facts[0];
  rep.lp_iterations = static_cast<std::size_t>(facts[1]);
  rep.warm = facts[2] != 0.0;
  w.broadcast_text(text);
  if (!w.root())
    out = nullptr;
  if (text.empty()) { // not optimal: keep the plan, measure again
    if (out != nullptr)
      print(*out,
            "re-balancing after step %zu: the ratio LP at the measured speeds is not "
            "optimal; the plan stays\n",
            s + 1);
    rb.monitor.restart(run.evaluated(g, run.plan, run.c).device_compute);
    return std::nullopt;
  }
  synth::plan next = synth::plan_from_json(nlohmann::json::parse(text), g, "re-balanced plan");
  rep.predicted_before = run.evaluated(g, run.plan, measured).step_time;
  rep.predicted_after = next.step_time;
  rep.shares_after = next.ratios.at(0);
  if (rep.predicted_after > rep.predicted_before * (1.0 - rb.min_gain)) {
    // Not worth moving state for: the plan stays, and the monitor takes these factors as its
    // baseline (only a further change triggers).
    const double gain = 1.0 - rep.predicted_after / rep.predicted_before;
    if (out != nullptr)
      print(*out,
            "re-balancing after step %zu: re-solved ratios would gain %.1f%% of the predicted "
            "step (less than %.1f%%); the plan stays\n",
            s + 1, 100.0 * gain, 100.0 * rb.min_gain);
    metrics.write(nlohmann::json{
        {"rebalance", {{"after_step", rep.after_step}, {"factors", rep.factors}, {"kept", true}}}});
    rb.monitor.keep(rep.factors);
    rb.monitor.restart(run.evaluated(g, run.plan, run.c).device_compute);
    return std::nullopt;
  }
  // Moved only when some share changes (the same ratios lower to the same pieces).
  rep.moved = next.ratios != run.plan.ratios;
  if (rep.moved)
    rep.move_seconds = hooks.move(next);
  run.c = std::move(measured);
  run.plan = std::move(next);
  run.shard_times.reset(); // measured at the old pieces
  rb.monitor.restart(run.plan.device_compute);
  rb.monitor.moved(rep.factors);
  const auto t1 = clock::now();
  nlohmann::json args{{"after_step", rep.after_step},
                      {"factors", rep.factors},
                      {"shares_before", rep.shares_before},
                      {"shares_after", rep.shares_after},
                      {"solve_ms", 1e3 * rep.solve_seconds},
                      {"lp_iterations", rep.lp_iterations},
                      {"warm", rep.warm},
                      {"move_ms", 1e3 * rep.move_seconds}};
  hooks.trace(rep.moved ? "re-balance" : "re-balance (shares unchanged)", t0, t1, args);
  metrics.write(nlohmann::json{{"rebalance", args}});
  if (out != nullptr) {
    std::size_t worst = 0;
    for (std::size_t d = 0; d < rep.factors.size(); ++d)
      if (rep.factors[d] > rep.factors[worst])
        worst = d;
    print(*out,
          "re-balanced after step %zu: %s computes %.2fx slower than the others relative to "
          "the plan; ratios re-solved in %.1f ms (%zu LP iterations%s); shares",
          s + 1, run.plan.device_names[worst].c_str(), rep.factors[worst], 1e3 * rep.solve_seconds,
          rep.lp_iterations, rep.warm ? " from the last basis" : "");
    for (std::size_t d = 0; d < rep.shares_after.size(); ++d)
      print(*out, " %s %.1f%% -> %.1f%%", run.plan.device_names[d].c_str(),
            100.0 * rep.shares_before[d], 100.0 * rep.shares_after[d]);
    if (rep.moved)
      print(*out, "; predicted step %s -> %s; state moved in %.1f ms\n",
            synth::milliseconds_text(rep.predicted_before).c_str(),
            synth::milliseconds_text(rep.predicted_after).c_str(), 1e3 * rep.move_seconds);
    else
      print(*out, " (unchanged: nothing moved)\n");
    out->flush();
  }
  return rep;
}

/// The names of the run's devices as its trace shows them (emulated slowdowns said).
[[nodiscard]] inline std::vector<std::string> trace_device_names(const cluster& c) {
  std::vector<std::string> devices;
  for (const auto& dev : c.devices)
    devices.push_back(dev.name + (dev.slowdown > 1.0
                                      ? ", emulated " + detail::times_text(dev.slowdown) + " slower"
                                      : ""));
  return devices;
}

/// "run.json" -> "run.simulated.json"
[[nodiscard]] inline std::string simulated_trace_path(const std::string& trace) {
  const auto slash = trace.find_last_of('/');
  const auto dot = trace.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash))
    return trace + ".simulated";
  return trace.substr(0, dot) + ".simulated" + trace.substr(dot);
}

/// Rank 0: writes the run's trace `t` (of `ranks` ranks) to `o.trace` and, for a one-level
/// plan's run, the simulated step's next to it (sim/step.hpp), priced as the prediction.
inline void write_traces(const nlohmann::json& t, const graph::graph& g, const train_options& o,
                         std::size_t ranks, const planned_run* one_level) {
  write_file(o.trace, t.dump());
  if (o.out != nullptr)
    print(*o.out, "trace: %zu events of %zu ranks in %s (open in ui.perfetto.dev)\n",
          t["traceEvents"].size(), ranks, o.trace.c_str());
  if (one_level == nullptr)
    return;
  const planned_run& run = *one_level;
  sim::options so = run.sim_options();
  for (std::size_t k = 0; k < run.c.size(); ++k)
    so.traced.push_back(k);
  const sim::result r = sim::simulate(run.plan, run.cost_model(g, run.c), so);
  const std::string path = simulated_trace_path(o.trace);
  write_file(
      path,
      sim::trace_of(r, so, run.c, {{"simulated", true}, {"step_seconds", r.step_time}}).dump());
  if (o.out != nullptr)
    print(*o.out, "simulated step (%s) in %s\n", synth::milliseconds_text(r.step_time).c_str(),
          path.c_str());
}

} // namespace hspmd::train

#pragma once
// hspmd-plan --pipeline: a pipeline plan of the model on the cluster (program/pipeline_plan.hpp)
// beside the one-level plan -- the model traced at the micro-batch (the batch over m), the
// devices grouped as --pipeline says (consecutive devices), each stage synthesized over its
// group, each device checked against its memory at its peak under the schedule; the stage table
// and the pipeline's simulated step (boundary sends priced on the groups' links) against the
// one-level plan's predicted step. --json then writes the pipeline plan, which the trainer's --plan
// takes.

#include <hspmd/cluster/cluster.hpp>
#include <hspmd/core/error.hpp>
#include <hspmd/models/zoo.hpp>
#include <hspmd/program/pipeline_plan.hpp>
#include <hspmd/program/pipeline_search.hpp>
#include <hspmd/program/pipeline_svg.hpp>
#include <hspmd/sim/pipeline.hpp>
#include <hspmd/synth/plan.hpp>
#include <hspmd/synth/synthesize.hpp>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace hspmd_plan {

/// What --pipeline and its options ask for.
struct pipeline_request {
  std::string groups; ///< "P", the groups' sizes, or "auto" (the depth chosen); empty: none
  /// "auto": 1F1B, and with the depth chosen ZB-H1 too where faster; or one of the schedules.
  std::string schedule = "auto";
  std::size_t micro = 0;                 ///< m; 0: four per stage
  std::vector<std::size_t> first_blocks; ///< each stage's first block (empty: balanced cuts)
  std::size_t chunks = 1;
  std::string block_prefix = "layers.";
  std::string svg_out;     ///< where to draw the stage layout (empty: nowhere)
  bool simulate = false;   ///< also simulate the stages device by device (sim/pipeline.hpp)
  std::size_t threads = 0; ///< candidates planned at once under auto (0: the hardware's)
  /// "auto": stages on groups of whole nodes may run two-level programs (program/two_level_
  /// stage.hpp; the search tries both); "one-level": one program over each group.
  std::string stage_programs = "auto";
};

/// The pipeline plan `r` asks for on `c` (the search's table printed when `print`), and how long
/// planning it took.
struct chosen_pipeline {
  hspmd::program::pipeline_plan plan;
  double seconds = 0.0;
};
inline chosen_pipeline choose_pipeline_plan(const pipeline_request& r, const std::string& model,
                                            const hspmd::models::model_options& mo,
                                            std::size_t batch, const hspmd::cluster& c,
                                            const hspmd::synth::synth_options& so, bool print) {
  namespace program = hspmd::program;
  program::pipeline_options po;
  po.schedule = program::parse_schedule(r.schedule == "auto" ? "1f1b" : r.schedule);
  po.choose_schedule = r.schedule == "auto" && r.groups == "auto";
  po.chunks = r.chunks;
  po.synth = so;
  po.model = model;
  po.block_prefix = r.block_prefix;
  po.threads = r.threads;
  if (r.stage_programs != "auto" && r.stage_programs != "one-level")
    throw hspmd::config_error("--stage-programs " + r.stage_programs, "is not auto or one-level",
                              "give auto (two-level programs where a group spans whole nodes) or "
                              "one-level");
  po.two_level = r.stage_programs == "auto";
  const auto trace_at = [&](std::size_t rows) {
    return hspmd::models::trace_model<float>(model, mo, rows);
  };
  po.trace = trace_at;
  const auto t0 = std::chrono::steady_clock::now();
  program::pipeline_plan p;
  if (r.groups == "auto") {
    if (!r.first_blocks.empty())
      throw hspmd::config_error("--first-blocks with --pipeline auto",
                                "the depth and its cuts are chosen with it",
                                "drop --first-blocks, or give --pipeline the groups");
    if (r.micro != 0)
      throw hspmd::config_error("--micro with --pipeline auto",
                                "the depth's micro-batches are chosen with it (4 a stage)",
                                "drop --micro, or give --pipeline the groups");
    const program::pipeline_choice ch =
        program::choose_pipeline(trace_at, batch, c, po, hspmd::sim::pipeline_costs);
    if (!ch.best)
      throw hspmd::plan_error("--pipeline auto", "no pipeline depth could be planned (above)",
                              "give the groups, or a model with more blocks");
    if (!print)
      return {*ch.tried[*ch.best].plan,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
    std::printf("\npipelines tried (%s; groups: equal = as many devices each, speed = whole "
                "nodes of equal summed speed, pipeline-only = equal groups, even cuts, DP-EV "
                "inside):\n",
                r.schedule.c_str());
    std::printf("%-7s %-14s %-6s %12s %8s %12s %8s %10s %11s  %s\n", "stages", "groups", "m",
                "predicted", "bubble", "simulated", "bubble", "imbalance", "planned in",
                "group sizes");
    for (const program::pipeline_candidate& k : ch.tried) {
      std::string sizes;
      for (std::size_t x = 0; x < k.group_sizes.size() && x < 8; ++x)
        sizes += (x > 0 ? "," : "") + std::to_string(k.group_sizes[x]);
      if (k.group_sizes.size() > 8)
        sizes += ",...";
      const std::string how = std::string(program::name(k.groups)) + (k.two_level ? " 2L" : "");
      if (k.plan)
        std::printf("%-7zu %-14s %-6zu %12s %7.1f%% %12s %7.1f%% %9.3fx %9.3f s  %s\n", k.stages,
                    how.c_str(), k.micro, hspmd::synth::seconds_text(k.step).c_str(),
                    100.0 * k.bubble, hspmd::synth::seconds_text(k.simulated).c_str(),
                    100.0 * k.simulated_bubble, k.imbalance, k.seconds, sizes.c_str());
      else
        std::printf("%-7zu %-14s %-6zu %12s %8s %12s %8s %10s %9.3f s  %s: %s\n", k.stages,
                    how.c_str(), k.micro, "-", "-", "-", "-", "-", k.seconds, sizes.c_str(),
                    k.refused.c_str());
    }
    std::printf("(%zu stage plans synthesized, %zu reused for a stage that was the same "
                "problem)\n",
                ch.stage_plans_made, ch.stage_plans_reused);
    const program::pipeline_candidate* only = nullptr; // the fastest pipeline-only baseline
    for (const program::pipeline_candidate& k : ch.tried)
      if (k.plan && k.groups == program::grouping::pipeline_only &&
          (!only || k.simulated < only->simulated))
        only = &k;
    if (ch.best && only)
      std::printf("chosen: %zu stages grouped by %s, %zu micro-batches, %s: %.2fx the fastest "
                  "pipeline-only baseline (%zu stages, %s), simulated\n",
                  ch.tried[*ch.best].stages,
                  (std::string(program::name(ch.tried[*ch.best].groups)) +
                   (ch.tried[*ch.best].two_level ? " (two-level stages)" : ""))
                      .c_str(),
                  ch.tried[*ch.best].micro,
                  std::string(program::name(ch.tried[*ch.best].plan->schedule)).c_str(),
                  only->simulated / ch.tried[*ch.best].simulated, only->stages,
                  hspmd::synth::seconds_text(only->simulated).c_str());
    p = *ch.tried[*ch.best].plan;
  } else {
    po.group_sizes = program::parse_group_sizes("--pipeline", r.groups, c.size());
    po.micro = r.micro != 0 ? r.micro : 4 * po.group_sizes.size() * r.chunks;
    if (batch % po.micro != 0)
      throw hspmd::config_error("--micro " + std::to_string(po.micro),
                                "does not divide the batch of " + std::to_string(batch),
                                "give a batch of m equal micro-batches (--batch)");
    po.rows = batch / po.micro;
    po.first_blocks = r.first_blocks;
    p = program::make_pipeline_plan(trace_at(batch / po.micro), c, po);
  }
  return {std::move(p),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

/// --what-if with --pipeline: the pipeline planned again on `changed` (the same request: the
/// depth searched again under auto, the same group sizes otherwise) beside `before`, planned on
/// `c`; with as many devices as before, also the old plan (its stages, cuts and programs) on the
/// changed devices. Both predicted and simulated device by device.
inline void what_if_pipeline(const pipeline_request& r, const std::string& model,
                             const hspmd::models::model_options& mo, std::size_t batch,
                             const hspmd::cluster& c, const hspmd::cluster& changed,
                             const hspmd::synth::synth_options& so,
                             const hspmd::program::pipeline_plan& before,
                             const hspmd::graph::graph& micro) {
  namespace program = hspmd::program;
  using hspmd::synth::seconds_text;
  const auto trace_at = [&](std::size_t rows) {
    return hspmd::models::trace_model<float>(model, mo, rows);
  };
  const auto steps = [&](const program::pipeline_plan& p, const hspmd::graph::graph& g,
                         const hspmd::cluster& on) {
    return std::pair{
        program::simulate(p.make(), program::predicted_costs(p, g, on)).step,
        program::simulate(p.make(), hspmd::sim::pipeline_costs(p, g, on, trace_at)).step};
  };
  const auto shape = [](const program::pipeline_plan& p) {
    return std::to_string(p.stages.size()) + " stages on " + std::to_string(p.devices()) +
           " groups, " + std::to_string(p.micro) + " micro-batches";
  };
  const auto [pred0, sim0] = steps(before, micro, c);
  std::printf("\nwhat if (pipeline): %s (%zu devices -> %zu)\n", changed.description.c_str(),
              c.size(), changed.size());
  std::printf("%-22s %14s %14s  %s\n", "", "predicted", "simulated", "plan");
  std::printf("%-22s %14s %14s  %s\n", "before", seconds_text(pred0).c_str(),
              seconds_text(sim0).c_str(), shape(before).c_str());
  try {
    const chosen_pipeline after = choose_pipeline_plan(r, model, mo, batch, changed, so, false);
    const auto g = hspmd::models::trace_model<float>(model, mo, batch / after.plan.micro);
    const auto [pred1, sim1] = steps(after.plan, g, changed);
    std::printf("%-22s %14s %14s  %s; planned again in %.3f s (%+.1f %% simulated)\n",
                "after, planned again", seconds_text(pred1).c_str(), seconds_text(sim1).c_str(),
                shape(after.plan).c_str(), after.seconds, 100.0 * (sim1 / sim0 - 1.0));
  } catch (const hspmd::plan_error& e) {
    std::printf("%-22s no pipeline plan: %s\n", "after, planned again", e.what());
  } catch (const hspmd::config_error& e) {
    std::printf("%-22s no pipeline plan: %s\n", "after, planned again", e.what());
  }
  if (changed.size() == c.size()) {
    const auto [pred2, sim2] = steps(before, micro, changed);
    std::printf("%-22s %14s %14s  the old stages, cuts and programs on the changed devices\n",
                "after, old plan", seconds_text(pred2).c_str(), seconds_text(sim2).c_str());
  }
}

/// Plans, prints and (with `json_out`) writes the pipeline plan of `model` (options `mo`) at
/// `batch` rows a step on `c`; `one_level` (may be null): the one-level plan to compare with;
/// `changed` (may be null): the cluster a --what-if makes, planned again and compared.
inline void plan_pipeline(const pipeline_request& r, const std::string& model,
                          const hspmd::models::model_options& mo, std::size_t batch,
                          const hspmd::cluster& c, const hspmd::synth::synth_options& so,
                          const hspmd::synth::plan* one_level, const std::string& json_out,
                          bool explain, const hspmd::cluster* changed = nullptr) {
  namespace program = hspmd::program;
  const auto trace_at = [&](std::size_t rows) {
    return hspmd::models::trace_model<float>(model, mo, rows);
  };
  const chosen_pipeline chosen = choose_pipeline_plan(r, model, mo, batch, c, so, true);
  const program::pipeline_plan& p = chosen.plan;
  const double took = chosen.seconds;
  const hspmd::graph::graph micro = trace_at(batch / p.micro);
  const program::pipeline_timeline t =
      program::simulate(p.make(), program::predicted_costs(p, micro, c));
  std::printf("\npipeline plan: %zu stages on %zu groups, %s, %zu micro-batches of %zu rows; "
              "planned in %.3f s\n",
              p.stages.size(), p.devices(), std::string(program::name(p.schedule)).c_str(), p.micro,
              batch / p.micro, took);
  char vs[32] = "-";
  if (one_level != nullptr)
    std::snprintf(vs, sizeof vs, "%.2fx", one_level->step_time / t.step);
  std::printf("%-8s %14s %10s %10s\n", "plan", "step time", "bubble", "vs synth");
  std::printf("%-8s %14s %9.1f%% %10s\n", "pipeline", hspmd::synth::seconds_text(t.step).c_str(),
              100.0 * t.bubble, vs);
  if (r.simulate) {
    const auto t1 = std::chrono::steady_clock::now();
    const program::pipeline_timeline ts =
        program::simulate(p.make(), hspmd::sim::pipeline_costs(p, micro, c, trace_at));
    char svs[32] = "-";
    if (one_level != nullptr)
      std::snprintf(svs, sizeof svs, "%.2fx", one_level->step_time / ts.step);
    std::printf("%-8s %14s %9.1f%% %10s  (simulated device by device: %.3f s, %+.1f %% of the "
                "predicted)\n",
                "sim", hspmd::synth::seconds_text(ts.step).c_str(), 100.0 * ts.bubble, svs,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count(),
                100.0 * (ts.step / t.step - 1.0));
  }
  std::printf("(step: the schedule simulated over the stage plans' predicted passes and boundary "
              "sends%s; vs synth: the one-level plan's predicted step over it)\n",
              r.simulate ? "; sim: over each stage's micro-batch step simulated device by device "
                           "(sim/pipeline.hpp)"
                         : "");
  if (explain)
    std::cout << "\n" << program::explain(p, micro, c);
  if (!r.svg_out.empty()) {
    std::ofstream f(r.svg_out);
    f << program::layout_svg(p, micro, c);
    if (!f)
      throw hspmd::config_error("--svg " + r.svg_out, "cannot write", "a writable path");
    std::printf("stage layout drawn in %s\n", r.svg_out.c_str());
  }
  if (!json_out.empty()) {
    std::ofstream f(json_out);
    f << program::to_json(p).dump(1) << "\n";
    if (!f)
      throw hspmd::config_error(json_out, "cannot write", "a writable path");
    std::printf("pipeline plan written to %s (hash %016llx)\n", json_out.c_str(),
                static_cast<unsigned long long>(p.hash()));
  }
  if (changed != nullptr)
    what_if_pipeline(r, model, mo, batch, c, *changed, so, p, micro);
}

} // namespace hspmd_plan

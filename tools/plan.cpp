// hspmd-plan: synthesize the distributed program of a model on a cluster, without MPI, and
// compare it with the baselines (DP-EV, DP-CP, TP) built by the same machinery.
//   hspmd-plan --model bert --cluster clusters/hap-testbed.json
//   hspmd-plan --model vgg19 --cluster clusters/mixed-8.json --explain --json plan.json
//   hspmd-plan --graph my_model.json --cluster clusters/emulated-3.json   # any traced model
//   hspmd-plan --model llama-7b --cluster big.json --hierarchical  # also the two-level plan
//   hspmd-plan --model bert --cluster clusters/emulated-2.json --simulate --trace sim.json
//   hspmd-plan --model bert --cluster clusters/mixed-8.json --what-if "slow gpu7 x2"
//   hspmd-plan --model llama --cluster clusters/mixed-8.json --pipeline 4 --micro 16 --explain
#include <hspmd/cluster/cluster_file.hpp>
#include <hspmd/graph/io.hpp>
#include <hspmd/io/cli.hpp>
#include <hspmd/io/json_input.hpp>
#include <hspmd/models/zoo.hpp>
#include <hspmd/sim/gantt_svg.hpp>
#include <hspmd/sim/step.hpp>
#include <hspmd/sim/what_if.hpp>
#include <hspmd/synth/hierarchical.hpp>
#include <hspmd/synth/plan_svg.hpp>
#include <hspmd/synth/synthesize.hpp>

#include "plan_pipeline.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

namespace {

// "1.42x"
std::string times(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2fx", x);
  return b;
}

std::string seconds(double s) {
  return hspmd::synth::seconds_text(s);
}

// Simulates one step of the synthesized plan and the baselines and prints them next to the
// cost model's predictions; writes the synthesized plan's simulated trace to `trace_file`.
void print_simulation(const hspmd::graph::graph& g, const hspmd::cluster& c,
                      const hspmd::synth::synth_options& so, const hspmd::synth::plan& plan,
                      const std::vector<hspmd::synth::plan>& baselines,
                      const std::string& trace_file, const std::string& gantt_file,
                      const std::vector<std::string>& gantt_devices) {
  const hspmd::synth::cost_model m(g, c, hspmd::synth::segment_map(g, so.segments), std::nullopt,
                                   so.gemm_type);
  std::printf("\nsimulated step (device by device in the executor's order, whole shards, "
              "gradient buckets in flight; overlap %.2f):\n",
              c.overlap);
  std::printf("%-8s %14s %14s %8s %14s %s\n", "plan", "cost model", "simulated", "sim/cm",
              "grad exposed",
              "slowest device: computing (held by buckets) / collectives / waiting");
  hspmd::sim::options o;
  for (const std::string& name : gantt_devices) {
    const auto it = std::ranges::find(c.devices, name, &hspmd::device_spec::name);
    if (it == c.devices.end())
      throw hspmd::config_error("--gantt-devices " + name, "names no device of " + c.name,
                                "name devices of the cluster file, comma-separated");
    o.traced.push_back(static_cast<std::size_t>(it - c.devices.begin()));
  }
  if ((!trace_file.empty() || !gantt_file.empty()) && gantt_devices.empty()) {
    if (c.size() <= 16) {
      for (std::size_t d = 0; d < c.size(); ++d)
        o.traced.push_back(d);
    } else {
      std::vector<std::string> kinds;
      for (std::size_t d = 0; d < c.size(); ++d)
        if (std::ranges::find(kinds, c.devices[d].kind) == kinds.end()) {
          kinds.push_back(c.devices[d].kind);
          o.traced.push_back(d);
        }
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  const hspmd::sim::result first = hspmd::sim::simulate(plan, m);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto row = [&](const hspmd::synth::plan& p, const hspmd::sim::result& r) {
    std::printf("%-8s %14s %14s %7.2fx %14s %s: %s (%s) / %s / %s\n", p.strategy.c_str(),
                seconds(p.step_time).c_str(), seconds(r.step_time).c_str(),
                r.step_time / p.step_time, seconds(r.gradient_exposed).c_str(),
                c.devices[r.slowest].name.c_str(), seconds(r.compute[r.slowest]).c_str(),
                seconds(r.held[r.slowest]).c_str(), seconds(r.communication[r.slowest]).c_str(),
                seconds(r.waiting[r.slowest]).c_str());
  };
  row(plan, first);
  for (const auto& b : baselines)
    row(b, hspmd::sim::simulate(b, m));
  std::printf("(one simulated step of %zu devices: %.3f s)\n", c.size(), took);
  if (trace_file.empty() && gantt_file.empty())
    return;
  if (gantt_devices.empty() && c.size() > 16 &&
      std::ranges::find(o.traced, first.slowest) == o.traced.end())
    o.traced.push_back(first.slowest);
  const hspmd::sim::result traced = hspmd::sim::simulate(plan, m, o);
  const nlohmann::json trace = hspmd::sim::trace_of(traced, o, c,
                                                    {{"simulated", true},
                                                     {"plan", plan.strategy},
                                                     {"model", plan.model},
                                                     {"cluster", c.name},
                                                     {"step_seconds", traced.step_time}});
  if (!trace_file.empty()) {
    std::ofstream f(trace_file);
    f << trace.dump() << "\n";
    if (!f)
      throw hspmd::config_error(trace_file, "cannot write", "a writable path");
    std::printf("simulated trace of %s written to %s (%zu device(s))\n", plan.strategy.c_str(),
                trace_file.c_str(), o.traced.size());
  }
  if (!gantt_file.empty()) {
    std::ofstream f(gantt_file);
    f << hspmd::sim::gantt_svg(trace, plan.model + " on " + c.name + ": the " + plan.strategy +
                                          " plan's simulated step, " +
                                          hspmd::synth::seconds_text(traced.step_time));
    if (!f)
      throw hspmd::config_error("--gantt " + gantt_file, "cannot be written",
                                "give a path in a writable directory");
    std::printf("simulated step drawn in %s (%zu device(s))\n", gantt_file.c_str(),
                o.traced.size());
  }
}

// Shares per device kind, "h100 2.1-2.3%, t4 0.4%".
std::string shares_by_kind(const hspmd::synth::plan& p, const hspmd::cluster& c) {
  std::vector<std::string> kinds;
  std::vector<std::pair<double, double>> range;
  for (std::size_t d = 0; d < c.size(); ++d) {
    const double r = 100.0 * p.ratios.at(0).at(d);
    const auto it = std::ranges::find(kinds, c.devices[d].kind);
    if (it == kinds.end()) {
      kinds.push_back(c.devices[d].kind);
      range.emplace_back(r, r);
    } else {
      auto& [lo, hi] = range[static_cast<std::size_t>(it - kinds.begin())];
      lo = std::min(lo, r);
      hi = std::max(hi, r);
    }
  }
  std::string out;
  char buf[96];
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    const auto [lo, hi] = range[k];
    if (hi - lo <= 1e-3 * hi)
      std::snprintf(buf, sizeof buf, "%s %.3g%%", kinds[k].c_str(), hi);
    else
      std::snprintf(buf, sizeof buf, "%s %.3g-%.3g%%", kinds[k].c_str(), lo, hi);
    out += (k == 0 ? "" : ", ") + std::string(buf);
  }
  return out;
}

void print_what_if(const hspmd::sim::what_if_answer& a, const hspmd::cluster& c) {
  const auto& b = a.before;
  const auto& n = a.after;
  const auto pct = [](double from, double to) { return 100.0 * (to - from) / from; };
  std::printf("\nwhat if: %s (%zu devices -> %zu); answered in %.3f s\n",
              a.changed.description.c_str(), b.device_names.size(), a.changed.size(), a.seconds);
  std::printf("%-14s %14s %14s %9s\n", "", "before", "after", "change");
  std::printf("%-14s %14s %14s %+8.1f%%\n", "step time", seconds(b.step_time).c_str(),
              seconds(n.step_time).c_str(), pct(b.step_time, n.step_time));
  std::printf("%-14s %14s %14s %+8.1f%%\n", "simulated",
              seconds(a.simulated_before.step_time).c_str(),
              seconds(a.simulated_after.step_time).c_str(),
              pct(a.simulated_before.step_time, a.simulated_after.step_time));
  std::printf("%-14s %14s %14s\n", "compute", seconds(b.compute_time).c_str(),
              seconds(n.compute_time).c_str());
  std::printf("%-14s %14s %14s\n", "communication", seconds(b.comm_time).c_str(),
              seconds(n.comm_time).c_str());
  const auto program = [](const hspmd::synth::plan& p) {
    std::size_t split = 0;
    std::size_t collectives = 0;
    for (const auto& s : p.steps) {
      split += s.rule.out.is_split() ? 1U : 0U;
      for (const auto& t : s.transfers)
        collectives += t.kind != hspmd::synth::transfer_kind::load ? 1U : 0U;
    }
    return std::to_string(split) + " of " + std::to_string(p.steps.size()) + " ops split, " +
           std::to_string(collectives) + " collectives" + (p.recompute ? ", recomputed" : "");
  };
  const bool same = std::ranges::equal(b.steps, n.steps, [](const auto& x, const auto& y) {
    return x.node == y.node && x.rule == y.rule && x.transfers == y.transfers;
  });
  std::printf("program before: %s\nprogram after:  %s%s\n", program(b).c_str(), program(n).c_str(),
              same ? " (the same program)" : "");
  std::printf("shares before: %s\n", shares_by_kind(b, c).c_str());
  std::printf("shares after:  %s\n", shares_by_kind(n, a.changed).c_str());
  std::printf("bottleneck before: %s\n",
              b.binding.empty() ? "(none recorded)" : b.binding.front().c_str());
  std::printf("bottleneck after:  %s\n",
              n.binding.empty() ? "(none recorded)" : n.binding.front().c_str());
  if (a.rebalanced)
    std::printf("the old program re-balanced only (its ratio LP re-solved): %s (%+.1f%%)\n",
                seconds(a.rebalanced->step_time).c_str(),
                pct(b.step_time, a.rebalanced->step_time));
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"hspmd-plan: synthesize a distributed training program for a model on a cluster "
               "and compare it with data-parallel (even and speed-proportional) and tensor-"
               "parallel baselines. Times are the cost model's predictions per training step."};
  std::string model = "bert";
  std::string graph_file;
  std::string cluster_file;
  std::size_t batch = 0;
  std::size_t per_device = 32;
  hspmd::models::model_options mo;
  std::string json_out;
  bool explain = false;
  bool no_baselines = false;
  bool hierarchical = false;
  bool simulate = false;
  bool rank_by_cost = false;
  std::string trace_file;
  std::string gantt_file;
  std::vector<std::string> gantt_devices;
  std::vector<std::string> what_if;
  std::string segments = "one";
  hspmd::synth::synth_options so;
  hspmd_plan::pipeline_request pr;
  std::string list;
  for (auto n : hspmd::models::model_names)
    list += (list.empty() ? "" : ", ") + std::string(n);
  list += "; or a preset of their sizes:";
  for (const auto& p : hspmd::models::model_presets)
    list += " " + std::string(p.name);
  auto* model_flag = app.add_option("--model", model, "model: " + list)->capture_default_str();
  app.add_option("--graph", graph_file,
                 "plan any traced model instead: a graph JSON file (train_options::save_graph, "
                 "--save-graph of the examples, or graph::to_json); its batch is fixed")
      ->excludes(model_flag);
  app.add_option("--cluster", cluster_file, "cluster file (see docs/cluster-file.md)")->required();
  // (a size given is 1 or more: 0 is what a size left out reads as, its preset's)
  app.add_option("--batch", batch, "global batch (default: --per-device times the devices)")
      ->check(hspmd::io::at_least_one);
  app.add_option("--per-device", per_device, "samples per device when --batch is not given")
      ->capture_default_str();
  app.add_option("--layers", mo.layers,
                 "transformer layers (bert, bert-moe, vit; default 12) or "
                 "hidden layers (mlp; default 2)")
      ->check(hspmd::io::at_least_one);
  app.add_option("--hidden", mo.hidden, "hidden size (default 768; mlp 1024)")
      ->check(hspmd::io::at_least_one);
  app.add_option("--ffn", mo.ffn, "feed-forward size (default 4 x hidden; llama 8/3 x hidden)")
      ->check(hspmd::io::at_least_one);
  app.add_option("--heads", mo.heads, "attention heads (default hidden / 64)")
      ->check(hspmd::io::at_least_one);
  app.add_option("--kv-heads", mo.kv_heads,
                 "llama: key/value heads, fewer than --heads for grouped-query attention "
                 "(default one per head; llama-70b: 8)")
      ->check(hspmd::io::at_least_one);
  app.add_option("--seq", mo.seq, "sequence length (bert, bert-moe; default 128)")
      ->check(hspmd::io::at_least_one);
  app.add_option("--vocab", mo.vocab, "vocabulary (bert, bert-moe, llama; default 30522)")
      ->check(hspmd::io::at_least_one);
  app.add_option("--experts", mo.experts, "experts per MoE layer (bert-moe; default 8)")
      ->check(hspmd::io::at_least_one);
  app.add_option("--width", mo.width, "channel multiplier (vgg19)")->capture_default_str();
  app.add_flag("--fused-attention", mo.fused_attention,
               "llama, bert: attention as one fused op that keeps no scores (on for the llama "
               "presets and gpt3-175b)");
  app.add_option("--segments", segments,
                 "ratio vectors: one (every split shares the batch's) or batch-model")
      ->capture_default_str()
      ->check(CLI::IsMember({"one", "batch-model"}));
  app.add_option("--max-expansions", so.search.max_expansions,
                 "A* states expanded before returning the best plan found with its gap")
      ->capture_default_str();
  app.add_option("--max-seconds", so.search.max_seconds, "A* time budget per search")
      ->capture_default_str();
  double baseline_seconds = 1.0;
  app.add_option("--baseline-seconds", baseline_seconds,
                 "A* time budget per search of a baseline (each reports its planning time, and "
                 "when the budget ended its search: the baselines are yardsticks, not the plan)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  std::string sharding = "auto";
  app.add_option("--shard-parameters", sharding,
                 "keep parameters (with gradients and optimizer state) split and all-gather them "
                 "before use, FSDP-style: auto (when nothing fits otherwise), never, always")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "never", "always"}));
  std::string recompute = "auto";
  app.add_option("--recompute", recompute,
                 "recompute each block's activations in the backward instead of keeping them "
                 "(priced: one more forward of the blocks, one block's activations at a time): "
                 "auto (when nothing fits otherwise), never, always")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "never", "always"}));
  std::string precision = "f32";
  app.add_option("--precision", precision,
                 "the run's precision: bf16 or f16 prices GEMMs at each device's bf16_speed "
                 "(mixed precision, --precision of the trainer)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  app.add_option("--json", json_out, "write the synthesized plan as JSON to this file");
  app.add_flag("--explain", explain,
               "print the plan as a table (ops, placements, collectives, "
               "per-device time and memory, binding LP rows)");
  app.add_flag("--no-baselines", no_baselines, "synthesize only");
  app.add_flag("--rank-by-cost", rank_by_cost,
               "pick the synthesized plan by the cost model alone (default: its final candidates "
               "are weighed by the simulated step too, as the trainer does)");
  app.add_flag("--hierarchical", hierarchical,
               "also synthesize the two-level plan (a program inside each node, the batch split "
               "across nodes) and compare");
  app.add_flag("--simulate", simulate,
               "also simulate one step of each plan device by device (sim/step.hpp: the "
               "executor's order, whole shards, gradient buckets in flight) next to the cost "
               "model's prediction");
  app.add_option("--trace", trace_file,
                 "with --simulate: write the synthesized plan's simulated step as a trace (the "
                 "format of the trainer's --trace; every device up to 16, else the first of each "
                 "kind and the slowest)");
  app.add_option("--gantt", gantt_file,
                 "with --simulate: draw the synthesized plan's simulated step as a Gantt chart "
                 "(SVG) of --trace's devices or --gantt-devices");
  app.add_option("--gantt-devices", gantt_devices,
                 "with --gantt or --trace: the devices drawn, by name")
      ->delimiter(',');
  app.add_option("--what-if", what_if,
                 "plan again on the cluster changed so, and compare: \"add 2 x a100\" (copies "
                 "of a device kind), \"remove node 3\", \"remove gpu7\", \"slow gpu7 x2\" "
                 "(repeat the flag to change several things); with --pipeline the pipeline is "
                 "planned again too");
  app.add_option("--pipeline", pr.groups,
                 "also plan a pipeline: P equal groups of consecutive devices, the groups' sizes "
                 "(2,1,1), or auto (the fastest of 2, 4, 8, ... groups of as many devices or "
                 "of equal summed speed, beside the pipeline-only baseline); each stage "
                 "synthesized over its group (--json writes it)");
  app.add_option("--svg", pr.svg_out,
                 "draw the plan as an SVG file: each segment's shares by device kind, each "
                 "device's predicted compute and memory, the predicted step, every op's "
                 "placement and collectives (synth/plan_svg.hpp); with --pipeline the pipeline "
                 "plan's stage layout (groups' devices by kind down, blocks across, each "
                 "stage's pass, in-flight count and shares)");
  app.add_option("--plan-threads", pr.threads,
                 "with --pipeline auto: candidates planned at once (0: as many as the hardware "
                 "runs; the pick is the same for every count)")
      ->capture_default_str();
  app.add_option("--stage-programs", pr.stage_programs,
                 "with --pipeline: auto (a stage whose group spans whole nodes may run a "
                 "two-level program: a program inside each node, its gradients all-reduced "
                 "across the nodes once a step; planned and simulated, not run by the pipeline "
                 "executor yet) or one-level (one program over each group)")
      ->check(CLI::IsMember({"auto", "one-level"}))
      ->capture_default_str();
  app.add_option("--micro", pr.micro, "with --pipeline: micro-batches a step (default 4 a stage)");
  app.add_option("--first-blocks", pr.first_blocks,
                 "with --pipeline P or the groups' sizes: each stage's first block, e.g. 0,12 "
                 "(default: cut on the groups' speeds)")
      ->delimiter(',');
  app.add_option("--pipeline-schedule", pr.schedule,
                 "with --pipeline: gpipe, 1f1b, interleaved, zb, or auto (1f1b; with --pipeline "
                 "auto, zb where that is faster)")
      ->capture_default_str();
  app.add_option("--pipeline-chunks", pr.chunks, "with --pipeline: stages a group (interleaved)")
      ->capture_default_str();
  app.add_option("--block-prefix", pr.block_prefix,
                 "with --pipeline: the name prefix of the model's blocks, where stages may start")
      ->capture_default_str();
  if (const auto rc = hspmd::io::parse_flags(app, argc, argv))
    return *rc;
  try {
    if (!pr.groups.empty() && !graph_file.empty())
      throw hspmd::config_error("--pipeline", "traces the model at the micro-batch",
                                "use --model instead of --graph");
    if (!trace_file.empty() && !simulate)
      throw hspmd::config_error("--trace", "writes the simulated step", "add --simulate");
    if (!gantt_file.empty() && !simulate)
      throw hspmd::config_error("--gantt", "draws the simulated step", "add --simulate");
    so.segments = segments == "one" ? hspmd::synth::segment_policy::one
                                    : hspmd::synth::segment_policy::batch_and_model;
    using sharding_mode = hspmd::synth::search_options::parameter_sharding;
    so.search.shard_parameters = sharding == "never"    ? sharding_mode::never
                                 : sharding == "always" ? sharding_mode::always
                                                        : sharding_mode::when_needed;
    using recompute_mode = hspmd::synth::search_options::recomputation;
    so.search.recompute = recompute == "never"    ? recompute_mode::never
                          : recompute == "always" ? recompute_mode::always
                                                  : recompute_mode::when_needed;
    so.gemm_type = precision == "bf16"  ? hspmd::dtype::bf16
                   : precision == "f16" ? hspmd::dtype::f16
                                        : hspmd::dtype::f32;
    if (!rank_by_cost)
      so.judge = hspmd::sim::judge();
    const hspmd::cluster c = hspmd::load_cluster(cluster_file);
    // A change that cannot apply fails before the synthesis, not after.
    const std::optional<hspmd::cluster> changed =
        what_if.empty() ? std::nullopt : std::optional(hspmd::sim::apply_all(c, what_if));
    const auto t0 = std::chrono::steady_clock::now();
    hspmd::graph::graph g;
    if (!graph_file.empty()) {
      if (batch != 0)
        throw hspmd::config_error("--batch", "a graph file's batch is fixed when it was traced",
                                  "drop --batch, or save the graph again with another batch");
      g = hspmd::graph::from_json(
          hspmd::io::parse_json_strict(hspmd::io::read_text_file(graph_file),
                                       hspmd::io::json_source(graph_file),
                                       "a graph written by hspmd"),
          graph_file);
      model = std::filesystem::path(graph_file).stem().string();
      for (const auto& n : g.nodes())
        if (n.kind == hspmd::graph::op::input && n.out.batch_dim) {
          batch = n.out.dims[*n.out.batch_dim];
          break;
        }
    } else {
      if (batch == 0)
        batch = per_device * c.size();
      g = hspmd::models::trace_model<float>(model, mo, batch);
    }
    if (hierarchical && !graph_file.empty())
      throw hspmd::config_error("--hierarchical", "needs the model traced per node batch",
                                "use --model instead of --graph");
    const auto t1 = std::chrono::steady_clock::now();
    // With --hierarchical a one-level plan that does not fit is reported, not fatal.
    hspmd::synth::plan plan;
    std::string one_level_error;
    try {
      plan = hspmd::synth::synthesize(g, c, so, model);
    } catch (const hspmd::plan_error& e) {
      if (!hierarchical && pr.groups.empty() && c.nodes().size() > 1)
        throw hspmd::plan_error(
            e.where(), e.reason(),
            (e.fix().empty() ? std::string() : e.fix() + "; or ") +
                "plan two levels with --hierarchical (a program inside each node, the batch "
                "across nodes; nodes too small for a row sit out)");
      if (!hierarchical && pr.groups.empty())
        throw;
      one_level_error = e.what();
    }
    const auto t2 = std::chrono::steady_clock::now();
    const auto total = hspmd::graph::total_cost(g);
    std::printf("model %s, batch %zu: %zu graph nodes, %.1f GFLOP per step; traced in %.3f s\n",
                model.c_str(), batch, g.size(), (total.forward_flops + total.backward_flops) / 1e9,
                std::chrono::duration<double>(t1 - t0).count());
    std::printf("cluster %s: %zu devices on %zu node(s); compute priced %s\n", c.name.c_str(),
                c.size(), c.nodes().size(),
                c.devices.front().has_rates()
                    ? "per op class (gemm, elementwise, softmax, optimizer rates)"
                    : "at each device's speed");
    if (!one_level_error.empty())
      std::printf("one-level synthesis: no plan: %s\n", one_level_error.c_str());
    else
      std::printf("synthesis: %.3f s (search %.3f s in %zu round(s), %zu states expanded; LP "
                  "%.3f s)%s%s%s\n",
                  std::chrono::duration<double>(t2 - t1).count(), plan.stats.search_seconds,
                  plan.stats.rounds, plan.stats.expanded, plan.stats.lp_seconds,
                  plan.stats.optimal ? ""
                                     : (", budget reached: within " +
                                        std::to_string(100.0 * plan.stats.gap) + "% of optimal")
                                           .c_str(),
                  plan.stats.fsdp_fallback
                      ? "\n  (nothing fitted in the full search: the plan is data parallel with "
                        "sharded parameters, FSDP, searched in that space)"
                      : "",
                  plan.recompute ? "\n  (activations recomputed: each block's made again in the "
                                   "backward, one block's held at a time)"
                                 : "");
    if (one_level_error.empty() && plan.stats.judged > 0) {
      if (plan.stats.reranked)
        std::printf("  (weighed by the simulated step: the cost model's pick, %s predicted, "
                    "simulates to %s; this plan simulates to %s, so it is picked)\n",
                    seconds(plan.stats.model_pick_step).c_str(),
                    seconds(plan.stats.model_pick_judged).c_str(),
                    seconds(plan.stats.judged_step).c_str());
      else
        std::printf("  (%zu other candidates weighed by the simulated step: the cost model's pick "
                    "stands, simulated %s)\n",
                    plan.stats.judged, seconds(plan.stats.judged_step).c_str());
    }
    std::printf("\n%-8s %14s %14s %14s %10s\n", "plan", "step time", "compute", "comm", "speedup");
    if (one_level_error.empty())
      std::printf("%-8s %14s %14s %14s %10s\n", "synth", seconds(plan.step_time).c_str(),
                  seconds(plan.compute_time).c_str(), seconds(plan.comm_time).c_str(), "");
    std::vector<hspmd::synth::plan> baselines;
    if (!no_baselines)
      for (auto b : {hspmd::synth::baseline::dp_ev, hspmd::synth::baseline::dp_cp,
                     hspmd::synth::baseline::tp}) {
        try {
          const auto b0 = std::chrono::steady_clock::now();
          hspmd::synth::synth_options bo = so;
          bo.search.max_seconds = std::min(so.search.max_seconds, baseline_seconds);
          std::string again;
          try {
            baselines.push_back(hspmd::synth::make_baseline(g, c, b, bo, model));
          } catch (const hspmd::plan_error&) {
            if (bo.search.max_seconds >= so.search.max_seconds)
              throw;
            // Nothing found within the short budget: a refusal must come from the full search.
            baselines.push_back(hspmd::synth::make_baseline(g, c, b, so, model));
            again = " (nothing within --baseline-seconds: searched with --max-seconds)";
          }
          const auto& p = baselines.back();
          const double took =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - b0).count();
          std::printf("%-8s %14s %14s %14s %10s  planned in %.2f s%s%s%s\n",
                      std::string(hspmd::synth::name(b)).c_str(), seconds(p.step_time).c_str(),
                      seconds(p.compute_time).c_str(), seconds(p.comm_time).c_str(),
                      one_level_error.empty() ? times(p.step_time / plan.step_time).c_str() : "-",
                      took,
                      p.stats.optimal
                          ? ""
                          : (" (search budget reached after " + std::to_string(p.stats.expanded) +
                             " states: the best found, not proven its space's best)")
                                .c_str(),
                      again.c_str(), p.recompute ? " (recomputed)" : "");
        } catch (const hspmd::plan_error& e) {
          std::printf("%-8s %s\n", std::string(hspmd::synth::name(b)).c_str(), e.what());
        }
      }
    if (one_level_error.empty())
      std::printf("(speedup: the baseline's predicted step time over synth's)\n");
    else
      std::printf("(no one-level synthesized plan to compare with%s)\n",
                  no_baselines ? "" : ": the baselines' own predictions");
    if (simulate && one_level_error.empty())
      print_simulation(g, c, so, plan, baselines, trace_file, gantt_file, gantt_devices);
    if (changed) {
      if (one_level_error.empty())
        print_what_if(hspmd::sim::what_if(g, c, *changed, so, model, plan), c);
      else if (pr.groups.empty())
        throw hspmd::config_error(
            "--what-if", "compares one-level plans and this cluster has none",
            "ask it of a model with a one-level plan here, or add --pipeline");
    }
    // Where one level has a plan and two levels do not, the one-level plan stands (said, not
    // fatal); with neither, the two-level error ends the run -- unless a pipeline is asked for.
    std::optional<hspmd::synth::hierarchical_plan> two_level;
    if (hierarchical) {
      hspmd::synth::hierarchical_options ho;
      ho.inner = so;
      try {
        two_level = hspmd::synth::synthesize_hierarchical(
            [&](std::size_t rows) { return hspmd::models::trace_model<float>(model, mo, rows); },
            batch, c, ho, model);
      } catch (const hspmd::plan_error& e) {
        if (!one_level_error.empty() && pr.groups.empty())
          throw;
        std::printf("\ntwo-level plan: none (%s): %s\n",
                    one_level_error.empty() ? "the one-level plan stands" : "a pipeline is tried",
                    e.what());
      }
    }
    if (two_level) {
      const auto& h = *two_level;
      const auto [lo, hi] = std::ranges::minmax(h.node_batch);
      double peak = 0.0;
      for (std::size_t d = 0; d < c.size(); ++d)
        peak = std::max(peak, h.memory[d] / static_cast<double>(c.devices[d].memory));
      std::printf("\ntwo-level plan (%s): %zu nodes x %zu devices, %zu to %zu rows per node, "
                  "%zu node program variant(s), peak memory %.0f%% of a device's; synthesized in "
                  "%.3f s\n",
                  h.strategy.c_str(), h.nodes.size(), h.nodes.front().size(), lo, hi,
                  h.variants.size(), 100.0 * peak, h.seconds);
      std::printf("%-8s %14s %14s %14s %10s\n", "plan", "step time", "slowest node", "across",
                  "vs synth");
      std::printf("%-8s %14s %14s %14s %10s\n", "two-lvl", seconds(h.step_time).c_str(),
                  seconds(h.inner_time).c_str(), seconds(h.cross_time).c_str(),
                  one_level_error.empty() ? times(plan.step_time / h.step_time).c_str() : "-");
      if (one_level_error.empty())
        std::printf(
            "(vs synth: the one-level plan's predicted step time over the two-level one's)\n");
      else
        std::printf("(vs synth: none, no one-level plan fits this cluster: the two-level plan is "
                    "the plan)\n");
    }
    if (!pr.groups.empty()) {
      pr.simulate = simulate;
      hspmd_plan::plan_pipeline(pr, model, mo, batch, c, so,
                                one_level_error.empty() ? &plan : nullptr, json_out, explain,
                                changed ? &*changed : nullptr);
      return 0;
    }
    if (!one_level_error.empty()) {
      if (!pr.svg_out.empty())
        std::printf("--svg: no one-level plan to draw (%s)\n", pr.svg_out.c_str());
      return 0;
    }
    const hspmd::synth::cost_model m(g, c, hspmd::synth::segment_map(g, so.segments), std::nullopt,
                                     so.gemm_type);
    if (explain)
      std::cout << "\n" << hspmd::synth::explain(plan, m);
    if (!json_out.empty()) {
      std::ofstream f(json_out);
      f << hspmd::synth::to_json(plan).dump(1) << "\n";
      if (!f)
        throw hspmd::config_error(json_out, "cannot write", "a writable path");
      std::printf("plan written to %s (hash %016llx)\n", json_out.c_str(),
                  static_cast<unsigned long long>(plan.hash()));
    }
    if (!pr.svg_out.empty()) {
      std::ofstream f(pr.svg_out);
      f << hspmd::synth::plan_svg(plan, c);
      if (!f)
        throw hspmd::config_error("--svg " + pr.svg_out, "cannot be written",
                                  "give a path in a writable directory");
      std::printf("plan drawn in %s\n", pr.svg_out.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hspmd-plan: %s\n", e.what());
    return 1;
  }
}

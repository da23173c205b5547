// hspmd-pipeline-bench: pipeline schedules measured on an emulated cluster, next to what the
// schedule simulator (program/pipeline.hpp) predicts from the passes' measured times.
//
//   mpirun -np 2 build/release/bench/hspmd-pipeline-bench --slowdown 1,2 --micro 4,8
//       --schedules gpipe,1f1b,zb --steps 6 --trace pipeline.trace.json   (one line)
//
// One rank per pipeline device (groups of one); rank r's compute is stretched by its slowdown
// (exec/emulation.hpp), and the cluster the plan is made for says so: the stages are balanced
// on the devices' speeds (a slower device gets fewer layers). For each schedule and m, after
// `--warmup` steps, every step's wall time (the slowest rank's) and each rank's busy time
// (its compute, emulation included) are measured; the measured bubble is the share of device
// time not computing. The passes' mean times per stage (forward, backward -- split: input and
// weight parts, whose measured share the simulator is given; from the trace)
// feed the simulator, whose step and bubble are the schedule's theory for those costs.
// Prints one row per (schedule, m); --json writes them.

#include <hspmd/comm/mpi/communicator.hpp>
#include <hspmd/comm/mpi/environment.hpp>
#include <hspmd/exec/pipeline.hpp>
#include <hspmd/hspmd.hpp>
#include <hspmd/io/cli.hpp>
#include <hspmd/models/zoo.hpp>
#include <hspmd/program/pipeline_plan.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace hspmd;

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string x; std::getline(in, x, ',');)
    if (!x.empty())
      out.push_back(x);
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct row {
  std::string schedule;
  std::size_t micro = 0;
  double step = 0.0;     // measured, median over steps (slowest rank)
  double bubble = 0.0;   // measured: 1 - busy / step, over every device
  double sim_step = 0.0; // simulated from the measured pass times
  double sim_bubble = 0.0;
  std::vector<std::size_t> first_blocks;
};

} // namespace

int main(int argc, char** argv) {
  mpi_environment env(argc, argv);
  mpi_communicator world;
  CLI::App app{"pipeline schedules measured against the simulator"};
  std::string model = "bert", schedules = "gpipe,1f1b,zb", micros = "4,8", slowdowns, json_out,
              trace_out;
  std::size_t layers = 8, hidden = 256, seq = 64, rows = 2, steps = 6, warmup = 2;
  app.add_option("--model", model, "bert or llama");
  app.add_option("--layers", layers);
  app.add_option("--hidden", hidden);
  app.add_option("--seq", seq);
  app.add_option("--rows", rows, "sequences per micro-batch");
  app.add_option("--micro", micros, "micro-batch counts, comma-separated");
  app.add_option("--schedules", schedules, "gpipe, 1f1b, zb, interleaved (comma-separated)");
  app.add_option("--slowdown", slowdowns, "per rank, comma-separated (default: all 1)");
  app.add_option("--steps", steps, "measured steps per row");
  app.add_option("--warmup", warmup, "steps before measuring");
  app.add_option("--json", json_out, "write the rows here (rank 0)");
  app.add_option("--trace", trace_out, "write the last row's trace here (rank 0)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return world.rank() == 0 ? app.exit(e) : 1;
  }
  const auto n = static_cast<std::size_t>(world.size());
  std::vector<double> slow(n, 1.0);
  const auto given = split_list(slowdowns);
  for (std::size_t r = 0; r < given.size() && r < n; ++r)
    slow[r] = std::stod(given[r]);
  std::string devices;
  for (std::size_t r = 0; r < n; ++r)
    devices += std::string(r == 0 ? "" : ",") + R"({"name": "r)" + std::to_string(r) +
               R"(", "kind": "host", "speed": )" + std::to_string(1e10 / slow[r]) +
               R"(, "memory": 1e12, "slowdown": )" + std::to_string(slow[r]) + "}";
  const cluster c = parse_cluster(
      R"({"version": 1, "name": "emulated", "links": {"intra_node": {"bandwidth": 1e10, "latency": 1e-6}}, "devices": [)" +
          devices + "]}",
      "emulated cluster");
  models::model_options o;
  o.layers = layers;
  o.hidden = hidden;
  o.seq = seq;
  o.vocab = 1024;
  const graph::graph g = models::trace_model<float>(model, o, rows);
  std::vector<row> rows_out;
  nlohmann::json last_trace;
  for (const std::string& sched : split_list(schedules))
    for (const std::string& mtext : split_list(micros)) {
      program::pipeline_options po;
      po.group_sizes.assign(n, 1);
      po.schedule = program::parse_schedule(sched);
      po.micro = std::stoul(mtext);
      po.chunks = po.schedule == program::schedule_kind::interleaved ? 2 : 1;
      po.strategy = "dp-ev";
      po.model = model;
      const program::pipeline_plan plan = program::make_pipeline_plan(g, c, po);
      exec::pipeline_executor<float, mpi_communicator> px(g, plan, world, 7);
      px.set_slowdown(slow[static_cast<std::size_t>(world.rank())]);
      std::vector<exec::sgd> opts(px.chunks(), exec::sgd(0.01, 0.9));
      const graph::graph whole = models::trace_model<float>(model, o, rows * po.micro);
      std::vector<double> step_times, bubbles;
      for (std::size_t s = 0; s < warmup + steps; ++s) {
        if (s == warmup)
          px.start_trace();
        for (graph::node_id i : whole.inputs()) {
          const graph::node& in = whole[i];
          if (in.type == dtype::i64) {
            std::vector<std::int64_t> v(in.out.size());
            for (std::size_t k = 0; k < v.size(); ++k)
              v[k] = static_cast<std::int64_t>((k * 7 + s) % 1024);
            px.set_input(in.name, std::span<const std::int64_t>(v));
          } else {
            std::vector<float> v(in.out.size(), 0.5f);
            px.set_input(in.name, std::span<const float>(v));
          }
        }
        px.set_step(s);
        world.barrier();
        (void)px.forward_backward();
        px.update(std::span<exec::sgd>(opts));
        if (s < warmup)
          continue;
        std::array<double, 2> t{px.step_seconds(), px.busy_seconds()};
        std::vector<double> all(2 * n);
        world.all_gather_v(std::span<const double>(t), std::span<double>(all),
                           std::vector<std::size_t>(n, 2), uneven_algorithm::native);
        double wall = 0.0, busy = 0.0;
        for (std::size_t r = 0; r < n; ++r) {
          wall = std::max(wall, all[2 * r]);
          busy += all[2 * r + 1];
        }
        step_times.push_back(wall);
        bubbles.push_back(1.0 - busy / (wall * static_cast<double>(n)));
      }
      const nlohmann::json trace = px.collect_trace();
      row r;
      r.schedule = sched;
      r.micro = po.micro;
      r.step = median(step_times);
      r.bubble = median(bubbles);
      r.first_blocks = plan.first_blocks;
      if (world.rank() == 0) {
        // the passes' mean times per stage, from the trace
        const std::size_t stages = plan.stages.size();
        std::vector<double> fsum(stages, 0.0), bsum(stages, 0.0), fcount(stages, 0.0),
            bcount(stages, 0.0), wsum(stages, 0.0), wcount(stages, 0.0);
        for (const auto& e : trace["traceEvents"]) {
          if (e["ph"] != "X" || !e.contains("args") || !e["args"].contains("pass"))
            continue;
          const auto k = e["args"]["stage"].get<std::size_t>();
          const double seconds = e["dur"].get<double>() * 1e-6;
          if (e["args"]["pass"] == "forward") {
            fsum[k] += seconds;
            fcount[k] += 1;
          } else if (e["args"]["pass"] == "backward_weight") { // (zb: the split's second part)
            wsum[k] += seconds;
            wcount[k] += 1;
          } else {
            bsum[k] += seconds;
            bcount[k] += 1;
          }
        }
        program::stage_costs costs;
        double weights = 0.0, backwards = 0.0;
        for (std::size_t k = 0; k < stages; ++k) {
          const double w = wsum[k] / std::max(1.0, wcount[k]);
          costs.stage_forward.push_back(fsum[k] / std::max(1.0, fcount[k]));
          costs.stage_backward.push_back(bsum[k] / std::max(1.0, bcount[k]) + w);
          weights += w;
          backwards += costs.stage_backward.back();
        }
        if (weights > 0.0) // a split backward: its measured weight share
          costs.weight_share = weights / backwards;
        const program::pipeline_timeline t = program::simulate(plan.make(), costs);
        r.sim_step = t.step;
        r.sim_bubble = t.bubble;
        last_trace = trace;
      }
      rows_out.push_back(r);
    }
  if (world.rank() == 0) {
    std::printf("%-12s %4s %-10s %10s %10s %10s %10s %8s\n", "schedule", "m", "cuts", "step (ms)",
                "sim (ms)", "sim/meas", "bubble", "sim bub.");
    nlohmann::json j = nlohmann::json::array();
    for (const row& r : rows_out) {
      std::string cuts;
      for (std::size_t b : r.first_blocks)
        cuts += (cuts.empty() ? "" : ",") + std::to_string(b);
      std::printf("%-12s %4zu %-10s %10.1f %10.1f %10.3f %9.1f%% %7.1f%%\n", r.schedule.c_str(),
                  r.micro, cuts.c_str(), 1e3 * r.step, 1e3 * r.sim_step, r.sim_step / r.step,
                  100.0 * r.bubble, 100.0 * r.sim_bubble);
      j.push_back({{"schedule", r.schedule},
                   {"micro", r.micro},
                   {"first_blocks", r.first_blocks},
                   {"step_s", r.step},
                   {"simulated_step_s", r.sim_step},
                   {"bubble", r.bubble},
                   {"simulated_bubble", r.sim_bubble}});
    }
    if (!json_out.empty())
      std::ofstream(json_out) << j.dump(1) << "\n";
    if (!trace_out.empty())
      std::ofstream(trace_out) << last_trace.dump() << "\n";
  }
  return 0;
}
